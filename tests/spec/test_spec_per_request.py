"""Per-request speculation (``SamplingParams.speculative``): validation and
refusals with the field named, mixed batches (requests with and without
speculation, lower k, fixed k) sharing one step and the budget counting each
request's own length, greedy output equal to no speculation, and the
per-request acceptance record in every output."""

from __future__ import annotations

import pytest

from spec_helpers import StepProbe, run, token_ids
from speculant import LLM, SamplingParams
from speculant.config.speculative_params import SpeculativeParams
from tiny_models import random_prompts

K = 3
PROMPTS = random_prompts([6, 11, 4, 9], seed=21)
SETTINGS = [{"enabled": False}, None, {"num_speculative_tokens": 1}, {"adaptive": False}]


def greedy(n: int = 12, speculative=None) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, speculative=speculative)


@pytest.mark.parametrize("value,error,message", [
    ({"enable": False}, ValueError, "SamplingParams.speculative has unknown key(s) 'enable'; allowed keys: "
                                    "enabled, num_speculative_tokens, adaptive"),
    ({"enabled": "no"}, TypeError, "SamplingParams.speculative.enabled='no' must be a bool, got str; "
                                   "pass true or false"),
    ({"num_speculative_tokens": -1}, ValueError, "SamplingParams.speculative.num_speculative_tokens=-1 must be "
                                                 ">= 0; pass 0 to turn speculation off for this request, or a k "
                                                 "up to the engine's"),
    ({"num_speculative_tokens": 2.0}, TypeError, "SamplingParams.speculative.num_speculative_tokens=2.0 must be "
                                                 "an integer, got float; pass e.g. 2 (at most the engine's k)"),
    ("off", TypeError, "SamplingParams.speculative='off' must be an object such as {\"enabled\": false} or "
                       "{\"num_speculative_tokens\": 2}, got str"),
])
def test_bad_settings_name_the_field(value, error, message):
    with pytest.raises(error) as exc:
        SamplingParams(speculative=value)
    assert str(exc.value) == message


def test_settings_parse_and_bound_k():
    sp = SamplingParams(speculative={"num_speculative_tokens": 2, "adaptive": False}).speculation
    assert sp == SpeculativeParams(num_speculative_tokens=2, adaptive=False)
    assert (sp.max_tokens(4), sp.max_tokens(1)) == (2, 1)
    assert SamplingParams(speculative={"enabled": False}).speculation.max_tokens(4) == 0
    assert SamplingParams().speculation.max_tokens(4) == 4


def ngram_llm(llama_dir, **kw) -> LLM:
    return LLM(model=str(llama_dir), block_size=4, max_num_seqs=4, **kw,
               speculative={"proposer": "ngram", "proposer_options": {"min_n": 1, "max_n": 2},
                            "num_speculative_tokens": K})


def test_settings_the_engine_cannot_honour_are_refused(llama_dir):
    llm = ngram_llm(llama_dir)
    with pytest.raises(ValueError) as exc:
        llm.engine.add_request(None, [1, 2, 3], greedy(speculative={"num_speculative_tokens": K + 1}))
    assert str(exc.value) == (
        f"SamplingParams.speculative.num_speculative_tokens={K + 1} exceeds the engine's "
        f"speculative.num_speculative_tokens={K} (its buffers and budget are sized for it); pass at most {K}, "
        "or start the engine with a larger k")
    plain = LLM(model=str(llama_dir))
    with pytest.raises(ValueError, match=r"asks for speculation, but this engine runs without a proposer "
                                         r"\(speculative.proposer is not set\)"):
        plain.engine.add_request(None, [1, 2, 3], greedy(speculative={"num_speculative_tokens": 1}))
    # turning speculation off where there is none asks nothing the engine cannot do
    out = plain.generate([[1, 2, 3]] * 2, [greedy(4, {"enabled": False}), greedy(4, {"num_speculative_tokens": 0})],
                         use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in out] == [4, 4]
    assert not llm.engine.has_unfinished_requests() and not plain.engine.has_unfinished_requests()


@pytest.mark.parametrize("proposer", ["ngram", "draft_model"])
def test_mixed_batch_shares_steps_and_equals_no_speculation(llama_dir, proposer):
    baseline = token_ids(run(LLM(model=str(llama_dir), block_size=4), PROMPTS, greedy()))
    spec = {"proposer": "ngram", "proposer_options": {"min_n": 1, "max_n": 2}} if proposer == "ngram" else \
        {"proposer": "draft_model", "proposer_options": {"model": str(llama_dir)}}  # the target as its own draft
    llm = LLM(model=str(llama_dir), block_size=4, max_num_seqs=4, max_num_batched_tokens=64,
              speculative={**spec, "num_speculative_tokens": K, "draft_length": {"policy": "fixed"}})
    probe = StepProbe(llm)
    ks: dict[str, list[int]] = {}
    schedule = llm.engine.scheduler.schedule

    def recording(*args, **kwargs):
        batch = schedule(*args, **kwargs)
        for d in batch.decodes:
            ks.setdefault(d.request.request_id, []).append(d.num_spec_tokens)
        return batch

    llm.engine.scheduler.schedule = recording
    outs = run(llm, PROMPTS, [greedy(speculative=s) for s in SETTINGS])
    assert token_ids(outs) == baseline
    probe.check_invariants(K)
    off, default, one, fixed = (ks[o.request_id] for o in outs)
    assert set(off) == {0} and max(one) == 1 and max(default) == K and max(fixed) == K
    # requests with and without speculation in one step (one target forward)
    assert any(s["k"].count(0) >= 1 and any(s["k"]) for s in probe.steps)
    m_off, m_default = outs[0].metrics, outs[1].metrics
    assert m_off["num_draft_tokens"] == 0 and m_off["num_steps"] == 0 and m_off["propose_s"] == 0.0
    assert m_off["num_off_steps"] == len(off) == 11  # every decode step of its 12 tokens
    assert m_off["accepted_length_histogram"] == []
    for o in outs[1:]:
        m = o.metrics
        hist = m["accepted_length_histogram"]
        assert sum(hist) == m["num_steps"]
        assert sum(a * n for a, n in enumerate(hist)) == m["num_accepted_tokens"]
        # a decode step verifies proposals or counts as off (ngram may find no match at k > 0)
        assert m["num_off_steps"] + m["num_steps"] == len(ks[o.request_id])
        assert m["num_off_steps"] >= ks[o.request_id].count(0)
    if proposer == "draft_model":  # the target drafting for itself: every proposal is accepted
        for o in outs[1:]:
            assert o.metrics["propose_s"] > 0 and o.metrics["num_steps"] > 0
        assert m_default["accepted_length_histogram"][-1] >= 2
        assert m_default["num_accepted_tokens"] == m_default["num_draft_tokens"]
        # nothing of the request that turned speculation off ever entered the draft's pool
        assert outs[0].request_id not in llm.engine.spec.proposer._computed
    totals = llm.get_metrics()["accepted_length_histogram"]
    summed = [0] * len(totals)
    for o in outs:
        for a, n in enumerate(o.metrics["accepted_length_histogram"]):
            summed[a] += n
    assert totals == summed


def test_budget_counts_each_requests_own_length(llama_dir):
    """A 7-token budget and four decodes: each gets its one token, and the 3
    left go to the first request that speculates; the requests that turned
    speculation off take none of them."""
    llm = ngram_llm(llama_dir, max_num_batched_tokens=7)
    probe = StepProbe(llm)
    outs = run(llm, PROMPTS, [greedy(24, {"enabled": False}), greedy(24), greedy(24, {"enabled": False}), greedy(24)])
    probe.check_invariants(K)
    decode_steps = [s for s in probe.steps if len(s["k"]) == 4 and not s["prefill"]]
    assert decode_steps
    for s in decode_steps:
        assert s["k"][0] == s["k"][2] == 0
        assert sum(1 + k for k in s["k"]) <= 7
    assert max(s["k"][1] for s in decode_steps) == K
    assert all(len(o.outputs[0].token_ids) == 24 for o in outs)
