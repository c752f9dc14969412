"""The C kernel library's interface as Python sees it: the ctypes signatures of
its entry points, its dtype and instruction-path codes, the CPU features its
AVX-512 bfloat16 paths need, and the meaning of a refused span.

Building and loading the library is ``kernels.build``'s job; everything
here takes the loaded ``ctypes.CDLL``.
"""

from __future__ import annotations

import ctypes

import torch

KERNEL_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
"""The kernel's dtype argument; ``speculant_kernel_dtypes()`` says which a build has."""

KERNEL_ISAS = {0: "portable", 1: "avx512_bf16"}
"""The kernel's instruction paths for bfloat16 scores (``speculant_kernel_isa``)."""

CPU_FEATURE_NAMES = ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16")
"""Bit i of ``speculant_cpu_features()`` (csrc/cpu_features.c): what the AVX-512 bfloat16 paths need."""

BF16_PATHS = ("the bfloat16 linear-layer kernel (model.linear_backend), the fused decoder layers "
              "(model.fast_forward) and the vectorised bfloat16 attention")
"""What is lost where the CPU lacks a feature of ``CPU_FEATURE_NAMES``."""

SPAN_BAD_FIELDS = 6
"""Length of the ``bad`` array a refused span is described in (csrc/kernels.h)."""


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the argument and result types of every entry point; returns ``lib``."""
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    lib.speculant_paged_attention.argtypes = [i32, p, p, p, p, p, p, p, i64, i64, p, i64, i64, i64, i64, i64, i64,
                                              i64, f32, i32, p]
    lib.speculant_paged_attention.restype = i32
    lib.speculant_check_spans.argtypes = [p, p, p, i64, i64, p, i64, i64, i64, i64, p]
    lib.speculant_check_spans.restype = i32
    lib.speculant_write_kv.argtypes = [p, i64, p, i64, p, p, p, i64, i64, i64, i64]
    lib.speculant_write_kv.restype = i32
    for name in ("speculant_kernel_dtypes", "speculant_kernel_isa", "speculant_cpu_features",
                 "speculant_cpu_has_bf16_paths", "speculant_linear_bf16_available",
                 "speculant_decoder_layer_fields"):
        getattr(lib, name).argtypes = []
        getattr(lib, name).restype = i32
    lib.speculant_kernel_set_isa.argtypes = [i32]
    lib.speculant_kernel_set_isa.restype = i32
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
                                           i64, i64, p, i64, i64, f32, p, p, i32, p]
    lib.speculant_decoder_bf16.restype = i32
    for name in ("speculant_qlinear_isa", "speculant_qlinear_set_isa", "speculant_qlinear_isa_available",
                 "speculant_qlinear_has_type"):
        getattr(lib, name).argtypes = [] if name == "speculant_qlinear_isa" else [i32]
        getattr(lib, name).restype = i32
    lib.speculant_qlinear.argtypes = [i32, p, i64, i64, p, i64, i64, i32, p, p, i64, i32]
    lib.speculant_qlinear.restype = i32
    lib.speculant_qlinear_multi.argtypes = [i32, p, p, p, p, i64, p, i64, i64, i32, p, i64, i32]
    lib.speculant_qlinear_multi.restype = i32
    lib.speculant_qdequant_rows.argtypes = [i32, p, i64, i64, p, i64, p]
    lib.speculant_qdequant_rows.restype = i32
    lib.speculant_decoder_scratch_elems.argtypes = [i64] * 6
    lib.speculant_decoder_scratch_elems.restype = i64
    return lib


def kernel_isa(lib: ctypes.CDLL) -> str:
    """The bfloat16 score path in use: 'avx512_bf16' where the CPU has it (cpuid), else 'portable'."""
    return KERNEL_ISAS[lib.speculant_kernel_isa()]


def set_kernel_isa(lib: ctypes.CDLL, name: str | None) -> str:
    """Force the bfloat16 score path (None: back to cpuid detection); raises
    ``RuntimeError`` when the CPU lacks the one asked for."""
    wanted = -1 if name is None else {v: k for k, v in KERNEL_ISAS.items()}[name]
    got = lib.speculant_kernel_set_isa(wanted)
    if got < 0:
        raise RuntimeError(f"kernel path {name!r}: this CPU lacks {', '.join(missing_cpu_features(lib))}")
    return KERNEL_ISAS[got]


def kernel_dtypes(lib: ctypes.CDLL) -> frozenset[torch.dtype]:
    """The tensor dtypes this build of the kernel computes (float32, bfloat16, and
    float16 where the compiler has ``_Float16``)."""
    mask = lib.speculant_kernel_dtypes()
    return frozenset(dt for dt, code in KERNEL_DTYPE_CODES.items() if mask >> code & 1)


def missing_cpu_features(lib: ctypes.CDLL) -> list[str]:
    """The features of ``CPU_FEATURE_NAMES`` this CPU lacks (cpuid; all of them off x86-64)."""
    mask = lib.speculant_cpu_features()
    return [name for i, name in enumerate(CPU_FEATURE_NAMES) if not mask >> i & 1]


def lost_paths_line(lib: ctypes.CDLL) -> str | None:
    """One plain line saying which kernels cannot run on this CPU and why; None when all can."""
    missing = missing_cpu_features(lib)
    if not missing:
        return None
    return (f"C kernels: {BF16_PATHS} cannot run on this CPU, which lacks {', '.join(missing)}; "
            "attention, K/V writes, norms, rotary and the MLP activation still run on the portable C kernels, "
            "linear layers on torch")
