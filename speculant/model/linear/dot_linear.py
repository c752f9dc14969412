"""bfloat16 linear layers on the CPU's bfloat16 dot-product instructions.

``DotLinear`` runs ``y = x W^T (+ b)`` through ``csrc/linear_bf16.c``: the
weight is re-laid out once into blocks of 16 output rows by 2 input features
(``blocked_weight``), and one VDPBF16PS multiplies a block by a broadcast
input pair, so the weight streams from memory once per 12 input rows with no
horizontal sums. At decode and verify sizes a linear layer is that stream; on
the 2-core AMD EPYC here the kernel ran one-row GEMVs of SmolLM2's shapes
1.7x faster than oneDNN's packed bfloat16 path and matched it from 64 rows on
(``benchmarks/bench_linear.py``), so it serves every row count and no second
copy of the weight is kept.

Rounding: products exact in float32, one float32 sum per output in input
order, the bias added last, one rounding to bfloat16 (to nearest even); a
row's result does not depend on the other rows of the call. That is the
rounding rule of the oneDNN path it replaces (results agree but for the order
of the float32 sum). Where the CPU lacks AVX512-BF16 (the Intel hosts here) or
no C compiler builds the kernel, ``dot_linear_unavailable_reason`` says so and
``model.linear_backend = "auto"`` packs for oneDNN instead.
"""

from __future__ import annotations

import torch
from torch import nn

from speculant.model.kernels.abi import fast_bf16_unavailable_reason, kernel_isa
from speculant.model.kernels.build import kernel_status, load_kernel
from speculant.model.linear.packed import PackedLinear

BLOCK_ROWS = 16  # output rows per blocked vector (the kernel's BLOCK_ROWS)


def blocked_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] (K even) as ``[ceil(N / 16), K / 2, 16, 2]``, zero rows past N."""
    n, k = weight.shape
    rows = -(-n // BLOCK_ROWS) * BLOCK_ROWS
    padded = weight.new_zeros(rows, k)
    padded[:n] = weight
    return padded.view(rows // BLOCK_ROWS, BLOCK_ROWS, k // 2, 2).permute(0, 2, 1, 3).contiguous()


def dense_weight(blocked: torch.Tensor, out_features: int) -> torch.Tensor:
    """The inverse of ``blocked_weight``: ``[out_features, K]``."""
    nblk, k2, rows, two = blocked.shape
    return blocked.permute(0, 2, 1, 3).reshape(nblk * rows, k2 * two)[:out_features]


def dot_linear_unavailable_reason(weight: torch.Tensor) -> str | None:
    """Why ``DotLinear`` cannot run this ``[out, in]`` weight, or ``None`` when it can."""
    if weight.device.type != "cpu":
        return f"weights are on {weight.device.type}, and the bfloat16 dot-product kernel is CPU-only"
    if weight.dtype != torch.bfloat16:
        return f"weights are {str(weight.dtype).removeprefix('torch.')}, and the dot-product kernel is bfloat16-only"
    if weight.shape[1] % 2:
        return f"the layer reads {weight.shape[1]} features, and the kernel needs an even count"
    lib = load_kernel()
    if lib is None:
        return f"the C kernels are not available ({kernel_status()})"
    if (reason := fast_bf16_unavailable_reason(lib)) is not None:
        return reason
    return None


class DotLinear(PackedLinear):
    """Inference-only drop-in for a bfloat16 ``nn.Linear`` (see the module docstring)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        # weight: [out, in] bfloat16 (any strides); bias: [out] or None
        super().__init__()
        reason = dot_linear_unavailable_reason(weight)
        if reason is not None:
            raise ValueError(f"DotLinear cannot run this layer: {reason}")
        self.out_features, self.in_features = weight.shape
        self.blocked_weight = blocked_weight(weight.detach())  # [ceil(out / 16), in / 2, 16, 2]
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self._bias32 = None if bias is None else bias.detach().float().contiguous()  # [out], added in float32
        lib = load_kernel()
        assert lib is not None  # checked by dot_linear_unavailable_reason
        self._kernel = lib.speculant_linear_bf16

    @property
    def weight(self) -> torch.Tensor:
        return dense_weight(self.blocked_weight, self.out_features)

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features] bfloat16 -> [..., out_features]
        rows = self._rows(x)  # [T, in]
        out = torch.empty(rows.shape[0], self.out_features, dtype=torch.bfloat16)  # [T, out]
        self._run(rows, None, out)
        return out.view(*x.shape[:-1], self.out_features)

    def add_into(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        # x: [T, in]; residual: [T, out], updated in place and returned
        rows = self._rows(x)
        if (residual.dtype != torch.bfloat16 or residual.shape != (rows.shape[0], self.out_features)
                or residual.stride(-1) != 1):
            return super().add_into(x, residual)
        self._run(rows, residual, residual)
        return residual

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [T, in] with unit stride along features
        if x.dtype != torch.bfloat16:
            raise TypeError(f"DotLinear takes bfloat16 inputs, got {x.dtype} (cast the input or the model)")
        rows = x.reshape(-1, self.in_features)
        return rows if rows.stride(-1) == 1 else rows.contiguous()

    def _run(self, rows: torch.Tensor, residual: torch.Tensor | None, out: torch.Tensor) -> None:
        # rows: [T, in]; residual: [T, out] or None; out: [T, out] (may be residual)
        if not rows.shape[0]:
            return
        bias = None if self._bias32 is None else self._bias32.data_ptr()
        res, ldr = (None, 0) if residual is None else (residual.data_ptr(), residual.stride(0))
        rc = self._kernel(rows.data_ptr(), rows.shape[0], rows.stride(0), self.blocked_weight.data_ptr(),
                          self.out_features, self.in_features, bias, res, ldr, out.data_ptr(), out.stride(0),
                          torch.get_num_threads())
        if rc != 0:
            raise RuntimeError(f"the bfloat16 linear kernel failed (code {rc})")

    def repacked(self, weight: torch.Tensor, bias: torch.Tensor | None) -> DotLinear:
        return DotLinear(weight, bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, dtype=torch.bfloat16, kernel={self._isa()}")

    @staticmethod
    def _isa() -> str:
        lib = load_kernel()
        return "none" if lib is None else kernel_isa(lib)

