"""Run the ``triton`` attention backend on the CPU, for tests: its kernels
under Triton's interpreter and its capability flags widened to the CPU.

Triton decides when a function is decorated whether it is compiled or
interpreted, so ``interpreted_kernels()`` loads a second copy of
``triton_kernels.py`` with ``TRITON_INTERPRET=1`` set only while it executes
(Triton itself is imported before, so its own library stays compiled), and
``use_interpreted_kernels()`` points the launcher at that copy. Nothing else
in the process changes: a GPU run of the suite still gets compiled kernels
everywhere else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import speculant.model.attention

KERNELS_FILE = Path(speculant.model.attention.__file__).parent / "triton_kernels.py"


@functools.cache
def _load_interpreted() -> ModuleType:
    spec = importlib.util.spec_from_file_location("speculant_tests_interpreted_triton_kernels", KERNELS_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        spec.loader.exec_module(module)
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before
    assert module.INTERPRETED
    return module


def interpreted_kernels() -> ModuleType:
    """An interpreted copy of ``triton_kernels``; skips the calling test module
    when Triton is not installed."""
    pytest.importorskip("triton", reason="the `triton` package is not installed (the `test` extra brings it on "
                                         "Linux): the Triton attention backend's tests cannot run")
    return _load_interpreted()


@contextlib.contextmanager
def use_interpreted_kernels(cpu_device: bool = False) -> Iterator[ModuleType]:
    """Within: the launcher runs the interpreted kernels (CPU tensors), and with
    ``cpu_device`` the ``triton`` backend lists ``cpu`` among its devices, so
    ``attention_backend = "triton"`` passes the checker on the CPU."""
    from speculant.model.attention import triton_launch
    from speculant.model.attention.triton_backend import TritonAttentionBackend

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(triton_launch, "kernels", interpreted_kernels())
        if cpu_device:
            caps = TritonAttentionBackend.capabilities
            widened = dataclasses.replace(caps, devices=(*caps.devices, "cpu"))
            mp.setattr(TritonAttentionBackend, "capabilities", widened)
        yield triton_launch
