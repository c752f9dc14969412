"""Build and load the C kernels (``csrc/*.c``: one library holding every
instruction path, compiled by ``kernels.compile``; its ctypes signatures are in
``kernels.abi``).

The kernel is compiled on first use with the system C compiler (``$CC``, else
``cc``) for the architecture's baseline (every SIMD path inside, chosen at run
time from cpuid) and cached by a hash of the sources, the flags, the compiler
and the architecture, so a changed source gets its own build. It is loaded with ``ctypes`` after torch, so its OpenMP
calls share torch's ``libgomp``. Anything that goes wrong (no compiler, a
failed build, ``SPECULANT_CPU_KERNEL=0``) leaves :func:`load_kernel` returning
None and :func:`kernel_status` saying why; the backend then falls back to the
torch path.

The cache lives in ``$SPECULANT_CACHE_DIR/kernels`` if that is set, else
``$XDG_CACHE_HOME/speculant/kernels`` (``~/.cache/speculant/kernels``). Loading
a shared library runs its code, so the cache is trusted only when the cache
directory and its ``kernels`` folder are real directories owned by the current
user and not writable by group or others; otherwise the kernel is built in a
private temporary directory (``mkdtemp``) and :func:`kernel_status` says why.
Each build records the library's SHA-256 in a sidecar file (``.so.sha256``,
written atomically); a cached library is loaded only if both files are
regular files owned by the user in the trusted folder and the digest matches,
else it is rebuilt. A library planted under the predictable name is never
loaded.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import torch  # noqa: F401  (loads torch's libgomp before the kernel needs it)

from speculant.model.kernels.abi import (  # noqa: F401  (re-exported: the kernel's public face)
    KERNEL_DTYPE_CODES,
    KERNEL_ISAS,
    apply_isa_cap,
    bind,
    kernel_dtypes,
    kernel_isa,
    lost_paths_line,
    set_kernel_isa,
)
from speculant.model.kernels.compile import FLAGS, all_sources, build_library, prebuilt_library

DIGEST_SUFFIX = ".sha256"
_status: list[str] = ["not built yet"]


def kernel_status() -> str:
    """Why the kernel is or is not in use, for logs and error messages."""
    return _status[0]


def cache_root() -> Path:
    """``$SPECULANT_CACHE_DIR``, else ``$XDG_CACHE_HOME/speculant``, else ``~/.cache/speculant``."""
    if os.environ.get("SPECULANT_CACHE_DIR"):
        return Path(os.environ["SPECULANT_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"  # the XDG spec ignores relative
    return base / "speculant"


def _compiler_version(cc: str) -> str:
    out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    return out.stdout.splitlines()[0] if out.stdout else ""


def library_name(cc: str) -> str:
    """File name of the build for these sources, flags, compiler and architecture."""
    key = hashlib.sha256(b"\0".join([*(src.name.encode() + src.read_bytes() for src in all_sources()),
                                     " ".join(FLAGS).encode(), _compiler_version(cc).encode(),
                                     platform.machine().encode()])).hexdigest()[:16]
    return f"paged_attention-{key}.so"


def untrusted_reason(path: Path) -> str | None:
    """Why ``path`` may not hold code we load (None: a real directory owned by
    this user, not writable by group or others)."""
    try:
        st = os.lstat(path)
    except OSError as err:
        return f"cannot stat {path}: {err}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a real directory"
    if st.st_uid != os.getuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
                f"run `chmod go-w {path}` to cache the kernel there")
    return None


def _trusted_kernel_dir() -> Path | str:
    """The cache's ``kernels`` folder (created 0700 if missing), or why it cannot be used."""
    root = cache_root()
    folder = root / "kernels"
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError as err:
        return f"cannot create {folder}: {err}"
    return untrusted_reason(root) or untrusted_reason(folder) or folder


def _own_regular_file(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def verified_cache_entry(lib: Path, trusted: Path) -> str | None:
    """Why the cached ``lib`` may not be loaded (None: it may)."""
    sidecar = lib.with_name(lib.name + DIGEST_SUFFIX)
    if not lib.exists():
        return "not cached yet"
    if sidecar.parent.resolve() != trusted.resolve() or lib.parent.resolve() != trusted.resolve():
        return f"{sidecar} is not in the trusted folder {trusted}"
    if (reason := untrusted_reason(trusted)) is not None:
        return reason
    if not (_own_regular_file(lib) and _own_regular_file(sidecar)):
        return f"{lib} or its digest file is missing, not a regular file of this user, or writable by others"
    recorded = sidecar.read_text().strip()
    if recorded != file_digest(lib):
        return f"the SHA-256 of {lib} does not match the one recorded at build time"
    return None


def _compile(cc: str, out: Path) -> list[str]:
    """Build into ``out`` (atomically) and record its digest next to it; returns the path files left out."""
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        dropped = build_library(cc, Path(tmp))
        os.chmod(tmp, 0o755)                   # whatever the umask: never group/other-writable
        digest = file_digest(Path(tmp))
        os.replace(tmp, out)                   # atomic: concurrent builders race harmlessly
        _write_atomic(out.with_name(out.name + DIGEST_SUFFIX), digest + "\n")
        return dropped
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def compile_check(march: str, cc: str | None = None) -> str | None:
    """Compile every source of ``cc``'s architecture for ``-march=<march>`` (nothing kept), warnings on;
    None, or the first error (a path file left out counts)."""
    cc = cc or os.environ.get("CC") or "cc"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            dropped = build_library(cc, Path(tmp) / "k.so", march, ("-Wall",))
        except (RuntimeError, subprocess.SubprocessError, OSError) as err:
            return str(err)
    return dropped[0] if dropped else None


def kernel_report() -> str:
    """One plain line: which C kernels run here, and what is lost and why."""
    lib = load_kernel()
    if lib is None:
        return (f"C kernels: none ({kernel_status()}): attention, K/V writes, norms, rotary, the MLP activation "
                "and the bfloat16 linear layers run on torch instead (correct, slower)")
    return lost_paths_line(lib) or f"C kernels: every kernel runs, on the {kernel_isa(lib)} path"


def _load_private(cc: str, name: str, why: str) -> tuple[ctypes.CDLL, str]:
    """Build in a fresh ``mkdtemp`` folder, load, and remove the folder (the
    loaded mapping stays valid)."""
    folder = Path(tempfile.mkdtemp(prefix="speculant-kernel-"))
    try:
        path = folder / name
        dropped = _compile(cc, path)
        lib = bind(ctypes.CDLL(str(path)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return lib, f"built with {cc} in a private temporary directory (not cached: {why}){_dropped_note(dropped)}"


def _dropped_note(dropped: list[str]) -> str:
    return f"; paths left out, the compiler failed on them: {'; '.join(dropped)}" if dropped else ""


@functools.cache
def load_kernel() -> ctypes.CDLL | None:
    """The compiled kernel library, built on first call; None (with
    :func:`kernel_status` saying why) where it cannot be built or loaded."""
    if os.environ.get("SPECULANT_CPU_KERNEL", "1") == "0":
        _status[0] = "disabled by SPECULANT_CPU_KERNEL=0"
        return None
    prebuilt = prebuilt_library(platform.machine())
    if isinstance(prebuilt, Path):  # a binary wheel: no compiler needed
        try:
            lib = bind(ctypes.CDLL(str(prebuilt)))
        except (OSError, AttributeError) as err:
            prebuilt = f"the prebuilt library at {prebuilt} does not load: {err}"
        else:
            _status[0] = f"loaded the library shipped with the package at {prebuilt}"
            return _report_lost(lib)
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        _status[0] = f"no C compiler ({cc!r} not on PATH; install gcc or set CC), and {prebuilt}"
        return None
    try:
        name = library_name(cc)
        folder = _trusted_kernel_dir()
        if isinstance(folder, str):  # why the cache cannot be used
            lib, _status[0] = _load_private(cc, name, folder)
            return _report_lost(lib)
        path = folder / name
        problem, dropped = verified_cache_entry(path, folder), []
        if problem is not None:
            dropped = _compile(cc, path)
            if (after := verified_cache_entry(path, folder)) is not None:
                raise RuntimeError(f"the fresh build does not verify: {after}")
        lib = bind(ctypes.CDLL(str(path)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        _status[0] = f"build failed: {err}"
        return None
    note = f" (rebuilt: {problem})" if problem not in (None, "not cached yet") else ""
    _status[0] = (f"built with {cc} at {path}" if problem else f"loaded from the cache at {path}") + note
    _status[0] += _dropped_note(dropped)
    return _report_lost(lib)


def _report_lost(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Apply the ``SPECULANT_CPU_ISA`` cap, and log, in one line, the kernels this CPU cannot run
    (once per process: load_kernel is cached)."""
    apply_isa_cap(lib)
    if (lost := lost_paths_line(lib)) is not None:
        logging.getLogger(__name__).warning(lost)
    return lib


def main(argv: list[str] | None = None) -> int:
    """``python -m speculant.model.kernels.build --march x86-64 x86-64-v3 ...``:
    compile every kernel source for each target (CI's portability check); without ``--march``,
    build for this machine and print :func:`kernel_report`."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--march", nargs="+", default=[], help="targets to compile for (-march=...)")
    args = ap.parse_args(argv)
    if not args.march:
        print(kernel_report())
        return 0 if load_kernel() is not None else 1
    failed = 0
    for march in args.march:
        error = compile_check(march)
        print(f"-march={march}: {'ok' if error is None else 'FAILED: ' + error}")
        failed += error is not None
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
