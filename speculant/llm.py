"""The offline API: ``LLM(model=...).generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tqdm.auto import tqdm

from speculant.config.compat import parse_config
from speculant.config.models import ConfigError, EngineConfig, read_config
from speculant.config.sampling_params import SamplingParams
from speculant.engine.llm_engine import LLMEngine
from speculant.engine.loop import EngineLoop, Mailbox, RequestAborted
from speculant.engine.request import RequestOutput

# keyword -> (section, key) for the flat overrides LLM(...) accepts, vLLM style
_FLAT_KEYS = {
    "tokenizer": ("model", "tokenizer"), "dtype": ("model", "dtype"), "device": ("model", "device"),
    "max_model_len": ("model", "max_model_len"), "attention_backend": ("model", "attention_backend"),
    "linear_backend": ("model", "linear_backend"), "seed": ("model", "seed"),
    "load_format": ("model", "load_format"), "cuda_graphs": ("model", "cuda_graphs"),
    "fast_forward": ("model", "fast_forward"), "quantization": ("model", "quantization"),
    "linear_dense_max_rows": ("model", "linear_dense_max_rows"),
    "block_size": ("cache", "block_size"), "num_blocks": ("cache", "num_blocks"),
    "kv_cache_memory_gb": ("cache", "memory_gb"), "enable_prefix_caching": ("cache", "enable_prefix_caching"),
    "max_num_batched_tokens": ("scheduler", "max_num_batched_tokens"),
    "max_num_seqs": ("scheduler", "max_num_seqs"),
    "enable_chunked_prefill": ("scheduler", "enable_chunked_prefill"),
}
_SECTIONS = ("model", "cache", "scheduler", "speculative")
KWARGS_SOURCE = "LLM(...) arguments"

Prompt = str | list[int]


def config_from_kwargs(model: str | None, overrides: dict[str, Any]) -> EngineConfig:
    data: dict[str, dict[str, Any]] = {s: {} for s in _SECTIONS}
    if model is not None:
        data["model"]["path"] = model
    for key, value in overrides.items():
        if key in _SECTIONS:
            if not isinstance(value, dict):
                raise TypeError(f"LLM({key}=...) must be a dict of {key} settings, got {type(value).__name__}")
            data[key].update(value)
        elif key in _FLAT_KEYS:
            section, name = _FLAT_KEYS[key]
            data[section][name] = value
        else:
            allowed = ", ".join(sorted([*_FLAT_KEYS, *_SECTIONS]))
            raise TypeError(f"LLM() got an unknown keyword {key!r}; allowed: {allowed}")
    return parse_config(data, KWARGS_SOURCE)  # the engine runs the plugin checks


def prompt_list(prompts: Any) -> list[Prompt]:
    """``generate``'s prompts as a list: one str, one list/tuple of token ids
    (its first item an integer), or a list/tuple of those. Mappings, sets,
    bytes and non-iterables are refused with TypeError."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (Mapping, set, frozenset, bytes, bytearray)) or not isinstance(prompts, Iterable):
        hint = ("pass the prompt text itself, not a dict" if isinstance(prompts, Mapping)
                else "pass a str, a list of token ids, or a list of those")
        raise TypeError(f"prompts must be a str, a list of int token ids, or a list/tuple of those, got "
                        f"{type(prompts).__name__}: {hint}")
    if isinstance(prompts, (list, tuple)) and prompts and not isinstance(prompts[0], (str, list, tuple)) \
            and hasattr(type(prompts[0]), "__index__"):
        # one prompt of token ids; the engine checks every item
        return [prompts if isinstance(prompts, list) else list(prompts)]
    return list(prompts)


class LLM:
    """Load a model and generate from batches of prompts.

    ``LLM(model="path/to/hf-dir", max_num_seqs=32, speculative={...})``,
    ``LLM.from_config("file.toml")`` or ``LLM.from_dict({...})``. The config is
    checked once, by the engine, before anything loads.
    """

    def __init__(self, model: str | None = None, *, config: EngineConfig | None = None, **overrides: Any) -> None:
        source = "<config>"
        if config is None:
            if model is None and "model" not in overrides:
                raise ConfigError(KWARGS_SOURCE, ["model: pass LLM(model='path/to/model-dir') or config="])
            config, source = config_from_kwargs(model, overrides), KWARGS_SOURCE
        elif model is not None or overrides:
            raise TypeError("pass either config= or model=/overrides to LLM(), not both")
        self._start(config, source)

    def _start(self, config: EngineConfig, source: str) -> None:
        self.config = config
        self.engine = LLMEngine(config, source=source)
        self.engine.stream_text = False  # generate() returns finished outputs only
        # stepped by the thread waiting for outputs: the one that loaded the model, in most programs
        self.loop = EngineLoop(self.engine)
        self.tokenizer = self.engine.tokenizer

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> LLM:
        """From a config mapping (sections ``model``, ``cache``, ``scheduler``,
        ``speculative``); errors name ``source``."""
        llm = cls.__new__(cls)
        llm._start(parse_config(data, source), source)
        return llm

    @classmethod
    def from_config(cls, path: str, overrides: list[str] | None = None) -> LLM:
        """From a TOML or YAML file, with ``--set`` style ``key.path=value`` overrides."""
        return cls.from_dict(read_config(path, overrides), str(path))

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order."""
        prompts = prompt_list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = [sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams) \
            else list(sampling_params)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams; "
                             "pass one SamplingParams or one per prompt")
        box = Mailbox(self.loop)
        ids = self._add_all(prompts, params, box)
        results: dict[str, RequestOutput] = {}
        aborted: list[str] = []
        bar = tqdm(total=len(ids), desc="generating", unit="req", disable=not use_tqdm or len(ids) < 2)
        self.last_run_seconds = 0.0
        start = time.perf_counter()
        try:
            # a request the engine had to drop comes back with finish_reason "error" and .error
            while len(results) + len(aborted) < len(ids):
                for rid, item in box.take():
                    if isinstance(item, RequestAborted):
                        aborted.append(rid)
                        continue
                    if isinstance(item, BaseException):  # the engine's step raised (StepFailed)
                        raise item
                    results[rid] = item
                    bar.update(1)
        except BaseException:
            # any exception (KeyboardInterrupt included): leave nothing of this call queued,
            # so the engine serves the next call
            for rid in ids:
                if rid not in results:
                    self.loop.abort(rid)
            raise
        finally:
            bar.close()
        self.last_run_seconds = time.perf_counter() - start
        if aborted:
            raise RuntimeError(f"requests {aborted[:5]} of this generate() call were aborted before they "
                               "finished (abort_request from elsewhere); their outputs are lost")
        return [results[i] for i in ids]

    def _add_all(self, prompts: list[Prompt], params: list[SamplingParams], box: Mailbox) -> list[str]:
        """Queue every prompt, or none: a bad prompt aborts the ones queued before it."""
        ids: list[str] = []
        try:
            for prompt, p in zip(prompts, params):
                ids.append(self.loop.submit(prompt, p, box))
        except (ValueError, TypeError) as exc:
            for rid in ids:
                self.loop.abort(rid)
            raise type(exc)(f"prompt {len(ids)}: {exc}") from exc
        return ids

    def chat(self, messages, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, chat_template: str | None = None,
             add_generation_prompt: bool = True) -> list[RequestOutput]:
        """Generate the assistant's reply to one conversation (a list of
        ``{"role", "content"}`` dicts) or to each of a list of conversations,
        rendered with the model's chat template (or ``chat_template``)."""
        from speculant.chat import as_conversations, render

        conversations, _ = as_conversations(messages)
        prompts = [render(self.tokenizer, c, chat_template, add_generation_prompt) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def get_metrics(self) -> dict:
        return self.engine.get_metrics()
