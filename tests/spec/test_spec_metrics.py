"""Speculation metrics (per request on RequestOutput.metrics and engine-wide via
LLM.get_metrics()), logprobs under speculation, and disable_by_batch_size."""

from __future__ import annotations

import math

import pytest

from spec_helpers import StepProbe, check_against, run
from speculant import LLM, SamplingParams
from tiny_models import random_prompts

K = 3
PROMPTS = random_prompts([6, 11, 4, 9], seed=17)
SPEC_KEYS = {"num_steps", "num_draft_tokens", "num_accepted_tokens", "acceptance_rate", "mean_accepted_length",
             "acceptance_per_position", "num_preemptions"}


def self_draft(llama_dir, scorer="mqa", **extra) -> dict:
    return {"proposer": "draft_model", "proposer_options": {"model": str(llama_dir)}, "scorer": scorer,
            "num_speculative_tokens": K, **extra}


def predicted_self_draft(max_tokens: int, k: int) -> dict:
    """What a greedy self-draft run must report: every proposal accepted, k
    trimmed only so that no draft goes past max_tokens (k_i = min(k, room))."""
    n, steps, drafted, per_pos = 1, 0, 0, [0] * k  # the prefill emits the first token
    while n < max_tokens:
        k_i = min(k, max_tokens - n - 1)
        if k_i:
            steps, drafted = steps + 1, drafted + k_i
            for i in range(k_i):
                per_pos[i] += 1
        n += k_i + 1
    return {"num_steps": steps, "num_draft_tokens": drafted, "num_accepted_tokens": drafted,
            "acceptance_rate": 1.0 if drafted else 0.0,
            "mean_accepted_length": (drafted + steps) / steps if steps else 0.0,
            "acceptance_per_position": [1.0 for d in per_pos if d]}


def test_self_draft_metrics_exact(llama_dir):
    # the last verify step: k trimmed to 2 | full k | full k, then a last token with k = 0 | never speculates
    max_tokens = [12, 13, 14, 2]
    llm = LLM(model=str(llama_dir), block_size=4, speculative=self_draft(llama_dir))
    outs = run(llm, PROMPTS, [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens])
    total = {"num_steps": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
    for o, n in zip(outs, max_tokens):
        assert SPEC_KEYS <= set(o.metrics), o.metrics
        want = predicted_self_draft(n, K)
        for key, value in want.items():  # approx() takes no nested lists on newer pytest
            assert o.metrics[key] == pytest.approx(value), f"max_tokens={n}: {key}"
        for key in total:
            total[key] += o.metrics[key]
    assert outs[1].metrics["mean_accepted_length"] == K + 1  # no tail: every step emits k + 1
    assert outs[0].metrics["mean_accepted_length"] < K + 1  # the last step's k was trimmed
    assert outs[3].metrics["num_steps"] == 0

    m = llm.get_metrics()
    for key, value in total.items():
        assert m[key] == value
    assert m["acceptance_rate"] == 1.0
    assert m["acceptance_per_position"] == [1.0] * K
    assert m["mean_accepted_length"] == pytest.approx((total["num_draft_tokens"] + total["num_steps"])
                                                      / total["num_steps"])
    assert m["num_engine_steps"] > 0 and m["propose_s"] > 0 and m["score_s"] > 0 and m["accept_s"] > 0


def test_partial_draft_metrics_consistent(llama_dir, spec_noisy_draft_dir):
    llm = LLM(model=str(llama_dir), block_size=4, max_num_batched_tokens=12, max_num_seqs=4,
              speculative={"proposer": "draft_model", "proposer_options": {"model": str(spec_noisy_draft_dir)},
                           "scorer": "batch_expansion", "num_speculative_tokens": K})
    outs = run(llm, PROMPTS, SamplingParams(temperature=0, max_tokens=14, ignore_eos=True))
    for o in outs:
        m = o.metrics
        assert m["num_steps"] > 0 and 0 <= m["num_accepted_tokens"] <= m["num_draft_tokens"] <= K * m["num_steps"]
        assert m["acceptance_rate"] == pytest.approx(m["num_accepted_tokens"] / m["num_draft_tokens"])
        # emitted per verify step = accepted + the bonus/recovered token
        assert m["mean_accepted_length"] == pytest.approx(1 + m["num_accepted_tokens"] / m["num_steps"])
        assert len(m["acceptance_per_position"]) <= K and all(0 <= r <= 1 for r in m["acceptance_per_position"])
        # tokens from verify steps never exceed the output (one came from the prefill)
        assert m["num_steps"] * m["mean_accepted_length"] <= len(o.outputs[0].token_ids) - 1 + 1e-9
    m = llm.get_metrics()
    assert 0 < m["acceptance_rate"] < 1
    assert m["num_draft_tokens"] == sum(o.metrics["num_draft_tokens"] for o in outs)
    assert m["num_accepted_tokens"] == sum(o.metrics["num_accepted_tokens"] for o in outs)


def test_metrics_without_speculation(llama_dir):
    llm = LLM(model=str(llama_dir), block_size=4)
    (o,) = run(llm, PROMPTS[:1], SamplingParams(temperature=0, max_tokens=4))
    assert o.metrics["num_draft_tokens"] == 0 and o.metrics["acceptance_rate"] == 0.0
    assert llm.get_metrics()["num_draft_tokens"] == 0


# --- logprobs ----------------------------------------------------------------

LOGPROB_ATOL = 2e-4  # engine fp32 (packed linears, paged attention) vs HF fp32: measured <= ~3e-5


@pytest.mark.parametrize("proposer,scorer,temperature", [
    ("draft_self", "mqa", 0.0), ("draft_noisy", "batch_expansion", 1.0), ("ngram", "mqa", 1.0),
    ("draft_self", "batch_expansion", 1.0)])
def test_logprobs_are_target_log_softmax(proposer, scorer, temperature, llama_dir, spec_noisy_draft_dir,
                                         hf_reference):
    """Every emitted token (accepted proposal, bonus or recovered) reports the
    target's own log-softmax at its position, for itself and the top N."""
    n_top = 5
    if proposer == "ngram":
        cfg = {"proposer": "ngram", "scorer": scorer, "num_speculative_tokens": K}
    else:
        draft = llama_dir if proposer == "draft_self" else spec_noisy_draft_dir
        cfg = {"proposer": "draft_model", "proposer_options": {"model": str(draft)}, "scorer": scorer,
               "num_speculative_tokens": K}
    llm = LLM(model=str(llama_dir), block_size=4, max_num_batched_tokens=16, max_num_seqs=4, speculative=cfg)
    params = [SamplingParams(temperature=temperature, seed=i, max_tokens=12, ignore_eos=True, logprobs=n_top)
              for i in range(len(PROMPTS))]
    outs = run(llm, PROMPTS, params)
    if proposer != "ngram":
        assert llm.get_metrics()["num_accepted_tokens"] > 0
    hf = hf_reference("llama")
    for prompt, o in zip(PROMPTS, outs):
        c = o.outputs[0]
        assert len(c.logprobs) == len(c.token_ids) == 12
        want = hf.logits_along(prompt, c.token_ids).double().log_softmax(-1)  # [12, V]
        for j, (tok, entry) in enumerate(zip(c.token_ids, c.logprobs)):
            assert tok in entry and len(entry) in (n_top, n_top + 1), entry
            for t, lp in entry.items():
                assert 0 <= t < want.shape[1] and math.isfinite(lp), entry
                assert abs(lp - float(want[j, t])) <= LOGPROB_ATOL, (j, t, lp, float(want[j, t]))
            top = sorted((v for t, v in entry.items() if t != tok or len(entry) == n_top), reverse=True)[:n_top]
            assert top == pytest.approx(want[j].topk(n_top).values.tolist(), abs=LOGPROB_ATOL)


# --- disable_by_batch_size ---------------------------------------------------------

def test_disable_by_batch_size(llama_dir, hf_reference):
    threshold = 2
    max_tokens = [6, 9, 16, 18]  # requests finish one by one; speculation resumes at <= 2 running
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    llm = LLM(model=str(llama_dir), block_size=4,
              speculative=self_draft(llama_dir, disable_by_batch_size=threshold))
    probe = StepProbe(llm)
    outs = run(llm, PROMPTS, params)

    crowded = [s for s in probe.steps if s["running"] > threshold and s["k"]]
    calm = [s for s in probe.steps if s["running"] <= threshold and s["k"]]
    assert crowded and calm
    assert all(x == 0 for s in crowded for x in s["k"]), "speculated with more running requests than the threshold"
    assert any(x > 0 for s in calm for x in s["k"]), "speculation did not resume below the threshold"
    # the two requests that finished while > 2 were running never speculated
    assert [o.metrics["num_draft_tokens"] for o in outs[:2]] == [0, 0]
    assert all(o.metrics["num_draft_tokens"] > 0 for o in outs[2:])
    # the self-draft skipped the crowded steps and caught up: still every proposal accepted
    assert llm.get_metrics()["acceptance_rate"] == 1.0

    hf = hf_reference("llama")
    refs = [hf.greedy(p, n) for p, n in zip(PROMPTS, max_tokens)]
    baseline = run(LLM(model=str(llama_dir), block_size=4), PROMPTS, params)
    check_against(outs, refs, baseline, "disable_by_batch_size")
    # the per-step draft tokens, summed, are the engine's
    assert llm.get_metrics()["num_draft_tokens"] == sum(sum(s["k"]) for s in calm)
