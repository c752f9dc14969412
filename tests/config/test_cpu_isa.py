"""SPECULANT_CPU_ISA: a bad value is refused naming the variable, the value and the allowed ones; a
good one caps torch's own instruction set (set before torch loads) and the C kernels' dispatch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from speculant.config.cpu_isa import ENV, ISA_NAMES, TORCH_CAPS, requested_isa

PROBE = """
import json, os, sys
import speculant
assert "torch" not in sys.modules, "import speculant must not load torch"
import torch
from speculant.model.kernels.build import load_kernel
from speculant.model.kernels.abi import kernel_isa
lib = load_kernel()
print(json.dumps({"env": {k: os.environ.get(k) for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                                                           "MKL_ENABLE_INSTRUCTIONS")},
                  "aten": torch.backends.cpu.get_cpu_capability(), "kernel": None if lib is None else kernel_isa(lib)}))
"""


def probe(isa: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in TORCH_CAPS["avx2"]}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**env, ENV: isa}, capture_output=True, text=True,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("value", ["avx3", "AVX-2", "native"])
def test_a_bad_value_names_the_variable_the_value_and_the_choices(monkeypatch, value):
    monkeypatch.setenv(ENV, value)
    with pytest.raises(ValueError) as err:
        requested_isa()
    assert str(err.value) == (f"SPECULANT_CPU_ISA={value!r} is not an instruction set speculant knows; set it to one "
                              f"of {', '.join(ISA_NAMES)}, or unset it to use the best this CPU has")


@pytest.mark.parametrize("isa,aten", [("avx2", "AVX2"), ("scalar", "DEFAULT")])
def test_the_cap_reaches_torch_and_the_kernels(isa, aten):
    got = probe(isa)
    assert got["env"] == TORCH_CAPS[isa]
    assert got["aten"] == aten  # torch's own dispatch, read when it loaded
    assert got["kernel"] in (None, isa)  # None: no compiler here
