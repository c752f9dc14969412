"""The proposer interface: guess the next k tokens of each speculating decode."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from pydantic import BaseModel, ConfigDict

from speculant.core.capabilities import ProposerCapabilities

if TYPE_CHECKING:
    from speculant.core.batch import StepBatch
    from speculant.core.config import EngineConfig
    from speculant.core.model_runner import ModelRunner
    from speculant.scorers.base import Scores

PLACEHOLDER_TOKEN_ID = -1


class NoOptions(BaseModel):
    """Options model for plugins that take none: any key is an error."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Proposals:
    """Proposed tokens for the decodes of one step, row i for batch.decodes[i].

    Row i holds ``lens[i]`` real tokens (0..num_spec_tokens of that decode),
    then ``PLACEHOLDER_TOKEN_ID``.
    """

    token_ids: torch.Tensor  # [num_decodes, k_max] long
    lens: torch.Tensor  # [num_decodes] long
    probs: torch.Tensor | None = None  # [num_decodes, k_max, V] float32 draft probs, or None

    def __post_init__(self) -> None:
        assert self.token_ids.dim() == 2 and self.lens.dim() == 1
        assert self.token_ids.shape[0] == self.lens.shape[0]
        if self.probs is not None:
            assert self.probs.shape[:2] == self.token_ids.shape

    @classmethod
    def empty(cls, num_decodes: int, device: torch.device | str = "cpu") -> "Proposals":
        return cls(
            token_ids=torch.full((num_decodes, 0), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=device),
            lens=torch.zeros(num_decodes, dtype=torch.long, device=device),
        )

    @classmethod
    def from_lists(cls, rows: list[list[int]], device: torch.device | str = "cpu") -> "Proposals":
        k_max = max((len(r) for r in rows), default=0)
        ids = torch.full((len(rows), k_max), PLACEHOLDER_TOKEN_ID, dtype=torch.long)
        for i, r in enumerate(rows):
            if r:
                ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        lens = torch.tensor([len(r) for r in rows], dtype=torch.long)
        return cls(token_ids=ids.to(device), lens=lens.to(device))

    def row(self, i: int) -> list[int]:
        return self.token_ids[i, : int(self.lens[i])].tolist()


@dataclass(frozen=True)
class ProposerContext:
    """What a proposer may read about the engine it serves, at construction."""

    config: "EngineConfig"
    target: "ModelRunner"


class Proposer(ABC):
    """Guesses the continuation of decodes so the target can verify many tokens
    in one forward.

    Lifecycle per step: ``propose(batch)`` sees the whole batch (prefill chunks
    too, so a proposer with its own KV cache keeps it in sync chunk by chunk),
    then ``commit(batch, num_accepted)`` after acceptance so it can roll back to
    what was kept, and ``free(request_id)`` when a request finishes or is
    preempted. The engine checks ``propose``'s output and survives any
    exception from these methods: on a fault, or when the step fails after
    ``propose``, it calls ``free`` for the affected requests instead of
    ``commit`` (see ``core/proposer_guard.py``), so after ``free`` a proposer
    must be able to serve a request that is still running.
    """

    name: ClassVar[str]
    capabilities: ClassVar[ProposerCapabilities] = ProposerCapabilities()
    Options: ClassVar[type[BaseModel]] = NoOptions

    def __init__(self, options: BaseModel, context: ProposerContext) -> None:
        self.options = options
        self.context = context

    @abstractmethod
    def propose(self, batch: "StepBatch") -> Proposals:
        """Return up to ``d.num_spec_tokens`` tokens for each ``d`` in
        ``batch.decodes`` (row order = decode order)."""

    def commit(self, batch: "StepBatch", num_accepted: list[int], scores: "Scores") -> None:
        """Called after acceptance with the number of proposals kept per decode
        (row order = ``batch.decodes``) and the step's target ``Scores`` (with
        hidden states when the proposer declares ``needs_target_hidden_states``:
        ``scores.decode_hidden[i, num_accepted[i]]`` produced decode i's newest
        token, ``scores.prefill_hidden`` the newest token of each prefill that
        ``reports``). Only called when the step's computation succeeded.
        Stateless proposers keep nothing, so the base does nothing."""

    def free(self, request_id: str) -> None:
        """Drop any state held for ``request_id`` (finished, preempted, or reset
        after a fault). The request may still be running: the next ``propose``
        that sees it must rebuild what it needs from ``request.token_ids`` (or
        propose nothing for it until it can). Stateless proposers hold none."""

    @classmethod
    def validate_against(cls, options: BaseModel, config: "EngineConfig") -> list[str]:
        """Extra reasons this proposer cannot serve ``config`` (e.g. a draft
        model whose vocabulary differs from the target's). Checked at config
        time; the default has none."""
        return []
