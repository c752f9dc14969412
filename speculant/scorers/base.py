"""The scorer interface: run the target over a step's batch and return its
logits at exactly the positions that need them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from pydantic import BaseModel

from speculant.core.capabilities import ScorerCapabilities
from speculant.proposers.base import NoOptions, Proposals

if TYPE_CHECKING:
    from speculant.core.batch import StepBatch
    from speculant.core.model_runner import ModelRunner


@dataclass(frozen=True)
class Scores:
    """Target outputs for one step, flat and on the target's device.

    ``prefill_logits`` has one row per prefill entry that reports
    (``ScheduledRequest.reports``: terminal chunks, and the chunk that ends a
    preempted request's recompute one token short), in batch order.
    ``decode_logits`` holds each decode's ``1 + lens[i]`` rows back to back,
    decode i at ``cu_num_logits[i]:cu_num_logits[i + 1]`` (no padding): row
    ``cu_num_logits[i] + j`` is the target's logits after the decode's last
    token and its first j proposals.
    """

    prefill_logits: torch.Tensor  # [num_reporting_prefills, V]
    decode_logits: torch.Tensor  # [num_decodes + num_draft_tokens, V]
    cu_num_logits: torch.Tensor  # [num_decodes + 1] long, Proposals.cu_num_logits()
    prefill_hidden: torch.Tensor | None = None  # [num_reporting_prefills, H]
    decode_hidden: torch.Tensor | None = None  # [num_decodes + num_draft_tokens, H], rows as decode_logits


class Scorer(ABC):
    name: ClassVar[str]
    capabilities: ClassVar[ScorerCapabilities] = ScorerCapabilities()
    Options: ClassVar[type[BaseModel]] = NoOptions

    def __init__(self, options: BaseModel | None = None) -> None:
        self.options = options

    @abstractmethod
    def score(
        self,
        runner: "ModelRunner",
        batch: "StepBatch",
        proposals: Proposals,
        want_hidden: bool = False,
    ) -> Scores:
        """Run the target once over ``batch`` with ``proposals`` appended to
        its decodes and return the logits that sampling and acceptance need."""
