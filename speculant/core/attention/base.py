"""Attention-backend interface and the spans a forward is built from."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from pydantic import BaseModel

from speculant.core.capabilities import AttentionBackendCapabilities
from speculant.proposers.base import NoOptions

if TYPE_CHECKING:
    from speculant.core.attention.span_tensors import SpanTensors


@dataclass(slots=True)
class QuerySpan:
    """A run of query tokens of one sequence.

    The tokens sit at positions ``start .. start + len(token_ids) - 1``; they
    attend to the sequence's cached prefix (positions < start, found through
    ``block_table``) and causally to each other. Several spans may share a
    block table (batch expansion): all K/V of a forward are written before any
    span attends, so a span sees the K/V its siblings write at lower positions.
    """

    block_table: list[int]
    start: int
    token_ids: list[int]
    logits_at: list[int]  # offsets inside the span whose logits are needed

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def end(self) -> int:
        """Context length after this span (positions < end are visible)."""
        return self.start + len(self.token_ids)


class AttentionBackend(ABC):
    """Paged attention over a flattened, variable-length batch.

    ``build_metadata`` runs once per forward; ``forward`` runs once per layer
    for the whole mixed prefill/decode batch.
    """

    name: ClassVar[str]
    capabilities: ClassVar[AttentionBackendCapabilities] = AttentionBackendCapabilities()
    Options: ClassVar[type[BaseModel]] = NoOptions

    @abstractmethod
    def build_metadata(self, spans: "SpanTensors") -> Any:
        """Precompute whatever ``forward`` needs for this batch (once per forward)."""

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # [T, H, D]
        key: torch.Tensor,  # [T, H_kv, D] (rotary applied)
        value: torch.Tensor,  # [T, H_kv, D]
        key_cache: torch.Tensor,  # [num_blocks, block_size, H_kv, D]
        value_cache: torch.Tensor,  # [num_blocks, block_size, H_kv, D]
        metadata: Any,
        scaling: float,
    ) -> torch.Tensor:  # [T, H, D]
        """Write this batch's K/V into the caches, then attend."""
