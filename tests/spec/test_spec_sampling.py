"""Sampling under speculation: seeded requests are reproducible whatever else
shares their batch, and typical acceptance works end to end (greedy exact,
sampling valid, proposals accepted)."""

from __future__ import annotations

import pytest

from spec_helpers import StepProbe, check_against, run, token_ids
from speculant import LLM, SamplingParams
from tiny_models import random_prompts

K = 3
PROMPTS = random_prompts([7, 12, 5, 16], seed=4)


def spec(proposer: str, llama_dir, noisy_dir, scorer="mqa", acceptance="rejection", **extra) -> dict:
    if proposer == "ngram":
        base = {"proposer": "ngram", "proposer_options": {"min_n": 1, "max_n": 3}}
    elif proposer == "suffix":  # without its global cache: drafts depend on the request's own tokens only
        base = {"proposer": "suffix", "proposer_options": {"max_cached_requests": 0}}
    else:
        draft = llama_dir if proposer == "draft_self" else noisy_dir
        base = {"proposer": "draft_model", "proposer_options": {"model": str(draft)}}
    return {**base, "scorer": scorer, "acceptance": acceptance, "num_speculative_tokens": K, **extra}


SEEDED = SamplingParams(temperature=1.0, seed=7, max_tokens=16, ignore_eos=True)
OTHERS = [SamplingParams(temperature=0.9, seed=100, max_tokens=20, ignore_eos=True),
          SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
          SamplingParams(temperature=1.2, seed=101, max_tokens=18, ignore_eos=True)]


@pytest.mark.parametrize("proposer,scorer,acceptance", [
    ("draft_noisy", "mqa", "rejection"), ("ngram", "batch_expansion", "rejection"),
    ("suffix", "mqa", "rejection"), ("draft_self", "mqa", "typical")])
def test_seeded_sampling_independent_of_batch(proposer, scorer, acceptance, llama_dir, spec_noisy_draft_dir):
    """Request R (seed 7) alone, then behind three other requests (so it
    prefills while they decode and speculates next to them), then with a
    budget that splits its prompt into chunks: same tokens every time. The
    budgets leave every decode its full k (k trimmed differently would verify
    different proposals, a different but equally valid draw)."""
    cfg = spec(proposer, llama_dir, spec_noisy_draft_dir, scorer, acceptance)
    roomy = LLM(model=str(llama_dir), block_size=4, max_num_batched_tokens=256, max_num_seqs=4, speculative=cfg)
    alone = run(roomy, [PROMPTS[0]], SEEDED)[0].outputs[0].token_ids
    again = run(roomy, [PROMPTS[0]], SEEDED)[0].outputs[0].token_ids
    behind = run(roomy, PROMPTS[1:] + PROMPTS[:1], OTHERS + [SEEDED])[-1].outputs[0].token_ids

    # 4 decodes x (1 + k) = 16 tokens always fit; prompts get the 4 left over, in chunks
    chunky = LLM(model=str(llama_dir), block_size=4, max_num_batched_tokens=4 * (1 + K) + 4, max_num_seqs=4,
                 speculative=cfg)
    probe = StepProbe(chunky)
    chunked = run(chunky, PROMPTS[1:] + PROMPTS[:1], OTHERS + [SEEDED])[-1].outputs[0].token_ids
    assert probe.mixed_steps > 0

    assert len(alone) == 16
    assert alone == again == behind == chunked
    # a different seed gives a different continuation (the seed is really used)
    other_seed = SamplingParams(temperature=1.0, seed=8, max_tokens=16, ignore_eos=True)
    assert run(roomy, [PROMPTS[0]], other_seed)[0].outputs[0].token_ids != alone


@pytest.mark.parametrize("scorer", ["mqa", "batch_expansion"])
def test_self_draft_sampling_accepts_everything(scorer, llama_dir):
    """With the target as its own draft, q = p at every position, so rejection
    sampling keeps (nearly) every proposal: u * q(x) < p(x) fails only where the
    draft's and the target's fp32 probabilities differ by rounding. Misaligned
    draft probabilities (wrong position, unfiltered or differently filtered
    distribution, wrong temperature) would reject many."""
    llm = LLM(model=str(llama_dir), block_size=4, max_num_batched_tokens=16, max_num_seqs=4,
              speculative=spec("draft_self", llama_dir, None, scorer))
    params = [SamplingParams(temperature=1.0, seed=1, max_tokens=16, ignore_eos=True),
              SamplingParams(temperature=0.6, top_k=8, seed=2, max_tokens=16, ignore_eos=True),
              SamplingParams(temperature=1.3, top_p=0.8, seed=3, max_tokens=16, ignore_eos=True),
              SamplingParams(temperature=0.9, min_p=0.05, seed=4, max_tokens=16, ignore_eos=True)]
    outs = run(llm, PROMPTS, params)
    for o in outs:
        assert o.metrics["num_draft_tokens"] > 0
        assert o.metrics["num_accepted_tokens"] >= o.metrics["num_draft_tokens"] - 1, o.metrics


# --- typical acceptance --------------------------------------------------------

@pytest.fixture(scope="module")
def greedy_refs(hf_reference):
    ref = hf_reference("llama")
    return [ref.greedy(p, 12) for p in PROMPTS]


@pytest.fixture(scope="module")
def greedy_baseline(llama_dir):
    return run(LLM(model=str(llama_dir), block_size=4), PROMPTS,
               SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))


@pytest.mark.parametrize("proposer,scorer", [("draft_self", "batch_expansion"), ("draft_noisy", "mqa"),
                                             ("ngram", "mqa")])
def test_typical_greedy_equals_no_speculation(proposer, scorer, llama_dir, spec_noisy_draft_dir, greedy_refs,
                                              greedy_baseline):
    llm = LLM(model=str(llama_dir), block_size=4, max_num_batched_tokens=10, max_num_seqs=3,
              speculative=spec(proposer, llama_dir, spec_noisy_draft_dir, scorer, "typical"))
    outs = run(llm, PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    check_against(outs, greedy_refs, greedy_baseline, f"typical/{proposer}/{scorer}")
    if proposer == "draft_self":
        assert llm.get_metrics()["acceptance_rate"] == 1.0


@pytest.mark.parametrize("proposer", ["draft_self", "draft_noisy", "ngram", "suffix"])
def test_typical_sampling_valid_and_accepts(proposer, llama_dir, spec_noisy_draft_dir):
    llm = LLM(model=str(llama_dir), block_size=4, max_num_batched_tokens=32, max_num_seqs=4,
              speculative=spec(proposer, llama_dir, spec_noisy_draft_dir, "mqa", "typical",
                               acceptance_options={"posterior_threshold": 0.09, "posterior_alpha": 0.3}))
    params = [SamplingParams(temperature=t, seed=s, max_tokens=14, ignore_eos=True, logprobs=1)
              for t, s in ((1.0, 1), (0.7, 2), (1.3, 3), (1.0, 4))]
    outs = run(llm, PROMPTS, params)
    vocab = llm.engine.runner.vocab_size
    for o in outs:
        c = o.outputs[0]
        assert len(c.token_ids) == 14 and c.finish_reason == "length"
        assert all(0 <= t < vocab for t in c.token_ids)
        assert len(c.logprobs) == 14 and all(t in lp for t, lp in zip(c.token_ids, c.logprobs))
    m = llm.get_metrics()
    if proposer not in ("ngram", "suffix"):
        assert m["num_draft_tokens"] > 0 and m["num_accepted_tokens"] > 0
        assert 0 < m["acceptance_rate"] <= 1 and m["mean_accepted_length"] > 1
    if proposer == "draft_self":
        # the draft samples from the target's own distribution: typical tokens, mostly kept
        assert m["acceptance_rate"] > 0.5
    # seeded: the same again
    assert token_ids(run(llm, PROMPTS, params)) == token_ids(outs)
