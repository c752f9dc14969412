"""Build and load the C paged-attention kernel (``csrc/paged_attention.c``).

The kernel is compiled on first use with the system C compiler (``$CC``, else
``cc``) for this machine (``-march=native``) and cached under
``$SPECULANT_CACHE_DIR`` (default ``~/.cache/speculant``) by a hash of the
source, the flags, the compiler and the CPU, so a changed source or another CPU
gets its own build. It is loaded with ``ctypes`` after torch, so its OpenMP
calls share torch's ``libgomp``. Anything that goes wrong (no compiler, a
failed build, ``SPECULANT_CPU_KERNEL=0``) leaves :func:`load_kernel` returning
None and :func:`kernel_status` saying why; the backend then falls back to the
torch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch  # noqa: F401  (loads torch's libgomp before the kernel needs it)

SOURCE = Path(__file__).with_name("csrc") / "paged_attention.c"
FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp", "-fno-math-errno", "-std=c11"]
NATIVE = "-march=native"
_status: list[str] = ["not built yet"]


def kernel_status() -> str:
    """Why the kernel is or is not in use, for logs and error messages."""
    return _status[0]


def _cpu_signature() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = [ln for ln in info if ln.startswith(("model name", "flags"))][:2]
    return "\n".join(wanted)


def _compiler_version(cc: str) -> str:
    out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    return out.stdout.splitlines()[0] if out.stdout else ""


def _compile(cc: str, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        for flags in ([*FLAGS, NATIVE], FLAGS):        # some compilers refuse -march=native
            result = subprocess.run([cc, *flags, str(SOURCE), "-o", tmp, "-lm"], capture_output=True,
                                    text=True, timeout=300)
            if result.returncode == 0:
                os.replace(tmp, out)                   # atomic: concurrent builders race harmlessly
                return
        raise RuntimeError(f"{cc} failed: {result.stderr.strip()[-500:]}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    fn = lib.speculant_paged_attention
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p, p, p, p, p, p, p, i64, p, i64, i64, i64, i64, i64, ctypes.c_float, ctypes.c_int]
    fn.restype = ctypes.c_int
    return lib


@functools.cache
def load_kernel() -> ctypes.CDLL | None:
    """The compiled kernel library, built on first call; None (with
    :func:`kernel_status` saying why) where it cannot be built or loaded."""
    if os.environ.get("SPECULANT_CPU_KERNEL", "1") == "0":
        _status[0] = "disabled by SPECULANT_CPU_KERNEL=0"
        return None
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        _status[0] = f"no C compiler ({cc!r} not on PATH; install gcc or set CC)"
        return None
    try:
        key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), " ".join(FLAGS + [NATIVE]).encode(),
                                         _compiler_version(cc).encode(), _cpu_signature().encode(),
                                         platform.machine().encode()])).hexdigest()[:16]
        cache = Path(os.environ.get("SPECULANT_CACHE_DIR") or Path.home() / ".cache" / "speculant")
        path = cache / "kernels" / f"paged_attention-{key}.so"
        if not path.exists():
            _compile(cc, path)
        lib = _bind(ctypes.CDLL(str(path)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        _status[0] = f"build failed: {err}"
        return None
    _status[0] = f"built with {cc} at {path}"
    return lib
