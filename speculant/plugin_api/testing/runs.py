"""Engine runs for the conformance kit: a plugin class registered for the
length of a check, the schedules every check walks, and runs that return
each request's token ids.

A schedule is a set of engine settings that changes how requests are cut
into steps and never what they emit: whole prompts in one step, prefill cut
into chunks of a few tokens, and a KV pool small enough that requests are
preempted and recomputed. Aborts are checked by ``run_with_abort``.
``check_sampled`` compares sampled output with the exact distribution.
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from speculant.engine.loop import EngineLoop, Mailbox
from speculant.interfaces import PLUGIN_KINDS, Kind, SamplingParams
from speculant.llm import LLM
from speculant.plugin_api.testing.stats import chi_square_p, marginals, total_variation
from speculant.plugin_api.testing.tiny_model import SMALL_VOCAB, TinyModels
from speculant.plugins import hookimpl
from speculant.plugins.manager import load_plugins, register_plugin, unregister_plugin

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
NUM_SAMPLES = 600
SAMPLED_TOKENS = 3
P_MIN = 1e-3


class ConformanceError(AssertionError):
    """A plugin failed a check of the kit; the message names the check, the
    schedule and the request, and what was expected."""


@dataclass(frozen=True)
class Schedule:
    name: str
    settings: dict[str, Any]
    chunked: bool = False  # cuts prompts: skipped for a plugin that does not support chunked prefill


BASE_SETTINGS: dict[str, Any] = dict(block_size=4, max_model_len=96, max_num_seqs=8)
SCHEDULES = (
    Schedule("whole prompts", dict(max_num_batched_tokens=96, enable_chunked_prefill=False)),
    Schedule("chunked prefill", dict(max_num_batched_tokens=9, max_num_seqs=4), chunked=True),
    Schedule("preemption", dict(max_num_batched_tokens=96, enable_chunked_prefill=False, max_model_len=48,
                                num_blocks=14)),
)


def prompts(lengths: Sequence[int], vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Token-id prompts of the given lengths (ids 2.. : no special tokens)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab_size, (n,), generator=gen).tolist() for n in lengths]


@contextmanager
def registered(kind: Kind, cls: type) -> Iterator[str]:
    """``cls`` registered as a ``kind`` plugin of this process while the block
    runs (nothing to do when the same class is registered already, e.g. by
    its package's entry point); yields its name."""
    spec = PLUGIN_KINDS[kind]
    name = getattr(cls, "name", cls.__name__)
    loaded = load_plugins()
    if name in loaded.registry.names(kind):
        if loaded.registry.get(kind, name) is not cls:
            raise ConformanceError(f"another {spec.label} is registered as {name!r} "
                                   f"({loaded.registry.get(kind, name).__qualname__}): give the class under test "
                                   f"another name or uninstall the other plugin")
        yield name
        return
    plugin = types.ModuleType(f"speculant_conformance_{kind}_{name}")

    def register(register: Any) -> None:
        register(cls)

    setattr(plugin, spec.hook, hookimpl(register))
    source = f"conformance-kit-{kind}-{name}"
    register_plugin(plugin, source)
    try:
        yield name
    finally:
        unregister_plugin(source)


def engine(model_dir: Path, speculative: dict[str, Any] | None, settings: dict[str, Any]) -> LLM:
    args = {**BASE_SETTINGS, **settings}
    if speculative is not None:
        args["speculative"] = speculative
    return LLM(model=str(model_dir), **args)


def token_ids(llm: LLM, prompt_ids: Sequence[list[int]], params: SamplingParams | Sequence[SamplingParams]
              ) -> list[list[int]]:
    outs = llm.generate(list(prompt_ids), params, use_tqdm=False)
    for o in outs:
        if o.error is not None:
            raise ConformanceError(f"request {o.request_id!r} failed: {o.error}")
    return [list(o.outputs[0].token_ids) for o in outs]


class _Counter:
    """A loop sink that only counts the outputs it is handed."""

    def __init__(self) -> None:
        self.outputs = 0

    def put(self, request_id: str, item: object) -> None:
        self.outputs += 1


def run_with_abort(llm: LLM, prompt_ids: Sequence[list[int]], params: SamplingParams,
                   abort_index: int, after_outputs: int) -> dict[int, list[int]]:
    """Every request but ``abort_index``'s, which is aborted once it has streamed
    ``after_outputs`` outputs (through the engine loop, stepping in this
    thread): prompt index -> its token ids."""
    loop = EngineLoop(llm.engine, id_prefix="kit")
    box, victim = Mailbox(loop), _Counter()
    ids = [loop.submit(list(p), params, victim if i == abort_index else box) for i, p in enumerate(prompt_ids)]
    loop.wait(lambda: victim.outputs >= after_outputs)
    loop.abort(ids[abort_index])
    done: dict[str, list[int]] = {}
    while len(done) < len(ids) - 1:
        for request_id, item in box.take():
            if isinstance(item, BaseException) or item.error is not None:
                why = item if isinstance(item, BaseException) else item.error
                raise ConformanceError(f"request {request_id!r} failed: {why}")
            done[request_id] = list(item.outputs[0].token_ids)
    return {i: done[rid] for i, rid in enumerate(ids) if i != abort_index}


def first_difference(got: list[int], want: list[int]) -> str:
    i = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"first differs at output token {i}: got {got[i:i + 6]}, expected {want[i:i + 6]}"


def check_same(got: dict[int, list[int]] | list[list[int]], want: list[list[int]], what: str) -> None:
    """Raise ``ConformanceError`` at the first prompt whose tokens differ: '<what> (prompt i): where'."""
    pairs = got.items() if isinstance(got, dict) else enumerate(got)
    for i, g in pairs:
        if g != want[i]:
            raise ConformanceError(f"{what} (prompt {i}): {first_difference(g, want[i])}")


def check_sampled(spec: dict[str, Any], models: TinyModels, what: str) -> tuple[list[float], list[float]]:
    """Sampled output against the exact marginal, position by position: the
    chi-square p-values and the total variations (raises when a p <= P_MIN)."""
    prompt = torch.randperm(SMALL_VOCAB, generator=torch.Generator().manual_seed(0)).tolist()
    prompt = prompt + prompt[:8]  # a repeat, so the n-gram proposer has something to propose
    params = [SamplingParams(temperature=1.0, max_tokens=SAMPLED_TOKENS, ignore_eos=True, seed=s)
              for s in range(NUM_SAMPLES)]
    llm = engine(models.small, spec, dict(max_num_batched_tokens=512, max_num_seqs=64))
    tokens = torch.tensor(token_ids(llm, [prompt] * NUM_SAMPLES, params))  # [N, SAMPLED_TOKENS]
    expected = marginals(models.small, prompt, params[0], SAMPLED_TOKENS, SMALL_VOCAB)
    p_values, distances = [], []
    for j in range(SAMPLED_TOKENS):
        counts = torch.bincount(tokens[:, j], minlength=SMALL_VOCAB)
        p, tv = chi_square_p(counts, expected[j]), total_variation(counts, expected[j])
        if p <= P_MIN:
            raise ConformanceError(
                f"sampled output token {j} with {what} does not follow the target's distribution (chi-square "
                f"p = {p:.2e} <= {P_MIN}, total variation {tv:.3f} over {NUM_SAMPLES} samples); observed "
                f"{(counts / NUM_SAMPLES).tolist()}, expected {expected[j].tolist()}")
        p_values.append(p)
        distances.append(tv)
    return p_values, distances
