"""Sibling projections that read the same input run as one packed GEMM.

An attention block calls ``q_proj``, ``k_proj`` and ``v_proj`` on the same
hidden states, an MLP calls ``gate_proj`` and ``up_proj`` on the same input.
With packed linears each call pays a fixed cost that dominates at
decode sizes (on the demo target one merged Q/K/V call took 38 us against
71 us for three; gate/up 60 against 76). ``merge_sibling_linears`` replaces
each such group of packed layers with views into one shared GEMM over the
concatenated weight: the first sibling called with an input computes all
outputs, the others take their slice. The slices are computed per input
object, so any call order, a repeated call or a sibling never called stays
correct (at worst recomputed). A group is merged only when all members are
packed, read the same number of features, agree on bias, and the merged
layer passes the same exactness probe as packing itself.
"""

from __future__ import annotations

import torch
from torch import nn

from speculant.model.linear.backend import PROBE_TOLERANCE, probe_error
from speculant.model.linear.packed import PackedLinear

SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class SharedGemm:
    """One packed GEMM whose output is handed out in slices, once per input."""

    def __init__(self, merged: PackedLinear, sizes: list[int]) -> None:
        self.merged, self.sizes = merged, sizes
        self._input: torch.Tensor | None = None
        self._parts: list[torch.Tensor | None] = [None] * len(sizes)

    def part(self, index: int, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., sizes[index]]
        out = self._parts[index]
        if self._input is not x or out is None:
            fresh = self.merged(x).split(self.sizes, dim=-1)
            self._parts, self._input = list(fresh), x
            out = fresh[index]
        self._parts[index] = None
        if all(p is None for p in self._parts):
            self._input = None  # all handed out: hold no activations between forwards
        return out


class MergedSlice(nn.Module):
    """Stands in for one sibling projection: its slice of the shared GEMM."""

    def __init__(self, shared: SharedGemm, index: int, original: PackedLinear) -> None:
        super().__init__()
        self._shared, self.index = shared, index
        self.in_features, self.out_features = original.in_features, original.out_features
        self._offset = sum(shared.sizes[:index])

    @property
    def weight(self) -> torch.Tensor:
        """This projection's ``[out, in]`` weight (a copy: for inspection, not hot paths)."""
        return self._shared.merged.weight[self._offset:self._offset + self.out_features].clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]
        return self._shared.part(self.index, x)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, slice {self.index} of a shared GEMM"


def _merge(layers: list[PackedLinear]) -> SharedGemm | None:
    if len({(type(m), m.in_features, m.dtype, m.bias is None) for m in layers}) != 1:
        return None
    with torch.no_grad():
        weight = torch.cat([m.weight for m in layers])  # [sum(out), in]
        bias = None if layers[0].bias is None else torch.cat([m.bias for m in layers if m.bias is not None])
        merged = layers[0].repacked(weight, bias)
        reference = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype)
        reference.weight.copy_(weight)
        if bias is not None:
            reference.bias.copy_(bias)
    if probe_error(reference, merged) > PROBE_TOLERANCE.get(weight.dtype, 0.0):
        return None
    return SharedGemm(merged, [m.out_features for m in layers])


def merge_sibling_linears(model: nn.Module) -> int:
    """Merge every eligible sibling group of ``model`` in place; returns how many groups."""
    merged = 0
    for parent in list(model.modules()):
        for names in SIBLINGS:
            found = [getattr(parent, n, None) for n in names]
            layers = [m for m in found if isinstance(m, PackedLinear)]
            if len(layers) != len(names):
                continue
            shared = _merge(layers)
            if shared is None:
                continue
            for index, (name, layer) in enumerate(zip(names, layers)):
                setattr(parent, name, MergedSlice(shared, index, layer))
            merged += 1
    return merged
