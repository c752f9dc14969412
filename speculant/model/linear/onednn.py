"""A linear layer whose weight oneDNN re-laid out once (``torch.ops.mkldnn``).

``OneDNNLinear`` is the packed kind for float32 and bfloat16 on any CPU torch's
oneDNN supports; ``linear_backend.py`` decides which layers become one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from speculant.model.linear.packed import Linear, PackedLinear
from speculant.model.linear.rows import EXACT_ROWS, pad_rows

ONEDNN_DTYPES = (torch.float32, torch.bfloat16)


class OneDNNLinear(PackedLinear):
    """Inference-only drop-in for ``nn.Linear`` with a oneDNN pre-packed weight.

    Accepts inputs with any leading dims, ``[..., in_features]`` (the engine
    passes ``[1, T, in]`` or ``[T, in]``), and returns ``[..., out_features]``.
    Works under ``torch.no_grad()`` and ``torch.inference_mode()``; it has no
    backward. With ``dense_max_rows > 0``, inputs of at most that many rows
    (e.g. batch-1 decode without speculation) run ``F.linear`` on the dense
    weight, bit-identical to the unpacked layer, for CPUs where MKL beats
    oneDNN at few rows; that keeps the dense weight alive. float32 only: for
    bfloat16 the packed path was faster at every row count measured, so it
    always runs.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 dense_max_rows: int = 0) -> None:
        # weight: [out, in] (any strides); bias: [out] or None
        super().__init__()
        self.out_features, self.in_features = weight.shape
        # Opaque oneDNN tensor, logically [out, in]; plain attributes, not buffers,
        # so that state_dict() and .to() never see them.
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        keep_dense = dense_max_rows > 0 and weight.dtype == torch.float32
        self.dense_weight = weight.detach() if keep_dense else None  # [out, in]
        self.dense_max_numel = dense_max_rows * self.in_features if keep_dense else 0
        # Same storage, but never requiring grad: with a grad-requiring bias the op
        # takes another route whose results differ in the last bit.
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @property
    def weight(self) -> torch.Tensor:
        """The dense ``[out, in]`` weight; without ``dense_max_rows`` a copy is made
        on every access: for inspection and rare reads, never for hot paths."""
        if self.dense_weight is not None:
            return self.dense_weight
        return self.packed_weight.to_dense()

    @property
    def dtype(self) -> torch.dtype:
        return self.packed_weight.dtype

    def probe_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.packed_forward(x)

    def repacked(self, weight: torch.Tensor, bias: torch.Tensor | None) -> OneDNNLinear:
        return OneDNNLinear(weight, bias, self.dense_max_numel // self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features] -> [..., out_features]
        if self.dense_weight is not None and x.numel() <= self.dense_max_numel:
            return F.linear(x, self.dense_weight, self.bias)
        return self.packed_forward(x)

    def packed_forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features] -> [..., out_features], always on the packed weight, on a
        # bucketed row count (linear_rows.py: a bounded set of oneDNN shapes keeps memory flat)
        padded, rows = pad_rows(x, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(padded, self.packed_weight, self.bias, "none", [], "")
        if padded is x:
            return out
        return out[:rows].reshape(*x.shape[:-1], self.out_features)

    def fast_call(self) -> Linear:
        """oneDNN called directly for the row counts the bucketing leaves unpadded
        (decode and verify sizes): the same operator as ``forward``, less Python."""
        if self.dense_weight is not None:
            return self.forward
        op, weight, bias = torch.ops.mkldnn._linear_pointwise, self.packed_weight, self.bias
        padded = self.packed_forward

        def call(x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out]
            return op(x, weight, bias, "none", [], "") if x.shape[0] <= EXACT_ROWS else padded(x)
        return call

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, dtype={self.packed_weight.dtype}, "
                f"dense_max_rows={self.dense_max_numel // self.in_features}")


def onednn_unavailable_reason(weight: torch.Tensor) -> str | None:
    """Why oneDNN packing cannot run this weight, or ``None`` when it can."""
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    if not torch.backends.mkldnn.enabled:
        return "oneDNN is disabled in this process (torch.backends.mkldnn.enabled is False)"
    if weight.device.type != "cpu":
        return f"weights are on {weight.device.type}, and oneDNN packing is CPU-only"
    if weight.dtype not in ONEDNN_DTYPES:
        return (f"weights are {str(weight.dtype).removeprefix('torch.')}, and oneDNN "
                "packing supports float32 and bfloat16")
    if weight.dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return ("oneDNN has no bfloat16 path on this CPU (it needs avx512bw/vl/dq or avx_ne_convert, "
                "or ONEDNN_MAX_CPU_ISA / SPECULANT_CPU_ISA caps it below them)")
    return None
