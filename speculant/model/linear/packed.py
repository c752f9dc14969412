"""The interface of a linear layer whose weight was re-laid out once for a fast CPU kernel.

Two kinds exist: ``OneDNNLinear`` (``linear_backend.py``: oneDNN's blocked
layout, float32 and bfloat16) and ``DotLinear`` (``dot_linear.py``: Speculant's
own kernel on AVX512-BF16 dot products, bfloat16). Merging sibling projections
(``merged_linears.py``) and the fast decoder (``fast_forward/weights.py``) work
on this interface, whatever the kind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import nn

Linear = Callable[[torch.Tensor], torch.Tensor]  # [T, in] -> [T, out]


class PackedLinear(nn.Module, ABC):
    """Inference-only drop-in for ``nn.Linear``: ``[..., in_features] -> [..., out_features]``."""

    in_features: int
    out_features: int
    bias: nn.Parameter | None

    @property
    @abstractmethod
    def weight(self) -> torch.Tensor:
        """The dense ``[out, in]`` weight (may be a copy: for inspection, never hot paths)."""

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype:
        """The weight's dtype."""

    @abstractmethod
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[..., in_features]`` -> ``[..., out_features]``."""

    def probe_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The packed path itself, for the exactness probe (a kind with a second
        path for some row counts overrides this to bypass it)."""
        return self.forward(x)

    @abstractmethod
    def repacked(self, weight: torch.Tensor, bias: torch.Tensor | None) -> PackedLinear:
        """A new layer of the same kind and settings over another ``[out, in]`` weight."""

    def add_into(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual.add_(self(x))``, bit for bit (a kind may fuse the add into its kernel).
        ``x``: ``[T, in_features]``; ``residual``: ``[T, out_features]``, updated and returned."""
        return residual.add_(self.forward(x))

    def fast_call(self) -> Linear:
        """The cheapest exact callable for ``[T, in]`` inputs (no ``nn.Module.__call__``)."""
        return self.forward
