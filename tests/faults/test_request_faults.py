"""A request at fault fails alone; a failed step leaves no partial advancement.

Faults are injected where real ones surface: the decision stage (e.g. a
sampling parameter the sampler chokes on), the target forward, the commit of
one request's tokens, the draft proposer's drawing for one request, and the
engine's step machinery itself (a fault no request can be blamed for).
"""

from __future__ import annotations

import pytest

import speculant.engine.commit as commit_mod
import speculant.engine.llm_engine as engine_mod
import speculant.engine.step_runner as step_runner
import speculant.proposers.draft_model as draft_mod
from conftest import GREEDY, assert_idle, check_serves, make_llm
from greedy_compare import check_all_greedy
from speculant import SamplingParams
from speculant.engine.step import score
from tiny_models import random_prompts

PROMPTS = random_prompts([8, 13, 6, 11], seed=17)
IDS = ["bad", "a", "b", "c"]


def run_all(llm, prompts=PROMPTS, ids=IDS, params=GREEDY, max_steps=2000):
    eng = llm.engine
    for rid, p in zip(ids, prompts):
        eng.add_request(rid, p, params if isinstance(params, SamplingParams) else params[rid])
    results, steps = {}, 0
    while eng.has_unfinished_requests():
        steps += 1
        assert steps <= max_steps
        for out in eng.step():
            if out.finished:
                assert out.request_id not in results, "finished twice"
                results[out.request_id] = out
    return results


def check_good(results, llama_dir, hf_reference, names=("a", "b", "c")):
    ref = hf_reference(llama_dir)
    outs = [results[n].outputs[0] for n in names]
    assert all(o.finish_reason == "length" and o.error is None for o in outs)
    check_all_greedy([o.token_ids for o in outs], [ref.greedy(PROMPTS[IDS.index(n)], 12) for n in names], "good")


def involves_bad(batch) -> bool:
    return any(e.request.request_id == "bad" for e in batch.entries)


@pytest.mark.parametrize("proposer", [None, "draft_model"])
def test_request_whose_decision_raises_fails_alone(proposer, monkeypatch, llama_dir, spec_noisy_draft_dir,
                                                   hf_reference):
    """The issue's case: one request's sampling parameters make deciding raise. Only
    that request fails, with finish_reason "error" and a message naming it and
    the cause; the draft's state stays in sync (no IndexError later)."""
    llm = make_llm(llama_dir, proposer, spec_noisy_draft_dir)
    real = step_runner.decide

    def decide(acceptance, batch, proposals, scores):
        if involves_bad(batch):
            raise ValueError("injected: top_p the sampler cannot use")
        return real(acceptance, batch, proposals, scores)

    monkeypatch.setattr(step_runner, "decide", decide)
    results = run_all(llm)
    bad = results["bad"]
    assert bad.finished and bad.outputs[0].finish_reason == "error" and bad.outputs[0].token_ids == []
    assert "'bad'" in bad.error and "injected: top_p" in bad.error and bad.outputs[0].error == bad.error
    check_good(results, llama_dir, hf_reference)
    assert llm.get_metrics()["failed_requests"] == 1
    assert_idle(llm)
    monkeypatch.setattr(step_runner, "decide", real)
    check_serves(llm, hf_reference, llama_dir)


def test_draft_fault_for_one_request_then_abort_keeps_serving(monkeypatch, llama_dir, spec_noisy_draft_dir,
                                                              hf_reference):
    """The draft proposer raises whenever one request is among its rows; that request
    is aborted midway. Before, every later step raised IndexError (the draft's
    computed positions were out of sync); now the faults cost speculation only."""
    llm = make_llm(llama_dir, "draft_model", spec_noisy_draft_dir)
    real = draft_mod.draw_proposals

    def draw(logits, requests, step, **kw):
        if any(r.request_id == "bad" for r in requests):
            raise ValueError("injected: draft cannot draw for 'bad'")
        return real(logits, requests, step, **kw)

    monkeypatch.setattr(draft_mod, "draw_proposals", draw)
    eng = llm.engine
    for rid, p in zip(IDS, PROMPTS):
        eng.add_request(rid, p, GREEDY)
    results, steps = {}, 0
    while eng.has_unfinished_requests():
        steps += 1
        for out in eng.step():
            assert out.outputs[0].finish_reason != "error", out.error
            if out.finished:
                results[out.request_id] = out
        if steps == 4:
            assert eng.abort_request("bad")
    assert "bad" not in results and llm.get_metrics()["proposer_errors"] >= 1
    check_good(results, llama_dir, hf_reference)
    assert_idle(llm)


def test_failure_mid_commit_advances_nobody_partially(monkeypatch, llama_dir, hf_reference):
    """Committing 'bad''s token raises in the step where 'one' (max_tokens=1) finishes:
    'one' ends with exactly 1 token, 'bad' fails with its tokens untouched."""
    llm = make_llm(llama_dir, None)
    real = commit_mod.append_tokens

    def append(request, token_ids, *args, **kw):
        if request.request_id == "bad":
            raise RuntimeError("injected: stop rule failed")
        return real(request, token_ids, *args, **kw)

    monkeypatch.setattr(commit_mod, "append_tokens", append)
    params = {"bad": GREEDY, "one": SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)}
    results = run_all(llm, PROMPTS[:2], ["bad", "one"], params)
    assert results["one"].outputs[0].finish_reason == "length" and len(results["one"].outputs[0].token_ids) == 1
    bad = results["bad"]
    assert bad.outputs[0].finish_reason == "error" and bad.outputs[0].token_ids == []
    assert "'bad'" in bad.error and "committing" in bad.error and "injected: stop rule" in bad.error
    assert_idle(llm)
    monkeypatch.setattr(commit_mod, "append_tokens", real)
    check_serves(llm, hf_reference, llama_dir)


def test_fault_in_the_step_machinery_fails_that_steps_requests_cleanly(monkeypatch, llama_dir, hf_reference):
    """A fault no request can be blamed for: the step's requests fail (unchanged,
    blocks freed), requests outside that step and later ones are served."""
    llm = make_llm(llama_dir, "ngram", max_num_seqs=2)
    real, calls, before = engine_mod.run_step, [], {}

    def run_step(batch, parts):
        calls.append(len(batch.entries))
        if len(calls) == 3:
            before.update({e.request.request_id: list(e.request.output_token_ids) for e in batch.entries})
            raise RuntimeError("injected: engine bug")
        return real(batch, parts)

    monkeypatch.setattr(engine_mod, "run_step", run_step)
    results = run_all(llm)
    failed = {rid for rid, o in results.items() if o.outputs[0].finish_reason == "error"}
    assert failed == {"bad", "a"}, failed  # the two requests of step 3 (max_num_seqs=2)
    for rid in failed:
        o = results[rid]
        assert f"{rid!r}" in o.error and "injected: engine bug" in o.error
        assert o.outputs[0].token_ids == before[rid], "a failed step must not advance its requests"
    check_good(results, llama_dir, hf_reference, names=("b", "c"))
    assert_idle(llm)
    check_serves(llm, hf_reference, llama_dir)


class FlakyScorer:
    """Wraps the engine's scorer: raises on chosen calls."""

    def __init__(self, real, should_fail):
        self.real, self.should_fail, self.calls = real, should_fail, 0

    def score(self, runner, batch, proposals, want_hidden=False):
        self.calls += 1
        if self.should_fail(self.calls, batch, proposals):
            raise RuntimeError("injected: forward failed")
        return score(self.real, runner, batch, proposals, want_hidden)  # real None: the plain forward


def test_transient_forward_failure_is_retried_without_speculation(llama_dir, spec_noisy_draft_dir, hf_reference):
    llm = make_llm(llama_dir, "draft_model", spec_noisy_draft_dir)
    eng = llm.engine
    eng.spec.scorer = FlakyScorer(eng.spec.scorer, lambda n, b, p: bool((p.lens > 0).any()) and n % 4 == 0)
    results = run_all(llm)
    assert all(o.error is None for o in results.values())
    check_good(results, llama_dir, hf_reference, names=IDS)
    assert llm.get_metrics()["fallback_steps"] >= 1 and llm.get_metrics()["failed_requests"] == 0
    assert_idle(llm)


@pytest.mark.parametrize("proposer", [None, "ngram", "draft_model"])
def test_forward_failing_for_one_request_is_isolated(proposer, llama_dir, spec_noisy_draft_dir, hf_reference):
    llm = make_llm(llama_dir, proposer, spec_noisy_draft_dir)
    eng = llm.engine
    eng.spec.scorer = FlakyScorer(eng.spec.scorer, lambda n, b, p: involves_bad(b) and eng.num_steps >= 2)
    results = run_all(llm)
    assert results["bad"].outputs[0].finish_reason == "error"
    assert "'bad'" in results["bad"].error and "injected: forward failed" in results["bad"].error
    assert "in scorer plugin 'FlakyScorer'" in results["bad"].error  # the plugin where it raised
    check_good(results, llama_dir, hf_reference)
    assert_idle(llm)


@pytest.mark.parametrize("exc", [RuntimeError("injected"), KeyboardInterrupt()])
def test_generate_after_an_exception_works_again(exc, monkeypatch, llama_dir, spec_noisy_draft_dir, hf_reference):
    """An exception escaping generate() (a bug, Ctrl-C) aborts that call's requests:
    nothing is left queued, and the next call is served normally."""
    llm = make_llm(llama_dir, "draft_model", spec_noisy_draft_dir)
    real, calls = llm.engine.step, []

    def step():
        calls.append(1)
        if len(calls) == 3:
            raise exc
        return real()

    monkeypatch.setattr(llm.engine, "step", step)
    with pytest.raises(type(exc)):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert_idle(llm)
    check_serves(llm, hf_reference, llama_dir)


def test_generate_returns_the_failed_request_and_the_others(monkeypatch, llama_dir, hf_reference):
    llm = make_llm(llama_dir, None)
    real = step_runner.decide
    bad_prompt = PROMPTS[0]

    def decide(acceptance, batch, proposals, scores):
        if any(e.request.prompt_token_ids == bad_prompt for e in batch.entries):
            raise ValueError("injected")
        return real(acceptance, batch, proposals, scores)

    monkeypatch.setattr(step_runner, "decide", decide)
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert outs[0].outputs[0].finish_reason == "error" and outs[0].request_id in outs[0].error
    ref = hf_reference(llama_dir)
    check_all_greedy([o.outputs[0].token_ids for o in outs[1:]], [ref.greedy(p, 12) for p in PROMPTS[1:]], "gen")
    assert_idle(llm)
