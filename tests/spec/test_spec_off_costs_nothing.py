"""Off is off (issue 50): a step whose decodes are all at k = 0 makes no
proposer call, whether the adaptive policy turned speculation off or the
requests did (``{"enabled": false}``); the proposer still follows prefill
chunks, one that reads the target's hidden states (EAGLE) still gets every
step's ``commit`` (but no ``propose``), and greedy output equals the engine
without a proposer."""

from __future__ import annotations

import pytest

from spec_helpers import run, token_ids
from speculant import LLM, SamplingParams
from tiny_models import random_prompts

PROMPTS = random_prompts([6, 11, 4], seed=5)
NEVER_PAYS = {"policy": "adaptive", "token_cost": 0.05, "draft_token_cost": 10.0}  # no draft is worth its cost


def spied(llm: LLM) -> list[tuple[str, int, int]]:
    """Wraps the engine's proposer: each call as (method, prefill chunks, decodes with k > 0)."""
    proposer = llm.engine.spec.proposer
    calls: list[tuple[str, int, int]] = []
    for name in ("propose", "commit"):
        method = getattr(proposer, name)

        def spy(batch, *args, _method=method, _name=name):
            calls.append((_name, len(batch.prefills), sum(d.num_spec_tokens > 0 for d in batch.decodes)))
            return _method(batch, *args)
        setattr(proposer, name, spy)
    return calls


def greedy(speculative=None) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, speculative=speculative)


@pytest.mark.parametrize("proposer", ["ngram", "suffix", "draft_model"])
@pytest.mark.parametrize("why", ["policy", "request"])
def test_a_step_at_k0_makes_no_proposer_call(llama_dir, proposer, why):
    plain = token_ids(run(LLM(model=str(llama_dir), block_size=4), PROMPTS, greedy()))
    options = {"draft_model": {"model": str(llama_dir)}, "ngram": {"min_n": 1, "max_n": 2}}.get(proposer, {})
    draft_length = NEVER_PAYS if why == "policy" else {"policy": "fixed"}
    llm = LLM(model=str(llama_dir), block_size=4, max_num_seqs=4, max_num_batched_tokens=64,
              speculative={"proposer": proposer, "proposer_options": options, "num_speculative_tokens": 3,
                           "draft_length": draft_length})
    calls = spied(llm)
    steps = []
    step = llm.engine.step

    def counted():
        before = len(calls)
        outs = step()
        steps.append(len(calls) - before)
        return outs
    llm.engine.step = counted
    outs = run(llm, PROMPTS, greedy({"enabled": False} if why == "request" else None))
    assert token_ids(outs) == plain
    assert all(o.metrics["num_draft_tokens"] == 0 for o in outs)
    # every call came with prefill chunks to follow; the decode-only steps (most of them) made none
    assert calls and all(num_prefills > 0 and speculating == 0 for _, num_prefills, speculating in calls)
    assert steps.count(0) >= 9 and len(steps) >= 10
    assert sum(o.metrics["num_off_steps"] for o in outs) == 3 * 9
    if proposer == "draft_model" and why == "request":  # a request with speculation off never enters the draft
        assert not llm.engine.spec.proposer._computed


def test_a_proposer_reading_hidden_states_commits_every_step_without_proposing():
    from speculant.engine.batch import StepBatch
    from speculant.engine.step import proposer_commits, proposer_runs
    from speculant.proposers.eagle.proposer import EagleProposer
    from speculant.proposers.suffix import SuffixProposer

    empty = StepBatch()  # no prefill chunk, no decode planned proposals
    eagle, suffix = EagleProposer.__new__(EagleProposer), SuffixProposer.__new__(SuffixProposer)
    assert EagleProposer.capabilities.needs_target_hidden_states  # it records them at every commit
    assert proposer_commits(eagle, empty) and not proposer_runs(eagle, empty)
    assert not proposer_commits(suffix, empty) and not proposer_runs(suffix, empty)
