"""``SPECULANT_CPU_ISA``: cap the CPU instruction set of a whole run, ours and torch's.

``SPECULANT_CPU_ISA=scalar|avx2|avx512|avx512_vnni|avx512_bf16`` (aarch64 also
``neon``, ``neon_dotprod``) caps the C kernels' runtime dispatch
(``model/kernels/csrc/kernels.h``) and torch's own: ``ATEN_CPU_CAPABILITY``
(ATen's vectorised operators), ``ONEDNN_MAX_CPU_ISA`` (oneDNN's matmuls and
convolutions) and ``MKL_ENABLE_INSTRUCTIONS`` (MKL's BLAS), so an ``avx2`` run
uses AVX-512 nowhere. torch reads those three when it loads, so they are set
when ``speculant`` is imported (``speculant/__init__.py``), before anything of
ours imports torch. A program that imports torch itself before ``speculant``
must set ``SPECULANT_CPU_ISA`` (or the three variables) in the environment
before it starts; we warn when torch is already loaded. The cap is an upper
bound: on a CPU without the named path the best one under it runs.

No torch here: this module must be importable before torch.
"""

from __future__ import annotations

import os
import sys
import warnings

ENV = "SPECULANT_CPU_ISA"
ISA_NAMES = ("scalar", "avx2", "avx512", "avx512_vnni", "avx512_bf16", "neon", "neon_dotprod")
"""The accepted values, in the order of the C enum (``speculant_isa``): a value's index is its code."""

TORCH_CAPS: dict[str, dict[str, str]] = {
    "scalar": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
               "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    "avx512_vnni": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI",
                    "MKL_ENABLE_INSTRUCTIONS": "AVX512_E1"},
    "avx512_bf16": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
                    "MKL_ENABLE_INSTRUCTIONS": "AVX512_E1"},
    "neon": {}, "neon_dotprod": {},  # torch's aarch64 build picks no wider path by these variables
}
"""The torch variables each cap sets (MKL has no level of its own for bfloat16: the VNNI one)."""


def requested_isa() -> str | None:
    """The cap named by ``SPECULANT_CPU_ISA`` (None when unset or empty); ``ValueError`` for another value."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    if value.lower() not in ISA_NAMES:
        raise ValueError(f"{ENV}={value!r} is not an instruction set speculant knows; set it to one of "
                         f"{', '.join(ISA_NAMES)}, or unset it to use the best this CPU has")
    return value.lower()


def cap_torch_isa() -> str | None:
    """Set torch's three variables for ``SPECULANT_CPU_ISA`` (overriding theirs); returns the cap.
    Warns when torch was imported before they held these values: its operators may then run wider
    instructions."""
    name = requested_isa()
    if name is None:
        return None
    already = all(os.environ.get(key) == value for key, value in TORCH_CAPS[name].items())
    os.environ.update(TORCH_CAPS[name])
    if "torch" in sys.modules and not already:  # set before the process started: torch saw them
        warnings.warn(f"{ENV}={name}: torch was imported before speculant, so its own instruction set may not "
                      f"be capped; set {ENV} in the environment before the program starts, or import speculant "
                      "before torch", RuntimeWarning, stacklevel=2)
    return name
