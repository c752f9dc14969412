"""The C-level self-test (csrc/path_selftest.c): every vector path of the kernels this CPU runs
against the scalar path on small shapes: bit for bit, attention within its stated bound.
Natively on this machine, and for aarch64: the library cross-compiled with Debian's gcc-aarch64-linux-gnu and run under
qemu-user (NEON, and dotprod where a path has it: qemu's default CPU has both). The aarch64
test skips only when those tools are missing, and fails instead under
SPECULANT_REQUIRE_KERNELS=1 (.ci/run installs them)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from speculant.model.kernels.compile import CORE_SOURCES, CSRC, FLAGS, path_sources, target_arch

SELFTEST = Path(__file__).with_name("csrc") / "path_selftest.c"
CROSS_CC, QEMU, SYSROOT = "aarch64-linux-gnu-gcc", "qemu-aarch64", "/usr/aarch64-linux-gnu"


def build(cc: str, out: Path, march: str) -> None:
    arch = target_arch(cc)
    sources = [*CORE_SOURCES, *path_sources(arch), SELFTEST]
    result = subprocess.run([cc, *FLAGS, f"-march={march}", "-I", str(CSRC), *map(str, sources), "-o", str(out),
                             "-lm"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def check_output(out: subprocess.CompletedProcess, want_paths: int) -> None:
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.endswith(" 0 difference(s)") and int(last.split()[0]) >= want_paths, last


@pytest.mark.skipif(shutil.which("gcc") is None or target_arch("gcc") != "x86_64", reason="needs gcc on x86-64")
def test_every_x86_path_this_cpu_runs_equals_scalar(tmp_path):
    exe = tmp_path / "selftest"
    build("gcc", exe, "x86-64")
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    check_output(out, 1 if " avx2 " in flags else 0)


def test_every_aarch64_path_equals_scalar_under_qemu(tmp_path):
    missing = [tool for tool in (CROSS_CC, QEMU) if shutil.which(tool) is None]
    if missing:
        reason = f"{', '.join(missing)} not installed (apt-get install gcc-aarch64-linux-gnu qemu-user)"
        if os.environ.get("SPECULANT_REQUIRE_KERNELS") == "1":
            pytest.fail(f"SPECULANT_REQUIRE_KERNELS=1: {reason}", pytrace=False)
        pytest.skip(reason)
    exe = tmp_path / "selftest"
    build(CROSS_CC, exe, "armv8-a")
    out = subprocess.run([QEMU, "-L", SYSROOT, str(exe)], capture_output=True, text=True, timeout=600)
    check_output(out, 2)  # NEON and NEON dotprod (qemu's default CPU has both)
    lines = out.stdout.splitlines()
    for path in (5, 6):  # every NEON kernel was compared on both paths
        for kernel in ("linear", "rms_norm", "rotary", "silu_mul", "attention bfloat16", "attention float32"):
            assert any(ln.startswith(f"ok {kernel}") and f"path {path}" in ln for ln in lines), (kernel, path)
    for qpath in (3, 4):  # the quantized dot products: plain NEON and SDOT, every format
        for qtype in (2, 3, 6, 8, 12, 13, 14):
            assert any(ln.startswith(f"ok quant type {qtype} ") and ln.endswith(f"quant path {qpath}") for ln in lines)
