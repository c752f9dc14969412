"""A faulty proposer never fails a request.

Every built-in proposer runs behind ``FaultyProposer``, which raises or returns
each kind of bad output at random steps, under load with preemption and random
aborts. Afterwards the greedy requests equal their solo greedy run (HF
``generate``, near-tie aware), sampled ones ran to their length, the block
pools (target and draft) and the proposer's tables are idle, the faults were
counted in ``get_metrics()["proposer_errors"]``, and the engine (proposer
included) serves new requests.
"""

from __future__ import annotations

import logging

import pytest

from conftest import GREEDY, PROPOSERS, assert_idle, check_serves, make_llm, real_proposer
from conftest import drive as drive_all
from faulty_proposer import FAULTS, RESTORE_FAULTS, SLEEP_S, FaultyProposer
from greedy_compare import check_all_greedy
from speculant import SamplingParams
from tiny_models import random_prompts

PROMPTS = random_prompts([6, 9, 13, 17, 20, 8, 11, 15, 19, 10], seed=5)
SAMPLED = {2, 5, 8}  # indices of seeded sampling requests (they bring draft probabilities)


def params(i: int) -> SamplingParams:
    if i in SAMPLED:
        return SamplingParams(temperature=0.9, seed=40 + i, max_tokens=12, ignore_eos=True)
    return GREEDY


def drive(llm, prompts, abort_at=(), seed=0, max_steps=3000):
    """``conftest.drive`` with this module's parameters; every request finished or aborted, not both."""
    results, aborted = drive_all(llm, prompts, params, abort_at, seed, max_steps)
    ids = {f"r{i}" for i in range(len(prompts))}
    assert set(results) | aborted == ids and not set(results) & aborted
    return results, aborted


def check_outputs(results, llama_dir, hf_reference, what):
    greedy = [(int(rid[1:]), out) for rid, out in results.items() if int(rid[1:]) not in SAMPLED]
    ref = hf_reference(llama_dir)
    check_all_greedy([o.outputs[0].token_ids for _, o in greedy],
                     [ref.greedy(PROMPTS[i], GREEDY.max_tokens) for i, _ in greedy], what)
    for rid, out in results.items():
        assert len(out.outputs[0].token_ids) == 12 and out.outputs[0].finish_reason == "length", rid


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_random_faults_under_load_preemption_and_aborts(proposer, llama_dir, spec_noisy_draft_dir,
                                                        random_heads_dirs, hf_reference):
    llm = make_llm(llama_dir, proposer, spec_noisy_draft_dir, random_heads_dirs, num_blocks=20)
    faulty = FaultyProposer(llm.engine.spec.proposer, rate=0.35, seed=PROPOSERS.index(proposer))
    llm.engine.spec.proposer = faulty
    llm.engine.guard.slow_seconds = SLEEP_S / 2  # so the injected slow calls count as slow
    results, aborted = drive(llm, PROMPTS, abort_at=(4, 9, 15), seed=1)
    assert len(aborted) == 3
    assert sum(o.metrics["num_preemptions"] for o in results.values()) > 0, "the pool was meant to preempt"
    assert sum(faulty.injected.values()) >= 5, faulty.injected
    assert llm.get_metrics()["proposer_errors"] >= 5
    assert llm.get_metrics()["slow_proposer_calls"] >= faulty.injected.get("sleep", 0)
    check_outputs(results, llama_dir, hf_reference, f"{proposer} with faults")
    assert_idle(llm)
    faulty.rate = 0.0  # the proposer itself recovered: it proposes again
    before = llm.get_metrics()["num_draft_tokens"]
    check_serves(llm, hf_reference, llama_dir)
    assert llm.get_metrics()["num_draft_tokens"] > before


SHARED_BASE = random_prompts([24], seed=8)[0]
SHARED_TAILS = random_prompts([5, 3, 7, 2, 6, 4, 1, 5, 3, 6], seed=9)
# prompts sharing 0..24 tokens of one base: cut at block boundaries (4) and inside blocks
SHARED_PROMPTS = [SHARED_BASE[:cut] + tail for cut, tail in zip([20, 20, 16, 13, 24, 8, 18, 12, 21, 4], SHARED_TAILS)]


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_faults_with_shared_prefixes_preemption_and_aborts(proposer, llama_dir, spec_noisy_draft_dir,
                                                           random_heads_dirs, hf_reference):
    """Prefix caching under faults: prompts share prefixes, so requests are
    admitted after cached blocks (of finished, running and preempted requests)
    and the proposer restores its state for them; restore_prefix itself raises
    or answers nonsense at random. Greedy outputs stay those of HF, every pool
    keeps its accounting after every step and is idle at the end."""
    llm = make_llm(llama_dir, proposer, spec_noisy_draft_dir, random_heads_dirs, num_blocks=16,
                   max_num_batched_tokens=12)
    faulty = FaultyProposer(llm.engine.spec.proposer, rate=0.3, seed=PROPOSERS.index(proposer))
    llm.engine.spec.proposer = faulty
    llm.engine.guard.slow_seconds = SLEEP_S / 2
    eng, step = llm.engine, llm.engine.step
    prop = real_proposer(llm)
    pools = [eng.blocks] + [part.runner._blocks for part in getattr(prop, "parts", [prop])
                                          if hasattr(part, "runner")]

    def checked_step():
        outs = step()
        for pool in pools:
            pool.check()
        return outs

    eng.step = checked_step
    results, aborted = drive(llm, SHARED_PROMPTS, abort_at=(5, 11), seed=2)
    m = llm.get_metrics()
    assert m["prefix_caching"] and m["prefix_cache_hit_tokens"] > 0, m
    assert sum(o.metrics["num_preemptions"] for o in results.values()) > 0, "the pool was meant to preempt"
    greedy = [(int(rid[1:]), out) for rid, out in results.items() if int(rid[1:]) not in SAMPLED]
    ref = hf_reference(llama_dir)
    check_all_greedy([o.outputs[0].token_ids for _, o in greedy],
                     [ref.greedy(SHARED_PROMPTS[i], GREEDY.max_tokens) for i, _ in greedy], f"{proposer} shared")
    assert_idle(llm)
    faulty.rate = 0.0
    check_serves(llm, hf_reference, llama_dir)


def test_restore_faults_are_named_counted_and_cost_only_the_cache_hit(llama_dir, spec_noisy_draft_dir,
                                                                       random_heads_dirs, hf_reference, caplog):
    llm = make_llm(llama_dir, "draft_model", spec_noisy_draft_dir, random_heads_dirs)
    llm.engine.spec.proposer = FaultyProposer(llm.engine.spec.proposer, faults=list(RESTORE_FAULTS), rate=1.0)
    with caplog.at_level(logging.WARNING, logger="speculant.engine.proposer_guard"):
        # one at a time: every later prompt finds cached blocks, and each restore fails
        outs = [llm.generate([p], GREEDY, use_tqdm=False)[0] for p in SHARED_PROMPTS[:4]]
    m = llm.get_metrics()
    assert m["proposer_errors"] >= 3 and m["prefix_cache_hit_tokens"] == 0, m
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "restore_prefix raised RuntimeError" in messages or "restore_prefix returned" in messages
    ref = hf_reference(llama_dir)
    check_all_greedy([o.outputs[0].token_ids for o in outs],
                     [ref.greedy(p, GREEDY.max_tokens) for p in SHARED_PROMPTS[:4]], "restore faults")
    assert_idle(llm)


EXPECTED = {
    "raise": "propose raised RuntimeError", "raise_before": "propose raised RuntimeError",
    "none": "returned NoneType, not Proposals", "oov_ids": "outside the vocabulary",
    "negative_ids": "outside the vocabulary", "float_ids": "token_ids must be an integer tensor",
    "negative_lens": "never decrease", "long_lens": "outside [0, budget]",
    "wrong_rows": "one row per decode", "nan_probs": "are not finite", "unnormalised_probs": "do not sum to 1",
    "negative_probs": "are negative", "commit_raise": "commit raised RuntimeError",
    "sleep": "threshold",
}


@pytest.mark.parametrize("kind", FAULTS)
def test_each_fault_kind_is_named_counted_and_harmless(kind, llama_dir, spec_noisy_draft_dir, random_heads_dirs,
                                                       hf_reference, caplog):
    llm = make_llm(llama_dir, "draft_model", spec_noisy_draft_dir, random_heads_dirs)
    llm.engine.spec.proposer = FaultyProposer(llm.engine.spec.proposer, faults=[kind], rate=1.0)
    llm.engine.guard.slow_seconds = SLEEP_S / 2
    with caplog.at_level(logging.WARNING, logger="speculant.engine.proposer_guard"):
        results, _ = drive(llm, PROMPTS[:5])
    check_outputs(results, llama_dir, hf_reference, kind)
    m = llm.get_metrics()
    counted = m["slow_proposer_calls"] if kind == "sleep" else m["proposer_errors"]
    assert counted >= 3, m
    messages = [r.getMessage() for r in caplog.records]
    assert any("proposer 'faulty'" in m and EXPECTED[kind] in m for m in messages), messages[:3]
    if kind not in ("commit_raise", "sleep", "nan_probs", "unnormalised_probs", "negative_probs"):
        # every row was spoiled, so no proposal was ever scored (probabilities are only checked,
        # and only matter, on the rows of sampling requests)
        assert llm.get_metrics()["num_draft_tokens"] == 0
    assert_idle(llm)


def test_slow_proposer_is_counted_and_warned_once(llama_dir, caplog):
    llm = make_llm(llama_dir, "ngram")
    llm.engine.guard.slow_seconds = 0.02
    llm.engine.spec.proposer = FaultyProposer(llm.engine.spec.proposer, faults=[], sleep_s=0.03)
    with caplog.at_level(logging.WARNING, logger="speculant.engine.proposer_guard"):
        outs = llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 12 for o in outs)
    m = llm.get_metrics()
    assert m["slow_proposer_calls"] >= 5 and m["proposer_errors"] == 0
    slow = [r.getMessage() for r in caplog.records if "threshold" in r.getMessage()]
    assert len(slow) == 1 and "proposer 'faulty'" in slow[0] and "num_speculative_tokens" in slow[0], slow
