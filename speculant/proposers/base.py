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
    """Proposed tokens for the decodes of one step, flat: decode i (row i of
    ``batch.decodes``) proposes ``lens[i]`` tokens (0..its num_spec_tokens),
    ``token_ids[cu_num_draft_tokens[i]:cu_num_draft_tokens[i + 1]]``.

    Every tensor lives on the target's device (``context.target.device``); the
    engine moves a plugin's output there after checking it. Nothing is padded:
    ``probs`` has one row per proposed token. Proposers that fill a padded
    ``[n, k]`` table can hand it to ``from_padded``.
    """

    token_ids: torch.Tensor  # [num_draft_tokens] long
    cu_num_draft_tokens: torch.Tensor  # [num_decodes + 1] long: 0, then running sums of lens
    probs: torch.Tensor | None = None  # [num_draft_tokens, V] float32 draft probs, or None

    @property
    def num_decodes(self) -> int:
        return self.cu_num_draft_tokens.shape[0] - 1

    @property
    def num_draft_tokens(self) -> int:
        return self.token_ids.shape[0]

    @property
    def lens(self) -> torch.Tensor:  # [num_decodes] long
        return self.cu_num_draft_tokens.diff()

    @property
    def device(self) -> torch.device:
        return self.token_ids.device

    def cu_num_logits(self) -> torch.Tensor:  # [num_decodes + 1] long
        """Offsets of each decode's ``1 + lens[i]`` rows in ``Scores.decode_logits``."""
        n = self.num_decodes
        return self.cu_num_draft_tokens + torch.arange(n + 1, device=self.cu_num_draft_tokens.device)

    @classmethod
    def empty(cls, num_decodes: int, device: torch.device | str = "cpu") -> "Proposals":
        return cls(token_ids=torch.zeros(0, dtype=torch.long, device=device),
                   cu_num_draft_tokens=torch.zeros(num_decodes + 1, dtype=torch.long, device=device))

    @classmethod
    def from_lists(cls, rows: list[list[int]], device: torch.device | str = "cpu") -> "Proposals":
        flat = [t for r in rows for t in r]
        lens = torch.tensor([0] + [len(r) for r in rows], dtype=torch.long)
        return cls(token_ids=torch.tensor(flat, dtype=torch.long, device=device),
                   cu_num_draft_tokens=lens.cumsum(0).to(device))

    @classmethod
    def from_padded(cls, token_ids: torch.Tensor,  # [n, k]; entries past lens[i] are ignored
                    lens: torch.Tensor,  # [n]
                    probs: torch.Tensor | None = None,  # [n, k, V] or None
                    ) -> "Proposals":
        """The flat form of a padded table: one mask selects the real entries
        (row-major, so each row's proposals stay in order). Nothing is checked
        here; the engine checks every proposer's output (``proposal_checks``)."""
        keep = torch.arange(token_ids.shape[-1], device=token_ids.device) < lens.unsqueeze(-1)  # [n, k]
        cu = torch.cat([lens.new_zeros(1), lens.cumsum(0)])
        return cls(token_ids=token_ids[keep], cu_num_draft_tokens=cu,
                   probs=probs[keep] if probs is not None else None)

    def to_lists(self) -> list[list[int]]:
        """Each decode's proposals as a list (one device-to-host copy)."""
        flat, cu = self.token_ids.tolist(), self.cu_num_draft_tokens.tolist()
        return [flat[a:b] for a, b in zip(cu[:-1], cu[1:])]

    def row(self, i: int) -> list[int]:
        a, b = self.cu_num_draft_tokens[i:i + 2].tolist()
        return self.token_ids[a:b].tolist()


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
        ``scores.decode_hidden[scores.cu_num_logits[i] + num_accepted[i]]`` produced decode i's newest
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
