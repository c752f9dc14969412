"""Compile the C kernels (``csrc/``) into one shared library holding every
instruction path, for a baseline ``-march``.

The library is built for the architecture's baseline (``-march=x86-64``,
``-march=armv8-a``), never ``-march=native``: each SIMD path carries its own
target attribute and is chosen at run time from cpuid (``csrc/cpu_features.c``,
the dispatch in ``csrc/kernels.h``), so one build serves every CPU of the
architecture (and can ship in a wheel).

Sources are of two kinds:
- the core files (``CORE_SOURCES``): the scalar reference of every kernel, the
  dispatch, the portable attention; a core file that fails to compile fails the
  build;
- path files, named ``<kernel>_<path>.c`` for a path of the target's
  architecture (``PATH_SUFFIXES``): one path's variants of one kernel, declared
  weak in ``kernels.h``. Each compiles on its own; one that fails is left out
  (its weak symbols are then NULL and the dispatch skips that path) and the
  build names it, so one path that a compiler cannot build drops only itself.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

CSRC = Path(__file__).with_name("csrc")
CORE_SOURCES = [CSRC / name for name in (
    "paged_attention.c", "kv_write.c", "linear_bf16.c", "rms_norm.c", "rotary.c", "silu_mul.c", "decoder_bf16.c",
    "cpu_features.c", "spans.c", "quant_decode.c", "quant_linear.c", "quant_dispatch.c", "quant_repack.c",
    "quant_repack_b32.c")]
PATH_SUFFIXES = {"x86_64": ("avx2", "avx512", "avx512_vnni", "avx512_bf16"), "aarch64": ("neon", "neon_dotprod")}
"""The SIMD paths per architecture (the order of ``csrc/kernels.h``'s enum), as file-name suffixes."""
BASELINE_MARCH = {"x86_64": "x86-64", "aarch64": "armv8-a"}
FLAGS = ["-O3", "-fPIC", "-fopenmp", "-fno-math-errno", "-std=c11", "-ffp-contract=off"]
"""``-ffp-contract=off``: no multiply-add is fused behind the code's back, so a path's bits are the code's."""


def target_arch(cc: str) -> str:
    """The architecture ``cc`` compiles for (``x86_64``, ``aarch64``, ...), from ``cc -dumpmachine``."""
    out = subprocess.run([cc, "-dumpmachine"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip().split("-")[0] if out.returncode == 0 else ""


def path_of(source: Path, arch: str) -> str | None:
    """The path a source file holds for ``arch`` (its longest matching suffix), or None."""
    stem = source.stem
    found = [p for p in PATH_SUFFIXES.get(arch, ()) if stem.endswith("_" + p)]
    return max(found, key=len) if found else None


def path_sources(arch: str) -> list[Path]:
    """The path files of ``arch`` in ``csrc`` (sorted)."""
    return sorted(src for src in CSRC.glob("*.c") if src not in CORE_SOURCES and path_of(src, arch) is not None)


def all_sources() -> list[Path]:
    """Every C file and header (the build's cache key)."""
    return sorted(CSRC.glob("*.c")) + sorted(CSRC.glob("*.h"))


def sources_digest() -> str:
    """SHA-256 of every source file (name and bytes) and the flags: what a prebuilt library was built from."""
    import hashlib

    h = hashlib.sha256(" ".join(FLAGS).encode())
    for src in all_sources():
        h.update(b"\0" + src.name.encode() + b"\0" + src.read_bytes())
    return h.hexdigest()


PREBUILT_DIR = Path(__file__).with_name("prebuilt")
"""Where a binary wheel carries the library, built at wheel time (setup.py): ``<machine>.so`` and its
``<machine>.json`` (``sources_digest`` and the paths it holds)."""


def build_prebuilt(cc: str, folder: Path, machine: str) -> Path:
    """Build the wheel's library into ``folder`` (every path of the architecture, or ``RuntimeError``)."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{machine}.so"
    dropped = build_library(cc, out)
    if dropped:
        raise RuntimeError(f"a wheel must hold every instruction path; {cc} failed on {'; '.join(dropped)}")
    meta = {"sources": sources_digest(), "paths": [path_of(p, machine) for p in path_sources(machine)]}
    out.with_suffix(".json").write_text(json.dumps(meta) + "\n")
    return out


def prebuilt_library(machine: str) -> Path | str:
    """The library shipped in the wheel for ``machine``, or why there is none to use."""
    import json

    path = PREBUILT_DIR / f"{machine}.so"
    try:
        meta = json.loads(path.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return f"no prebuilt library at {path} (a source install)"
    if not path.is_file() or meta.get("sources") != sources_digest():
        return f"the prebuilt library at {path} was built from other sources"
    return path


def first_error(stderr: str) -> str:
    """The compiler's first error line (file, line and message), else its last line: one line for a log."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln]
    return (errors or lines or ["no output"])[0][-300:]


def build_library(cc: str, out: Path, march: str | None = None, extra: tuple[str, ...] = ()) -> list[str]:
    """Compile every source of ``cc``'s architecture for ``-march=<march>`` (default: the baseline)
    and link them into ``out``. Returns the path files left out, each as 'file: first error'; raises
    ``RuntimeError`` (naming the file and the error) when a core file or the link fails."""
    arch = target_arch(cc)
    march = march or BASELINE_MARCH.get(arch)
    flags = [*FLAGS, *([f"-march={march}"] if march else []), *extra]
    dropped, objects = [], []
    with tempfile.TemporaryDirectory(prefix="speculant-objs-") as tmp:
        for src in CORE_SOURCES + path_sources(arch):
            obj = Path(tmp) / (src.stem + ".o")
            result = subprocess.run([cc, *flags, "-c", str(src), "-o", str(obj)], capture_output=True, text=True,
                                    timeout=300)
            if result.returncode == 0:
                objects.append(str(obj))
            elif src in CORE_SOURCES:
                raise RuntimeError(f"{cc} failed on {src.name}: {first_error(result.stderr)}")
            else:
                dropped.append(f"{src.name}: {first_error(result.stderr)}")
        result = subprocess.run([cc, "-shared", "-fopenmp", *objects, "-o", str(out), "-lm"], capture_output=True,
                                text=True, timeout=300)
        if result.returncode != 0:
            raise RuntimeError(f"{cc} failed to link: {first_error(result.stderr)}")
    return dropped
