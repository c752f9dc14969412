"""Shared helpers of the speculative-decoding tests (tests/spec/).

- ``run``: generate through the engine with a step cap (a stuck scheduler fails
  the test instead of hanging it) and return outputs in prompt order.
- ``StepProbe``: records what the scheduler put in each step and how many
  target forwards the step ran.
- ``check_against``: the engine's greedy outputs against transformers
  ``generate()`` (near-tie aware, via ``tests/greedy_compare.py``) and against
  the same engine without speculation.
"""

from __future__ import annotations

from collections.abc import Sequence

from greedy_compare import HFGreedy, check_all_greedy
from speculant import LLM, SamplingParams


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
            decoding = sum(r.is_decoding for r in eng.scheduler.running)
            batch = schedule(*args, **kwargs)
            self.steps.append(dict(
                running=running,
                decoding=decoding,
                prefill=[p.num_new_tokens for p in batch.prefills],
                k=[d.num_spec_tokens for d in batch.decodes],
                preempted=len(batch.preempted),
                forwards=0,
                draft_forwards=0,
            ))
            return batch

        def probed_forward(*args, **kwargs):
            self.steps[-1]["forwards"] += 1
            return forward(*args, **kwargs)

        eng.scheduler.schedule = probed_schedule
        eng.runner.forward = probed_forward
        draft_runner = getattr(eng.spec.proposer, "runner", None)  # the draft model's own runner
        self.has_draft = draft_runner is not None
        if draft_runner is not None:
            draft_forward = draft_runner.forward

            def probed_draft_forward(*args, **kwargs):
                self.steps[-1]["draft_forwards"] += 1
                return draft_forward(*args, **kwargs)

            draft_runner.forward = probed_draft_forward

    @property
    def nonempty(self) -> list[dict]:
        return [s for s in self.steps if s["prefill"] or s["k"]]

    def check_invariants(self, k: int, chunked: bool = True) -> None:
        """Budget respected, 0 <= k_i <= k, one target forward per step. With
        chunking off, a preempted request recomputing prompt + output may exceed
        the budget, alone in its step (the scheduler's documented exception)."""
        for s in self.nonempty:
            cost = sum(s["prefill"]) + sum(1 + x for x in s["k"])
            lone_recompute = not chunked and len(s["prefill"]) == 1 and not s["k"]
            assert cost <= self.budget or lone_recompute, f"step spent {cost} tokens, budget {self.budget}: {s}"
            assert all(0 <= x <= k for x in s["k"]), s
            assert s["forwards"] == 1, f"a step must run the target exactly once: {s}"
            # a draft model runs once for the prefill chunks and the first proposal of every
            # speculating decode together, then once per further proposal, batched over decodes
            assert s["draft_forwards"] <= max(1, max(s["k"], default=0)), f"draft forwards not batched: {s}"
            if self.has_draft and (s["prefill"] or any(s["k"])):
                # the draft's cache follows this step's chunks in this step, not in a later pass
                assert s["draft_forwards"] >= 1, s

    @property
    def mixed_steps(self) -> int:
        """Steps where a decode speculated while a prefill chunk ran."""
        return sum(1 for s in self.steps if s["prefill"] and any(s["k"]))

    @property
    def spec_steps(self) -> int:
        return sum(1 for s in self.steps if any(s["k"]))


def token_ids(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def check_against(outputs, hf_refs: list[HFGreedy], baseline, what: str) -> None:
    """Greedy ``outputs`` equal HF ``generate()`` (near-tie aware, see
    greedy_compare.py) and the non-speculative engine's ``baseline`` outputs:
    same tokens, text and finish reason; where either side's comparison with
    HF stopped at a near-tie, tokens only up to there."""
    matches = check_all_greedy(token_ids(outputs), hf_refs, what)
    base_matches = check_all_greedy(token_ids(baseline), hf_refs, what + " (no-spec baseline)")
    for i, (o, b, m, mb) in enumerate(zip(outputs, baseline, matches, base_matches)):
        o, b = o.outputs[0], b.outputs[0]
        if m.near_tie_at is None and mb.near_tie_at is None:
            assert (o.token_ids, o.text, o.finish_reason, o.stop_reason) == (
                b.token_ids, b.text, b.finish_reason, b.stop_reason), f"{what} prompt {i}: differs from no-spec"
        else:
            limit = min(x for x in (m.near_tie_at, mb.near_tie_at) if x is not None)
            assert o.token_ids[:limit] == b.token_ids[:limit], f"{what} prompt {i}: differs from no-spec"
