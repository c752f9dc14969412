"""Speculant: speculative decoding with chunked prefill for Hugging Face causal LMs."""

from speculant.config.cpu_isa import cap_torch_isa

cap_torch_isa()  # before anything imports torch: SPECULANT_CPU_ISA caps torch's instruction set too

from speculant.config.sampling_params import SamplingParams  # noqa: E402
from speculant.interfaces.catalog import LoadedCatalog, install_default_plugins  # noqa: E402
from speculant.version import __version__  # noqa: E402

__all__ = ["LLM", "LLMEngine", "SamplingParams", "RequestOutput", "EngineConfig", "__version__"]


def _load_plugins() -> LoadedCatalog:
    """The plugin layer's loaded plugins: config checks and the engine, which sit below
    ``speculant.plugins``, reach it only through this loader (``interfaces.catalog``)."""
    from speculant.plugins.manager import load_plugins

    return load_plugins()


install_default_plugins(_load_plugins)


def __getattr__(name: str):  # lazy: importing torch/transformers only when needed
    if name == "LLM":
        from speculant.llm import LLM
        return LLM
    if name == "LLMEngine":
        from speculant.engine.llm_engine import LLMEngine
        return LLMEngine
    if name == "RequestOutput":
        from speculant.engine.request import RequestOutput
        return RequestOutput
    if name == "EngineConfig":
        from speculant.config.models import EngineConfig
        return EngineConfig
    raise AttributeError(name)
