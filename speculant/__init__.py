"""Speculant: speculative decoding with chunked prefill for Hugging Face causal LMs."""

from speculant.core.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "SamplingParams", "RequestOutput", "EngineConfig", "__version__"]
__version__ = "0.1.0"


def __getattr__(name: str):  # lazy: importing torch/transformers only when needed
    if name == "LLM":
        from speculant.llm import LLM
        return LLM
    if name == "LLMEngine":
        from speculant.core.engine import LLMEngine
        return LLMEngine
    if name == "RequestOutput":
        from speculant.core.request import RequestOutput
        return RequestOutput
    if name == "EngineConfig":
        from speculant.core.config import EngineConfig
        return EngineConfig
    raise AttributeError(name)
