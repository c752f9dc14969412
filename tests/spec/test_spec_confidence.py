"""The draft model's ``confidence_threshold``: drafting stops after the first
proposal the draft is unsure of, the output stays exact, and the draft's KV
bookkeeping follows the shorter proposal runs."""

from __future__ import annotations

import pytest

from spec_helpers import StepProbe, run, token_ids
from speculant import LLM, SamplingParams
from speculant.config.models import ConfigError
from tiny_models import random_prompts

K = 3
PROMPTS = random_prompts([3, 9, 17, 6], seed=5)
# small chunks so prefill chunks share steps with speculating decodes
ENGINE = dict(block_size=4, max_num_batched_tokens=K + 3, max_num_seqs=3)


def spec(draft_dir, scorer: str, threshold: float) -> dict:
    return {"proposer": "draft_model", "scorer": scorer, "num_speculative_tokens": K,
            "proposer_options": {"model": str(draft_dir), "confidence_threshold": threshold}}


def greedy(n: int = 12) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


@pytest.fixture(scope="module")
def baseline(llama_dir):
    return token_ids(run(LLM(model=str(llama_dir), **ENGINE), PROMPTS, greedy()))


@pytest.mark.parametrize("scorer", ["mqa", "batch_expansion"])
def test_unsure_draft_proposes_one_token_and_stays_exact(scorer, llama_dir, spec_noisy_draft_dir, baseline):
    # a random tiny model never gives a token probability 0.99: every run stops after one proposal
    llm = LLM(model=str(llama_dir), speculative=spec(spec_noisy_draft_dir, scorer, 0.99), **ENGINE)
    probe = StepProbe(llm)
    assert token_ids(run(llm, PROMPTS, greedy())) == baseline
    probe.check_invariants(K)
    speculating = [s for s in probe.steps if any(s["k"])]
    assert speculating and all(s["draft_forwards"] == 1 for s in speculating)
    rows = sum(1 for s in speculating for k in s["k"] if k > 0)
    assert llm.get_metrics()["num_draft_tokens"] == rows


def test_self_draft_keeps_full_acceptance_after_short_runs(llama_dir, baseline):
    """The target as its own draft accepts every proposal, as long as the draft's
    cache holds exactly the tokens it was fed: after a one-token run that is the
    last token, not the accepted proposal (stale K/V there would break agreement)."""
    llm = LLM(model=str(llama_dir), speculative=spec(llama_dir, "mqa", 0.99), **ENGINE)
    assert token_ids(run(llm, PROMPTS, greedy())) == baseline
    m = llm.get_metrics()
    assert m["num_draft_tokens"] > 0 and m["acceptance_rate"] == 1.0


@pytest.mark.parametrize("scorer", ["mqa", "batch_expansion"])
def test_threshold_zero_drafts_k(scorer, llama_dir, spec_noisy_draft_dir, baseline):
    llm = LLM(model=str(llama_dir), speculative=spec(spec_noisy_draft_dir, scorer, 0.0), **ENGINE)
    probe = StepProbe(llm)
    assert token_ids(run(llm, PROMPTS, greedy())) == baseline
    assert any(s["draft_forwards"] == K for s in probe.steps)


def test_mixed_sampling_and_greedy_batch(llama_dir, spec_noisy_draft_dir, baseline):
    """Sampling rows need the draft distribution, greedy rows do not; with both in
    one batch and proposal runs of different lengths the greedy rows stay exact
    and the seeded sampling rows are reproducible."""
    params = [greedy(), SamplingParams(temperature=0.8, seed=3, max_tokens=12, ignore_eos=True)] * 2

    def once():
        llm = LLM(model=str(llama_dir), speculative=spec(spec_noisy_draft_dir, "mqa", 0.02), **ENGINE)
        return token_ids(run(llm, PROMPTS, params))

    first = once()
    assert [first[0], first[2]] == [baseline[0], baseline[2]]
    assert once() == first


@pytest.mark.parametrize("value", [-0.1, 1.0])
def test_out_of_range_rejected(value, llama_dir):
    with pytest.raises(ConfigError) as err:
        LLM(model=str(llama_dir), speculative=spec(llama_dir, "mqa", value))
    assert "confidence_threshold" in str(err.value)
