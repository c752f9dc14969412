"""Shared helpers of the speculative-decoding tests (tests/spec/).

- ``run``: generate through the engine with a step cap (a stuck scheduler fails
  the test instead of hanging it) and return outputs in prompt order.
- ``StepProbe``: records what the scheduler put in each step and how many
  target forwards the step ran.
- ``HFReference``: transformers ``generate()`` greedy continuations and exact
  log-softmax of the target, plus the fp32 near-tie-aware comparison from
  DESIGN.md (at the first differing token the two tokens' logits, computed in
  float64, must be within a tolerance of the logit scale; comparison stops there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from transformers import AutoModelForCausalLM

from speculant import LLM, SamplingParams

NEAR_TIE_REL = 2e-4  # a near-tie: two logits within this fraction of the largest |logit|


def run(llm: LLM, prompts: Sequence[list[int]], params: SamplingParams | Sequence[SamplingParams],
        max_steps: int = 4000):
    """Like ``llm.generate`` but fails instead of looping forever."""
    if isinstance(params, SamplingParams):
        params = [params] * len(prompts)
    eng = llm.engine
    ids = [eng.add_request(None, list(p), sp) for p, sp in zip(prompts, params)]
    results = {}
    steps = 0
    while eng.has_unfinished_requests():
        steps += 1
        assert steps <= max_steps, f"engine still has unfinished requests after {max_steps} steps"
        for out in eng.step():
            if out.finished:
                results[out.request_id] = out
    return [results[i] for i in ids]


class StepProbe:
    """Wraps the engine's scheduler and target runner of one LLM to record,
    per step: running requests before scheduling, prefill chunk sizes,
    decode k's, preemptions and target forwards."""

    def __init__(self, llm: LLM) -> None:
        eng = llm.engine
        self.budget = eng.config.scheduler.max_num_batched_tokens
        self.steps: list[dict] = []
        schedule, forward = eng.scheduler.schedule, eng.runner.forward

        def probed_schedule(*args, **kwargs):
            running = len(eng.scheduler.running)
            batch = schedule(*args, **kwargs)
            self.steps.append(dict(
                running=running,
                prefill=[p.num_new_tokens for p in batch.prefills],
                k=[d.num_spec_tokens for d in batch.decodes],
                preempted=len(batch.preempted),
                forwards=0,
            ))
            return batch

        def probed_forward(*args, **kwargs):
            self.steps[-1]["forwards"] += 1
            return forward(*args, **kwargs)

        eng.scheduler.schedule = probed_schedule
        eng.runner.forward = probed_forward

    @property
    def nonempty(self) -> list[dict]:
        return [s for s in self.steps if s["prefill"] or s["k"]]

    def check_invariants(self, k: int) -> None:
        for s in self.nonempty:
            cost = sum(s["prefill"]) + sum(1 + x for x in s["k"])
            assert cost <= self.budget, f"step spent {cost} tokens, budget {self.budget}: {s}"
            assert all(0 <= x <= k for x in s["k"]), s
            assert s["forwards"] == 1, f"a step must run the target exactly once: {s}"

    @property
    def mixed_steps(self) -> int:
        """Steps where a decode speculated while a prefill chunk ran."""
        return sum(1 for s in self.steps if s["prefill"] and any(s["k"]))

    @property
    def spec_steps(self) -> int:
        return sum(1 for s in self.steps if any(s["k"]))


class HFReference:
    """transformers' own view of one model directory."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = Path(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).eval()
        self._model64 = None
        self._cache: dict[tuple, list[int]] = {}

    @property
    def model64(self):
        if self._model64 is None:
            self._model64 = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float64).eval()
        return self._model64

    @torch.no_grad()
    def greedy(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        """``generate()`` greedy continuation (stops at the model's EOS, which it keeps)."""
        key = (tuple(prompt), max_new_tokens)
        if key not in self._cache:
            gen = self.model.generation_config
            out = self.model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                                      pad_token_id=gen.pad_token_id if gen.pad_token_id is not None else 0)
            self._cache[key] = out[0, len(prompt):].tolist()
        return self._cache[key]

    @torch.no_grad()
    def logits(self, tokens: list[int], fp64: bool = False) -> torch.Tensor:  # [len(tokens), V]
        model = self.model64 if fp64 else self.model
        return model(torch.tensor([tokens])).logits[0].double()

    def log_softmax(self, tokens: list[int]) -> torch.Tensor:  # [len(tokens), V] float64
        return self.logits(tokens, fp64=True).log_softmax(-1)

    def assert_greedy_equal(self, prompt: list[int], got: list[int], ref: list[int], label: str = "") -> None:
        """``got == ref`` token for token, except that at a near-tie (see module
        docstring) the comparison of that output stops."""
        for j, (a, b) in enumerate(zip(got, ref)):
            if a == b:
                continue
            logits = self.logits(list(prompt) + list(ref[:j]), fp64=True)[-1]
            gap = float((logits[a] - logits[b]).abs())
            scale = float(logits.abs().max())
            assert gap <= NEAR_TIE_REL * scale, (
                f"{label}: token {j} differs: got {a}, expected {b}; their logits differ by {gap:.3g} "
                f"(scale {scale:.3g}), not a near-tie\n got: {got}\nwant: {ref}")
            return  # a genuine near-tie: the rest of this output may legitimately diverge
        assert len(got) == len(ref), f"{label}: lengths differ\n got: {got}\nwant: {ref}"


def same_tokens(outputs_a, outputs_b) -> bool:
    return [o.outputs[0].token_ids for o in outputs_a] == [o.outputs[0].token_ids for o in outputs_b]
