"""The acceptance-method interface.

Vocabulary, per decode with k proposals:
- accepted tokens: the longest prefix of the proposals the method keeps;
- recovered token: sampled in place of the first rejected proposal;
- bonus token: sampled from the target after all k proposals were accepted.
Every decode therefore emits ``num_accepted + 1`` tokens.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from pydantic import BaseModel

from speculant.core.capabilities import AcceptanceCapabilities
from speculant.proposers.base import NoOptions


@dataclass(frozen=True)
class AcceptedTokens:
    token_ids: torch.Tensor  # [n, k_max + 1] long; PLACEHOLDER_TOKEN_ID past num_emitted
    num_accepted: torch.Tensor  # [n] long, 0..lens[i]

    @property
    def num_emitted(self) -> torch.Tensor:  # [n]
        return self.num_accepted + 1


class AcceptanceMethod(ABC):
    name: ClassVar[str]
    capabilities: ClassVar[AcceptanceCapabilities] = AcceptanceCapabilities()
    Options: ClassVar[type[BaseModel]] = NoOptions

    def __init__(self, options: BaseModel | None = None) -> None:
        self.options = options

    @abstractmethod
    def accept(
        self,
        target_logprobs: torch.Tensor,  # [n, k_max + 1, V] filtered target log-probs
        draft_token_ids: torch.Tensor,  # [n, k_max] long
        draft_probs: torch.Tensor | None,  # [n, k_max, V] or None (treated as one-hot)
        lens: torch.Tensor,  # [n] long, proposals per row
        greedy: torch.Tensor,  # [n] bool, temperature == 0 rows
        generators: list[torch.Generator],  # one per row, seeded per request and step
    ) -> AcceptedTokens:
        """Decide, row by row, how many proposals to keep and which token to
        emit after them. Greedy rows keep proposals equal to the target argmax
        and emit the argmax after them."""
