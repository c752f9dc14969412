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
from speculant.proposers.base import PLACEHOLDER_TOKEN_ID, NoOptions


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


def accepted_prefix_len(
    accept: torch.Tensor,  # [n, k_max] bool, per-position verdicts
    lens: torch.Tensor,  # [n] long
) -> torch.Tensor:  # [n] long: leading accepted proposals, at most lens[i]
    in_lens = torch.arange(accept.shape[1], device=accept.device).unsqueeze(0) < lens.unsqueeze(1)
    return (accept & in_lens).long().cumprod(dim=1).sum(dim=1)


def assemble_accepted(
    draft_token_ids: torch.Tensor,  # [n, k_max] long
    num_accepted: torch.Tensor,  # [n] long
    final_token_ids: torch.Tensor,  # [n] long, recovered or bonus token
) -> AcceptedTokens:
    """Accepted proposals, then the final token, then PLACEHOLDER_TOKEN_ID."""
    n, k_max = draft_token_ids.shape
    cols = torch.arange(k_max + 1, device=draft_token_ids.device).unsqueeze(0)  # [1, k_max + 1]
    padded = torch.cat([draft_token_ids, draft_token_ids.new_full((n, 1), PLACEHOLDER_TOKEN_ID)], dim=1)
    token_ids = torch.where(cols < num_accepted.unsqueeze(1), padded, PLACEHOLDER_TOKEN_ID)
    token_ids[torch.arange(n, device=token_ids.device), num_accepted] = final_token_ids
    return AcceptedTokens(token_ids=token_ids, num_accepted=num_accepted)


def verifies_by_argmax(requests: list) -> bool:
    """True when every request is greedy and none asks for log-probabilities:
    verification then needs only the target's argmax (``greedy_accept``), and
    no target or draft distribution has to be built."""
    return all(r.params.greedy and r.params.logprobs is None for r in requests)


def greedy_accept(
    target_logits: torch.Tensor,  # [n, k_max + 1, V] raw target logits
    draft_token_ids: torch.Tensor,  # [n, k_max] long, PLACEHOLDER_TOKEN_ID past lens
    lens: torch.Tensor,  # [n] long, proposals per row
) -> AcceptedTokens:
    """Greedy verification, the rule every acceptance method applies to
    temperature-0 rows: keep proposals equal to the target argmax, then emit
    the argmax. The argmax of the raw logits is the token plain greedy decoding
    picks, so the engine uses this directly when every row is greedy."""
    argmax = target_logits.argmax(dim=-1)  # [n, k_max + 1]
    k_max = draft_token_ids.shape[1]
    num_accepted = accepted_prefix_len(draft_token_ids == argmax[:, :k_max], lens)
    final = argmax.gather(1, num_accepted.unsqueeze(1)).squeeze(1)  # [n]
    return assemble_accepted(draft_token_ids, num_accepted, final)
