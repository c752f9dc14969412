"""The CPU kernels' packed weights on transparent huge pages.

Why: a decode step streams every weight once, and on a 2-core CPU that
stream is the step. With 4 KiB pages the 270 MB of SmolLM2's bfloat16
weights span 66,000 pages: a TLB miss every 4 KiB, and the hardware
prefetchers stop at every page boundary. On 2 MiB pages the same stream
ran 12-25% faster (AMD EPYC, 2026-12-06: the model's 120 layer GEMVs 6.2 ->
5.0-5.5 ms, ``benchmarks/results/cpu_kernels_smollm2.json`` has the step).

How: after loading and packing, ``place_packed_weights`` copies every
``DotLinear``'s blocked weight into one arena whose start is 2 MiB aligned and
that is marked ``MADV_HUGEPAGE`` before its first touch, so the kernel backs
it with huge pages wherever ``/sys/kernel/mm/transparent_hugepage/enabled``
says ``always`` or ``madvise``. The bytes are the same, only their pages
change, so outputs do not. One arena (not one per weight) keeps the waste to
the last partly used huge page. ``SPECULANT_HUGE_PAGES=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from speculant.model.linear.dot_linear import DotLinear
from speculant.model.linear.merged import MergedSlice

HUGE_PAGE = 2 << 20  # bytes
ALIGN = 64  # bytes between weights in the arena: the kernels' vector loads
MADV_HUGEPAGE = 14
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@dataclass(frozen=True)
class HugePagePlacement:
    """What ``place_packed_weights`` did: bytes moved into the arena, or why nothing moved."""

    bytes_placed: int
    reason: str | None  # None when the weights are on the arena

    def describe(self) -> str:
        if self.reason is not None:
            return f"packed weights on normal pages: {self.reason}"
        return f"packed weights on transparent huge pages ({self.bytes_placed / 1e6:.0f} MB)"


def huge_pages_unavailable_reason() -> str | None:
    """Why the arena cannot ask for huge pages here, or ``None`` when it can."""
    if os.environ.get("SPECULANT_HUGE_PAGES", "1") == "0":
        return "disabled by SPECULANT_HUGE_PAGES=0"
    if not sys.platform.startswith("linux"):
        return f"transparent huge pages are a Linux feature (platform {sys.platform})"
    try:
        setting = THP_SETTING.read_text(encoding="utf-8")
    except OSError as exc:
        return f"{THP_SETTING} is not readable ({exc.strerror})"
    selected = setting[setting.find("[") + 1:setting.find("]")] if "[" in setting else setting.strip()
    if selected not in ("always", "madvise"):
        return f"{THP_SETTING} selects '{selected}' (needs 'always' or 'madvise')"
    return None


def _madvise() -> Any:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fn = getattr(libc, "madvise", None)
    if fn is not None:
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        fn.restype = ctypes.c_int
    return fn


def huge_page_arena(nbytes: int) -> tuple[torch.Tensor | None, str | None]:
    """A fresh ``[nbytes]`` uint8 CPU tensor starting on a 2 MiB boundary and advised for huge
    pages before anything touches it; ``(None, reason)`` where that cannot be had."""
    reason = huge_pages_unavailable_reason()
    if reason is not None:
        return None, reason
    madvise = _madvise()
    if madvise is None:
        return None, "libc has no madvise"
    raw = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)  # large: mapped, not yet touched
    offset = -raw.data_ptr() % HUGE_PAGE
    arena = raw[offset:offset + nbytes]
    length = -(-nbytes // 4096) * 4096
    if madvise(arena.data_ptr(), length, MADV_HUGEPAGE) != 0:
        return None, f"madvise(MADV_HUGEPAGE) failed: {os.strerror(ctypes.get_errno())}"
    return arena, None


def packed_dot_layers(model: nn.Module) -> list[DotLinear]:
    """Every ``DotLinear`` of ``model`` once, the merged GEMMs behind sibling slices included."""
    found = [m._shared.merged if isinstance(m, MergedSlice) else m for m in model.modules()]
    return list({id(m): m for m in found if isinstance(m, DotLinear)}.values())


def place_packed_weights(model: nn.Module) -> HugePagePlacement:
    """Move every ``DotLinear`` blocked weight of ``model`` (merged sibling projections' included)
    into one huge-page arena (see the module docstring). Call after packing and merging, before
    anything records weight addresses."""
    layers = [m for m in packed_dot_layers(model) if m.blocked_weight.device.type == "cpu"]
    weights: dict[int, torch.Tensor] = {}
    for layer in layers:
        weights.setdefault(layer.blocked_weight.data_ptr(), layer.blocked_weight)
    if not weights:
        return HugePagePlacement(0, "no packed bfloat16 weights (the dot-product kernel runs no layer)")
    sizes = {ptr: -(-w.numel() * w.element_size() // ALIGN) * ALIGN for ptr, w in weights.items()}
    arena, reason = huge_page_arena(sum(sizes.values()))
    if arena is None:
        return HugePagePlacement(0, reason)
    placed: dict[int, torch.Tensor] = {}
    offset = 0
    with torch.no_grad():
        for ptr, weight in weights.items():
            nbytes = weight.numel() * weight.element_size()
            view = arena[offset:offset + nbytes].view(weight.dtype).view(weight.shape)
            placed[ptr] = view.copy_(weight)
            offset += sizes[ptr]
        for layer in layers:
            layer.blocked_weight = placed[layer.blocked_weight.data_ptr()]
    return HugePagePlacement(offset, None)
