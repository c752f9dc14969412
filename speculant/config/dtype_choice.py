"""``model.dtype = "auto"``: bfloat16 where it is fast here and the checkpoint allows it, else float32.

Fast: a CPU where the C kernels have a vector bfloat16 path (the linear layer and the fused
decoder, ``model/kernels/csrc/linear_bf16*.c``): x86-64 with AVX2 and FMA, or AVX-512; aarch64
with NEON (``asimd``); not capped below it by ``SPECULANT_CPU_ISA``; or a CUDA device. Allowed:
the checkpoint stores bfloat16 weights (``torch_dtype`` / ``dtype`` in config.json), or is a
GGUF file (quantized or 16-bit weights: bfloat16 keeps what they hold); a float32 or float16
checkpoint stays float32 (bfloat16 would round its weights, or shrink nothing). Read without
torch, from /proc/cpuinfo (``flags`` on x86, ``Features`` on aarch64) and config.json, when
the config is validated; ``--verbose`` prints the reason (``ModelConfig.dtype_reason``).
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

from speculant.config.cpu_isa import requested_isa

X86_MACHINES, ARM_MACHINES = ("x86_64", "AMD64"), ("aarch64", "arm64")
VECTOR_FLAGS = ({"avx2", "fma"}, {"avx512f", "avx512bw", "avx512dq", "avx512vl"})
"""x86 /proc/cpuinfo flag sets each of which gives the kernels a vector bfloat16 path."""
NEON_FLAG = "asimd"
"""The aarch64 /proc/cpuinfo feature of the NEON path (the dotprod one, ``asimddp``, adds nothing to bfloat16)."""


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature names from ``cpuinfo`` (its ``flags`` line on x86, ``Features`` on aarch64)."""
    try:
        with open(cpuinfo) as f:
            return next((set(ln.split(":", 1)[1].split()) for ln in f
                         if ln.startswith(("flags", "Features"))), set())
    except OSError:
        return set()


def vector_bf16_path(machine: str) -> str:
    """How the vector bfloat16 path of ``machine`` is named in a reason."""
    return "NEON" if machine in ARM_MACHINES else "AVX2+FMA or AVX-512"


def cpu_bf16_problem() -> str | None:
    """Why this CPU has no fast bfloat16 path of ours (None: it has one)."""
    machine = platform.machine()
    if machine not in X86_MACHINES + ARM_MACHINES:
        return f"the C kernels have no vector bfloat16 path for {machine}"
    if requested_isa() == "scalar":
        return "SPECULANT_CPU_ISA=scalar turns the vector paths off"
    flags = cpu_flags()
    if machine in ARM_MACHINES:
        return None if NEON_FLAG in flags else "this CPU has no NEON (asimd), which the bfloat16 kernels need"
    if not any(wanted <= flags for wanted in VECTOR_FLAGS):
        return "this CPU has neither AVX2 with FMA nor AVX-512, which the bfloat16 kernels need"
    return None


def checkpoint_dtype(path: str, gguf_file: str | None) -> str | None:
    """'gguf', the dtype named in the checkpoint's config.json, or None where unknown."""
    p = Path(path)
    if gguf_file or p.suffix == ".gguf":
        return "gguf"
    try:
        config = json.loads((p / "config.json").read_text())
    except (OSError, ValueError):
        return None
    dtype = config.get("torch_dtype") or config.get("dtype")
    return dtype if isinstance(dtype, str) else None


def choose_dtype(path: str, gguf_file: str | None, device: str) -> tuple[str, str]:
    """(the dtype "auto" resolves to, why) for the checkpoint at ``path`` on ``device``."""
    stored = checkpoint_dtype(path, gguf_file)
    if stored not in ("bfloat16", "gguf"):
        what = "its dtype is unknown" if stored is None else f"it is stored in {stored}"
        return "float32", f"float32: the checkpoint does not allow bfloat16 ({what})"
    source = "a GGUF checkpoint" if stored == "gguf" else "a bfloat16 checkpoint"
    if device == "cuda":
        return "bfloat16", f"bfloat16: {source} on CUDA"
    problem = cpu_bf16_problem()
    if problem is not None:
        return "float32", f"float32: {problem}"
    path = vector_bf16_path(platform.machine())
    return "bfloat16", f"bfloat16: {source} on a CPU with a vector bfloat16 path ({path})"
