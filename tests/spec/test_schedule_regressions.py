"""Explicit schedules found by tests/spec/test_schedule_properties.py, kept as
plain tests (same checks: tests/spec/schedule_check.py).

Issue 13 item 4 (fixed): a preempted request re-prefilled prompt + output,
and the terminal chunk sampled its next token plainly, while run alone the
request would have verified k proposals at that output position. A seeded
sampled request that speculates therefore changed its continuation from the
preemption on (it was preempted with 8 output tokens; the outputs differed
from token 8 or 9 on), with ``draft_model`` and with ``ngram`` (whenever the
n-gram lookup had a match there). Now the recompute stops one token short and
the request resumes as a decode with the same step boundaries
(``Request.prefill_end``); greedy requests, and seeded sampling without
speculation, were never affected.
"""

from __future__ import annotations

import pytest

from schedule_check import Req, ScheduleChecker, Setup
from speculant import SamplingParams
from tiny_models import random_prompts


@pytest.fixture(scope="module")
def checker(llama_dir, spec_noisy_draft_dir) -> ScheduleChecker:
    c = ScheduleChecker(llama_dir, spec_noisy_draft_dir)
    c.compare_preempted_spec_sampling = True  # these tests are about exactly that comparison
    return c


def _two_requests(prompts: list[list[int]], temperature: float) -> list[Req]:
    return [Req(p, SamplingParams(temperature=temperature, seed=1 + i, max_tokens=24, ignore_eos=True))
            for i, p in enumerate(prompts)]


# Two 6-token prompts, 24 tokens each; a pool of 8 blocks of 4 (one max_model_len = 32
# sequence) cannot hold both, so the later arrival (r1) is preempted after 8 output tokens.
PREEMPTING = dict(k=3, block_size=4, num_blocks=8, max_model_len=32, max_num_batched_tokens=64, max_num_seqs=2)
DRAFT_PROMPTS = random_prompts([6, 6], seed=5)
NGRAM_PROMPTS = [[64, 56] * 3, [241, 194] * 3]  # periodic, so the n-gram lookup matches


def _check_preempted(checker, setup, reqs):
    trace = checker.check(setup, reqs)
    # r1 is preempted while speculating, with output tokens (8 before the fix; with the
    # recompute now stopping one token short it is preempted at 9 output tokens, twice with the draft)
    at = trace.preempted_at
    assert set(at) == {"r1"} and all(n >= 8 for n in at["r1"]), f"the schedule no longer preempts as intended: {at}"
    assert not trace.trimmed


def test_preempted_seeded_sampling_draft_model(checker):
    _check_preempted(checker, Setup(proposer="draft_model", **PREEMPTING), _two_requests(DRAFT_PROMPTS, 1.0))


def test_preempted_seeded_sampling_ngram(checker):
    _check_preempted(checker, Setup(proposer="ngram", **PREEMPTING), _two_requests(NGRAM_PROMPTS, 1.0))


@pytest.mark.parametrize("proposer,temperature,prompts", [
    ("draft_model", 0.0, DRAFT_PROMPTS), ("ngram", 0.0, NGRAM_PROMPTS), (None, 1.0, DRAFT_PROMPTS)],
    ids=["draft-greedy", "ngram-greedy", "nospec-sampled"])
def test_same_preemption_leaves_other_requests_unchanged(checker, proposer, temperature, prompts):
    """Controls for the two tests above: the same schedule with greedy requests,
    or with seeded sampling and no speculation, matches the solo runs."""
    setup = Setup(proposer=proposer, **{**PREEMPTING, "k": PREEMPTING["k"] if proposer else 0})
    trace = checker.check(setup, _two_requests(prompts, temperature))
    assert trace.preempted, "the schedule no longer preempts"
