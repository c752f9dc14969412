"""Every instruction path of the C kernels this CPU runs, against the scalar path.

The dispatch (csrc/kernels.h) is forced onto each path in turn (``set_kernel_isa``,
what ``SPECULANT_CPU_ISA`` caps). Promised bit for bit, and checked so, on random
shapes off every blocking boundary (outputs not a multiple of 8, 16 or 32, an odd
number of blocks, row counts past each path's row group, a strided input, with and
without bias and the fused residual add):

* the bfloat16 linear layer: scalar, AVX2, AVX-512 and AVX512-BF16 run the same
  float32 sums in the same order (products of two bfloat16 numbers are exact, so
  a fused multiply-add changes nothing); AVX512-BF16 only differs on denormals,
  which these inputs do not have;
* RMSNorm rows, rotary, silu * up: the same C per path (element-wise, or with the
  lanes of the sum as independent accumulators).

A path this CPU does not run skips (its own lack: fair under SPECULANT_REQUIRE_KERNELS=1).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import pytest
import torch
from kernel_marks import needs_kernel

from speculant.model.kernels.abi import KERNEL_ISAS, kernel_isa, runnable_isas, set_kernel_isa
from speculant.model.kernels.build import load_kernel
from speculant.model.linear.dot_linear import blocked_weight

X86_SIMD = ["avx2", "avx512", "avx512_vnni", "avx512_bf16"]
pytestmark = needs_kernel


@pytest.fixture
def lib() -> Iterator[ctypes.CDLL]:
    lib = load_kernel()
    assert lib is not None  # needs_kernel
    try:
        yield lib
    finally:
        set_kernel_isa(lib, None)


def on_path(lib: ctypes.CDLL, isa: str, run):
    """``run()`` with the dispatch forced onto ``isa``."""
    set_kernel_isa(lib, isa)
    try:
        return run()
    finally:
        set_kernel_isa(lib, None)


def require_path(lib: ctypes.CDLL, isa: str) -> None:
    if isa not in runnable_isas(lib):
        pytest.skip(f"this CPU does not run the {isa} path (it runs {', '.join(runnable_isas(lib))})")


def linear(lib, x, blocked, n, bias, residual, threads):
    # x: [T, K] bfloat16 (row stride x.stride(0)); blocked: [ceil(n/16), K/2, 16, 2]; bias: [n] float32 or None;
    # residual: [T, n] bfloat16 or None -> y [T, n]
    y = torch.empty(x.shape[0], n, dtype=torch.bfloat16) if residual is None else residual.clone()
    res = None if residual is None else y.data_ptr()
    rc = lib.speculant_linear_bf16(x.data_ptr(), x.shape[0], x.stride(0), blocked.data_ptr(), n, x.shape[1],
                                   None if bias is None else bias.data_ptr(), res, n, y.data_ptr(), n, threads)
    assert rc == 0
    return y


@pytest.mark.parametrize("isa", X86_SIMD)
@pytest.mark.parametrize("n,k,rows", [(1, 2, 1), (7, 62, 3), (16, 64, 4), (17, 258, 5), (33, 96, 9), (100, 130, 13),
                                      (130, 32, 25)])
@pytest.mark.parametrize("bias,residual", [(False, False), (True, False), (True, True)])
def test_linear_path_equals_scalar_bit_for_bit(lib, isa, n, k, rows, bias, residual):
    require_path(lib, isa)
    gen = torch.Generator().manual_seed(n * 1000 + k + rows)
    w = (torch.randn(n, k, generator=gen) * 0.1).to(torch.bfloat16)  # [n, k]
    wide = torch.randn(rows, k + 6, generator=gen).to(torch.bfloat16)  # [T, k + 6]
    x = wide[:, 3:3 + k]  # [T, k], row stride k + 6
    b = torch.randn(n, generator=gen) if bias else None  # [n] float32
    r = torch.randn(rows, n, generator=gen).to(torch.bfloat16) if residual else None  # [T, n]
    blocked = blocked_weight(w)
    want = on_path(lib, "scalar", lambda: linear(lib, x, blocked, n, b, r, 1))
    for threads in (1, 2):
        got = on_path(lib, isa, lambda threads=threads: linear(lib, x, blocked, n, b, r, threads))
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"{isa}, {threads} threads"
    # the scalar path's sums are the float64 ones up to float32 round-off and one bfloat16 rounding
    ref = x.double() @ w.double().T + (0 if b is None else b.double())
    if r is None:
        bound = ref.abs() * 2.0**-8 + (x.double().abs() @ w.double().abs().T) * k * 2.0**-23 + 1e-30
        assert bool(((want.double() - ref).abs() <= bound).all())


def test_a_path_the_cpu_lacks_is_refused_and_the_path_kept(lib):
    lacking = [isa for isa in KERNEL_ISAS if isa not in runnable_isas(lib)]
    before = kernel_isa(lib)
    with pytest.raises(RuntimeError, match=rf"kernel path '{lacking[0]}': this CPU does not run it \(it runs scalar"):
        set_kernel_isa(lib, lacking[0])  # neon on x86, avx2 on aarch64: always one
    assert kernel_isa(lib) == before


def _rows_case(seed: int, T: int, H: int):
    gen = torch.Generator().manual_seed(seed)
    return gen, (torch.randn(T, H, generator=gen) * 3).to(torch.bfloat16)


@pytest.mark.parametrize("isa", X86_SIMD)
@pytest.mark.parametrize("T,H,lanes", [(1, 64, 8), (3, 100, 8), (5, 960, 16), (2, 576, 4)])
def test_rms_norm_path_equals_scalar(lib, isa, T, H, lanes):
    require_path(lib, isa)
    gen, x = _rows_case(H + T, T, H)
    weight = torch.randn(H, generator=gen).to(torch.bfloat16)

    def run():
        out = torch.empty_like(x)
        assert lib.speculant_rms_norm_bf16(x.data_ptr(), T, H, weight.data_ptr(), H, 1e-5, lanes, out.data_ptr(),
                                           H, 1) == 0
        return out
    assert torch.equal(on_path(lib, isa, run).view(torch.int16), on_path(lib, "scalar", run).view(torch.int16))


@pytest.mark.parametrize("isa", X86_SIMD)
@pytest.mark.parametrize("T,heads,D", [(1, 3, 64), (4, 5, 32), (2, 2, 128)])
def test_rotary_path_equals_scalar(lib, isa, T, heads, D):
    require_path(lib, isa)
    gen, x = _rows_case(T * heads + D, T, heads * D + 10)
    cos = torch.randn(T, D, generator=gen).to(torch.bfloat16)
    sin = torch.randn(T, D, generator=gen).to(torch.bfloat16)

    def run():
        out = torch.empty(T, heads, D, dtype=torch.bfloat16)
        lib.speculant_rotary_bf16(x.data_ptr(), T, x.stride(0), heads, D, cos.data_ptr(), sin.data_ptr(),
                                  out.data_ptr())
        return out
    assert torch.equal(on_path(lib, isa, run).view(torch.int16), on_path(lib, "scalar", run).view(torch.int16))


@pytest.mark.parametrize("isa", X86_SIMD)
@pytest.mark.parametrize("T,I", [(1, 64), (3, 200), (2, 2560)])
def test_silu_mul_path_equals_scalar(lib, isa, T, I):  # noqa: E741 (I: the MLP width, as in the C)
    require_path(lib, isa)
    gen, gate_up = _rows_case(T + I, T, 2 * I)
    table = torch.nn.functional.silu(torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16))

    def run():
        out = torch.empty(T, I, dtype=torch.bfloat16)
        lib.speculant_silu_mul_bf16(gate_up.data_ptr(), T, 2 * I, I, table.data_ptr(), out.data_ptr())
        return out
    assert torch.equal(on_path(lib, isa, run).view(torch.int16), on_path(lib, "scalar", run).view(torch.int16))
