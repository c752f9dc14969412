"""How the ``triton`` attention backend is selected and refused, from its
capability flags alone (no GPU and no Triton needed): ``auto`` picks it on
CUDA where it can run, and the checker refuses the CPU, float64 and a missing
``triton`` package, each with the option, the value, the reason and the fix."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest

from speculant.config.compat import auto_attention_backend, config_problems, resolve_attention_backend_name
from speculant.config.models import EngineConfig
from speculant.model.attention.triton_backend import TritonAttentionBackend
from speculant.plugins.manager import get_registry

MISSING = "the `triton` package is not installed: `pip install triton`"


def model_config(**model) -> EngineConfig:
    return EngineConfig.model_validate({"model": {"path": "m", **model}})


@pytest.fixture
def without_triton(monkeypatch):
    caps = dataclasses.replace(TritonAttentionBackend.capabilities, unavailable=MISSING)
    monkeypatch.setattr(TritonAttentionBackend, "capabilities", caps)


@pytest.fixture
def with_triton(monkeypatch):
    """As where the package is installed (the flags are read, the backend is never built)."""
    caps = dataclasses.replace(TritonAttentionBackend.capabilities, unavailable=None)
    monkeypatch.setattr(TritonAttentionBackend, "capabilities", caps)


def test_flags():
    caps = TritonAttentionBackend.capabilities
    assert get_registry().get("attention_backend", "triton") is TritonAttentionBackend
    assert caps.devices == ("cuda",) and caps.multi_token_queries
    assert set(caps.dtypes) == {"float32", "bfloat16", "float16"}
    installed = importlib.util.find_spec("triton") is not None
    assert (caps.unavailable is None) == installed
    if not installed:
        assert caps.unavailable.startswith(MISSING)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_auto_picks_triton_on_cuda(dtype, with_triton):
    registry = get_registry()
    assert auto_attention_backend(registry, "cuda", dtype) == "triton"
    assert resolve_attention_backend_name(model_config(device="cuda", dtype=dtype), registry) == "triton"


def test_auto_passes_triton_over_where_it_cannot_run(without_triton):
    registry = get_registry()
    assert auto_attention_backend(registry, "cuda", "bfloat16") == "torch"
    assert resolve_attention_backend_name(model_config(device="cpu"), registry) == "cpu_kernel"


def test_auto_on_cuda_in_float64_is_the_reference():
    assert resolve_attention_backend_name(model_config(device="cuda", dtype="float64"), get_registry()) == "torch"


def test_cpu_is_refused(with_triton):
    assert config_problems(model_config(device="cpu", attention_backend="triton")) == [
        "model.attention_backend = 'triton' runs on cuda only, but model.device resolves to 'cpu': set "
        "model.device to one of those or choose another backend"]


def test_float64_is_refused(with_triton):
    assert config_problems(model_config(device="cuda", dtype="float64", attention_backend="triton")) == [
        "model.attention_backend = 'triton' computes float32, bfloat16, float16 only, but model.dtype = "
        "'float64': set model.dtype to one of those or choose another backend"]


def test_missing_triton_is_refused(without_triton):
    assert config_problems(model_config(device="cuda", attention_backend="triton")) == [
        f"model.attention_backend = 'triton' cannot run in this installation: {MISSING}"]
