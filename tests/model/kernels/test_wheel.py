"""The binary wheel: ``python -m build`` compiles every instruction path into the package, and a
venv with no C compiler that installs it has every kernel, loaded from the package (not compiled),
the dispatch walking every path this CPU runs (tests/model/kernels/test_isa_paths.py run there), and
one OpenMP runtime in the process: torch's libgomp.so.1 satisfies the library's libgomp.so.1.

Slow (a wheel build, a venv): ``-m slow``. The venv borrows this one's dependencies through a
``.pth`` line (torch is not downloaded again); ``speculant`` itself comes from the wheel.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which(os.environ.get("CC") or "cc") is None,
                                 reason="building the wheel needs a C compiler")]

PROBE = """
import shutil, speculant
from speculant.model.kernels.build import load_kernel, kernel_status
from speculant.model.kernels.abi import runnable_isas, detected_isa
assert shutil.which("cc") is None and shutil.which("gcc") is None
lib = load_kernel()
assert lib is not None, kernel_status()
print(speculant.__file__)
print(kernel_status())
print(detected_isa(lib), ",".join(runnable_isas(lib)))
import re, torch
gomp = sorted(set(re.findall(r"\\S*gomp\\S*", open("/proc/self/maps").read())))
assert len(gomp) == 1 and gomp[0].startswith(torch.__path__[0]), gomp  # torch's OpenMP runtime, no second one
"""


def test_a_venv_without_a_compiler_has_every_kernel_from_the_wheel(tmp_path):
    pytest.importorskip("build")
    out = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                          str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("speculant-*.whl")
    assert "linux_" in wheel.name or "macosx" in wheel.name  # a platform wheel, not py3-none-any
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    venv_site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                               capture_output=True, text=True, check=True).stdout.strip()
    Path(venv_site, "deps.pth").write_text(site.getsitepackages()[0] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   timeout=300)
    env = {"HOME": str(tmp_path), "PATH": str(venv / "bin"), "CC": "/nonexistent",
           "SPECULANT_CACHE_DIR": str(tmp_path / "cache")}
    probe = subprocess.run([str(python), "-c", PROBE], env=env, capture_output=True, text=True, timeout=300,
                           cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr[-3000:]
    where, status, paths = probe.stdout.strip().splitlines()[-3:]
    assert where.startswith(venv_site)
    assert status.startswith("loaded the library shipped with the package at " + venv_site)
    tests = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            str(ROOT / "tests/model/kernels/test_isa_paths.py")],
                           env={**env, "SPECULANT_REQUIRE_KERNELS": "1"}, capture_output=True, text=True,
                           timeout=900, cwd=ROOT / "tests")
    assert tests.returncode == 0, tests.stdout[-3000:]
    assert not (tmp_path / "cache" / "kernels").exists() or not list((tmp_path / "cache" / "kernels").glob("*.so"))
