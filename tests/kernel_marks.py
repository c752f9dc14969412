"""Marks for tests that need the C kernels, and what ``SPECULANT_REQUIRE_KERNELS=1`` makes of them.

``@needs_kernel``: the test needs the kernel library. ``@needs_bf16_paths``: it
needs a vector bfloat16 path (AVX2+FMA, AVX-512 or AVX512-BF16: the linear
kernel and the fused decoder). Without the library, or on a CPU that
lacks the features, such a test skips, saying why. With
``SPECULANT_REQUIRE_KERNELS=1`` (CI) a missing library fails the test instead,
and so does a bfloat16 path our cpuid check turns down on a CPU whose
/proc/cpuinfo lists avx2 and fma; only a CPU that really lacks them, or a run
capped by SPECULANT_CPU_ISA, still skips. Tests that decide inside their body call ``require_kernel()`` or
``require_bf16_paths()``.
"""

from __future__ import annotations

import os

import pytest

from speculant.config.cpu_isa import requested_isa
from speculant.config.dtype_choice import cpu_flags
from speculant.model.kernels.abi import SIMD_BF16_ISAS, detected_isa, fast_bf16_unavailable_reason
from speculant.model.kernels.build import kernel_status, load_kernel

REQUIRE = os.environ.get("SPECULANT_REQUIRE_KERNELS") == "1"
needs_kernel = pytest.mark.needs_kernel
needs_bf16_paths = pytest.mark.needs_bf16_paths


def kernel_problem() -> str | None:
    return None if load_kernel() is not None else f"no C kernel here: {kernel_status()}"


def bf16_problem() -> tuple[str | None, bool]:
    """(why the bfloat16 paths cannot run, whether that is this CPU's own lack and so a fair skip)."""
    if (problem := kernel_problem()) is not None:
        return problem, False
    lib = load_kernel()
    reason = fast_bf16_unavailable_reason(lib)
    if reason is None:
        return None, True
    if requested_isa() is not None or detected_isa(lib) in SIMD_BF16_ISAS:
        return reason, True  # the run asked for the cap
    if {"avx2", "fma"} <= cpu_flags():
        return f"cpuid check refuses avx2/fma although /proc/cpuinfo lists them: {reason}", False
    return reason, True


def _skip_or_fail(reason: str | None, fair: bool) -> None:
    if reason is None:
        return
    if REQUIRE and not fair:
        pytest.fail(f"SPECULANT_REQUIRE_KERNELS=1: {reason}", pytrace=False)
    pytest.skip(reason)


def require_kernel() -> None:
    _skip_or_fail(kernel_problem(), False)


def require_bf16_paths() -> None:
    _skip_or_fail(*bf16_problem())


def check_marks(item: pytest.Item) -> None:
    """conftest's ``pytest_runtest_setup``: apply the two marks."""
    if item.get_closest_marker("needs_kernel") is not None:
        require_kernel()
    if item.get_closest_marker("needs_bf16_paths") is not None:
        require_bf16_paths()
