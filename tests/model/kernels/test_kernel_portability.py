"""The C kernels compile for every x86-64 level and say, in one line, what this CPU cannot run.

Before: attention_bf16.c used 256-bit masked AVX-512VL intrinsics under a target
attribute without ``avx512vl``, so GCC refused the whole library for
``-march=haswell``/``x86-64-v3``/``znver3``, and every kernel was off on such CPUs.
"""

from __future__ import annotations

import platform
import shutil
import types

import pytest

from speculant.model.kernels import build as cpu_kernel_build
from speculant.model.kernels.abi import BF16_PATHS, KERNEL_ISAS, lost_paths_line

x86_gcc = pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("gcc") is None,
                             reason="needs gcc on x86-64 (the -march levels are x86's)")


@x86_gcc
@pytest.mark.slow
@pytest.mark.parametrize("march", ["x86-64", "x86-64-v2", "x86-64-v3", "skylake-avx512", "znver3"])
def test_every_source_compiles_for_the_level(march):
    assert cpu_kernel_build.compile_check(march, "gcc") is None


@x86_gcc
def test_the_level_that_broke_compiles():
    assert cpu_kernel_build.compile_check("x86-64-v3", "gcc") is None


@x86_gcc
def test_a_failed_compile_is_one_line_naming_the_error():
    error = cpu_kernel_build.compile_check("no-such-cpu", "gcc")
    assert error is not None and "\n" not in error and "error" in error and "no-such-cpu" in error


def _fake_lib(active: str, detected: str):
    return types.SimpleNamespace(speculant_isa_active=lambda: KERNEL_ISAS.index(active),
                                 speculant_isa_detected=lambda: KERNEL_ISAS.index(detected))


@pytest.mark.parametrize("detected", ["scalar"])
def test_lost_paths_are_one_line_naming_why(detected):
    line = lost_paths_line(_fake_lib(detected, detected))
    assert line is not None and "\n" not in line
    assert BF16_PATHS in line and f"this CPU runs no vector path for them (best: {detected};" in line
    assert "still run on the scalar C kernels" in line


def test_the_lost_paths_line_names_the_cap(monkeypatch):
    monkeypatch.setenv("SPECULANT_CPU_ISA", "scalar")
    line = lost_paths_line(_fake_lib("scalar", "avx512_bf16"))
    assert line is not None and "SPECULANT_CPU_ISA=scalar caps the C kernels at the scalar path" in line


@pytest.mark.parametrize(("active", "detected"), [("avx2", "avx512_bf16"), ("avx512", "avx512_bf16"),
                                                  ("avx512_bf16", "avx512_bf16"), ("neon", "neon_dotprod"),
                                                  ("neon_dotprod", "neon_dotprod")])
def test_nothing_is_reported_lost_on_a_vector_path(active, detected):
    assert lost_paths_line(_fake_lib(active, detected)) is None


def test_a_neon_cpu_capped_to_scalar_is_told_the_cap(monkeypatch):
    monkeypatch.setenv("SPECULANT_CPU_ISA", "scalar")
    line = lost_paths_line(_fake_lib("scalar", "neon_dotprod"))
    assert line is not None and "SPECULANT_CPU_ISA=scalar caps the C kernels at the scalar path" in line


def test_the_report_says_why_there_are_no_kernels(monkeypatch):
    monkeypatch.setenv("SPECULANT_CPU_KERNEL", "0")
    cpu_kernel_build.load_kernel.cache_clear()
    try:
        line = cpu_kernel_build.kernel_report()
    finally:
        cpu_kernel_build.load_kernel.cache_clear()
    assert line.startswith("C kernels: none (disabled by SPECULANT_CPU_KERNEL=0)") and "\n" not in line


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None,
                    reason="no aarch64 cross compiler (apt-get install gcc-aarch64-linux-gnu)")
@pytest.mark.parametrize("march", ["armv8-a", "armv8.2-a+bf16"])
def test_every_source_compiles_for_aarch64(march):
    """The x86 path files are left out and the x86 clones sit behind __x86_64__ guards: on ARM every
    core file and NEON path file builds."""
    assert cpu_kernel_build.compile_check(march, "aarch64-linux-gnu-gcc") is None
