"""The C kernel library's interface as Python sees it: the ctypes signatures of
its entry points, its dtype and instruction-path codes, the CPU features its
AVX-512 bfloat16 paths need, and the meaning of a refused span.

Building and loading the library is ``kernels.build``'s job; everything
here takes the loaded ``ctypes.CDLL``.
"""

from __future__ import annotations

import ctypes

import torch

from speculant.config.cpu_isa import ENV as ISA_ENV
from speculant.config.cpu_isa import ISA_NAMES, requested_isa

KERNEL_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
"""The kernel's dtype argument; ``speculant_kernel_dtypes()`` says which a build has."""

KERNEL_ISAS = ISA_NAMES
"""The kernel's instruction paths by code (``enum speculant_isa`` in csrc/kernels.h)."""
SIMD_BF16_ISAS = frozenset({"avx2", "avx512", "avx512_vnni", "avx512_bf16", "neon", "neon_dotprod"})
"""Paths with a vectorised bfloat16 linear layer and fused decoder (fast bfloat16)."""

CPU_FEATURE_NAMES = ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16")
"""Bit i of ``speculant_cpu_features()`` (csrc/cpu_features.c): what the AVX-512 bfloat16 paths need."""

BF16_PATHS = ("the bfloat16 linear-layer kernel (model.linear_backend) and the fused decoder layers "
              "(model.fast_forward)")
"""What is lost where no vector path runs (a CPU without AVX2+FMA, or SPECULANT_CPU_ISA=scalar)."""

SPAN_BAD_FIELDS = 6
"""Length of the ``bad`` array a refused span is described in (csrc/kernels.h)."""


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the argument and result types of every entry point; returns ``lib``."""
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    lib.speculant_paged_attention.argtypes = [i32, p, p, p, p, p, p, p, i64, i64, p, i64, i64, i64, i64, i64, i64,
                                              i64, f32, p, p, i32, p]
    lib.speculant_paged_attention.restype = i32
    lib.speculant_check_spans.argtypes = [p, p, p, i64, i64, p, i64, i64, i64, i64, p]
    lib.speculant_check_spans.restype = i32
    lib.speculant_write_kv.argtypes = [p, i64, p, i64, p, p, p, i64, i64, i64, i64]
    lib.speculant_write_kv.restype = i32
    for name in ("speculant_kernel_dtypes", "speculant_isa_active", "speculant_isa_detected", "speculant_cpu_features",
                 "speculant_cpu_has_bf16_paths", "speculant_linear_bf16_available",
                 "speculant_decoder_layer_fields"):
        getattr(lib, name).argtypes = []
        getattr(lib, name).restype = i32
    for name in ("speculant_isa_set", "speculant_isa_runs"):
        getattr(lib, name).argtypes = [i32]
        getattr(lib, name).restype = i32
    lib.speculant_linear_bf16.argtypes = [p, i64, i64, p, i64, i64, p, p, i64, p, i64, i32]
    lib.speculant_linear_bf16.restype = i32
    lib.speculant_rms_norm_bf16.argtypes = [p, i64, i64, p, i64, f32, i32, p, i64, i32]
    lib.speculant_rms_norm_bf16.restype = i32
    lib.speculant_sum_squares_bf16.argtypes = [p, i64, i64, i64, i32, p]
    lib.speculant_sum_squares_bf16.restype = i32
    lib.speculant_rotary_bf16.argtypes = [p, i64, i64, i64, i64, p, p, p]
    lib.speculant_rotary_bf16.restype = None
    lib.speculant_silu_mul_bf16.argtypes = [p, i64, i64, i64, p, p]
    lib.speculant_silu_mul_bf16.restype = None
    lib.speculant_decoder_bf16.argtypes = [p, i64, p, i64, i64, i64, i64, i64, i64, f32, i32, p, p, p, i64, p, p, p,
                                           i64, i64, p, i64, i64, f32, p, p, p, p, i32, p]
    lib.speculant_decoder_bf16.restype = i32
    for name in ("speculant_qlinear_isa", "speculant_qlinear_set_isa", "speculant_qlinear_isa_available",
                 "speculant_qlinear_has_type"):
        getattr(lib, name).argtypes = [] if name == "speculant_qlinear_isa" else [i32]
        getattr(lib, name).restype = i32
    lib.speculant_qlinear.argtypes = [i32, p, i64, i64, p, i64, i64, i32, p, p, i64, i32]
    lib.speculant_qlinear.restype = i32
    lib.speculant_qlinear_multi.argtypes = [i32, p, p, p, p, i64, p, i64, i64, i32, p, i64, i32]
    lib.speculant_qlinear_multi.restype = i32
    lib.speculant_qlinear_block.argtypes = [i32, p, i64]
    lib.speculant_qlinear_block.restype = i32
    lib.speculant_qdequant_rows.argtypes = [i32, p, i64, i64, p, i64, p]
    lib.speculant_qdequant_rows.restype = i32
    lib.speculant_qrepack_wanted.argtypes = [i32]
    lib.speculant_qrepack_wanted.restype = i32
    lib.speculant_qrepacked_bytes.argtypes = [i32, i64, i64]
    lib.speculant_qrepacked_bytes.restype = i64
    lib.speculant_qrepack_x16.argtypes = [i32, p, i64, i64, p]
    lib.speculant_qrepack_x16.restype = i32
    lib.speculant_decoder_scratch_elems.argtypes = [i64] * 6
    lib.speculant_decoder_scratch_elems.restype = i64
    return lib


def kernel_isa(lib: ctypes.CDLL) -> str:
    """The instruction path the dispatch takes now (the CPU's best, capped)."""
    return KERNEL_ISAS[lib.speculant_isa_active()]


def detected_isa(lib: ctypes.CDLL) -> str:
    """The best instruction path this CPU runs (cpuid), whatever the cap."""
    return KERNEL_ISAS[lib.speculant_isa_detected()]


def runnable_isas(lib: ctypes.CDLL) -> list[str]:
    """Every path this CPU runs, scalar first."""
    return [name for code, name in enumerate(KERNEL_ISAS) if lib.speculant_isa_runs(code)]


def apply_isa_cap(lib: ctypes.CDLL) -> str:
    """Cap the dispatch at ``SPECULANT_CPU_ISA`` (none when unset); returns the path now in use."""
    name = requested_isa()
    return KERNEL_ISAS[lib.speculant_isa_set(-1 if name is None else KERNEL_ISAS.index(name))]


def set_kernel_isa(lib: ctypes.CDLL, name: str | None) -> str:
    """Force the dispatch onto path ``name`` (None: back to ``SPECULANT_CPU_ISA``'s cap, else cpuid's
    best); raises ``RuntimeError`` (leaving the path as it was) when this CPU lacks the one asked for."""
    if name is None:
        return apply_isa_cap(lib)
    if name not in KERNEL_ISAS:
        raise ValueError(f"kernel path {name!r} is not one of {', '.join(KERNEL_ISAS)}")
    before = lib.speculant_isa_active()
    got = KERNEL_ISAS[lib.speculant_isa_set(KERNEL_ISAS.index(name))]
    if got != name:
        lib.speculant_isa_set(before)
        raise RuntimeError(f"kernel path {name!r}: this CPU does not run it (it runs {', '.join(runnable_isas(lib))})")
    return got


def kernel_dtypes(lib: ctypes.CDLL) -> frozenset[torch.dtype]:
    """The tensor dtypes this build of the kernel computes (float32, bfloat16, and
    float16 where the compiler has ``_Float16``)."""
    mask = lib.speculant_kernel_dtypes()
    return frozenset(dt for dt, code in KERNEL_DTYPE_CODES.items() if mask >> code & 1)


def missing_cpu_features(lib: ctypes.CDLL) -> list[str]:
    """The features of ``CPU_FEATURE_NAMES`` this CPU lacks (cpuid; all of them off x86-64)."""
    mask = lib.speculant_cpu_features()
    return [name for i, name in enumerate(CPU_FEATURE_NAMES) if not mask >> i & 1]


def fast_bf16_unavailable_reason(lib: ctypes.CDLL) -> str | None:
    """Why the vectorised bfloat16 linear layer and fused decoder do not run here (None: they do)."""
    isa = kernel_isa(lib)
    if isa in SIMD_BF16_ISAS:
        return None
    if (name := requested_isa()) is not None and detected_isa(lib) in SIMD_BF16_ISAS:
        return f"{ISA_ENV}={name} caps the C kernels at the {isa} path"
    return (f"this CPU runs no vector path for them (best: {detected_isa(lib)}; they need avx2 with fma, AVX-512, "
            "or NEON)")


def lost_paths_line(lib: ctypes.CDLL) -> str | None:
    """One plain line saying which kernels cannot run here and why; None when all can."""
    reason = fast_bf16_unavailable_reason(lib)
    if reason is None:
        return None
    return (f"C kernels: {BF16_PATHS} are off: {reason}; attention, K/V writes, norms, rotary and the MLP "
            "activation still run on the scalar C kernels, linear layers on torch")
