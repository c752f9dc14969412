"""MQA and batch-expansion scorers agree: on the same step batch they return
target logits within float tolerance and lead to identical accepted tokens,
and whole runs with either scorer emit the same tokens and log-probabilities.

The direct comparison installs a scorer that runs both on every step of a real
engine run (mixed prefill chunks and speculating decodes, greedy and seeded
sampling requests). Both write the same K/V slots, so running one after the
other leaves the cache as either alone would (up to rounding); which one runs
last, and whose scores the engine uses, alternates by step.
"""

from __future__ import annotations

import torch

from spec_helpers import StepProbe, run
from speculant import LLM, SamplingParams
from speculant.engine.step import decide
from speculant.interfaces import Scorer
from speculant.scorers.batch_expansion import BatchExpansionScorer
from speculant.scorers.mqa import MQAScorer
from tiny_models import random_prompts

LOGIT_ATOL = 2e-4  # abs, at a logit scale of ~10; measured: <= 3e-5 (fp32 summation order); bugs are O(0.1)
LOGPROB_ATOL = 1e-4
K = 3
PROMPTS = random_prompts([5, 11, 18, 8], seed=31)


def params() -> list[SamplingParams]:
    return [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3),
            SamplingParams(temperature=1.0, seed=5, max_tokens=12, ignore_eos=True, logprobs=3),
            SamplingParams(temperature=0.8, top_k=20, seed=6, max_tokens=12, ignore_eos=True, logprobs=3),
            SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3)]


class BothScorers(Scorer):
    """Runs MQA and batch expansion on the same batch and records how they compare."""

    name = "both"
    api_version = "3.0"

    def __init__(self, acceptance) -> None:
        super().__init__()
        self.mqa, self.be, self.acceptance = MQAScorer(), BatchExpansionScorer(), acceptance
        self.max_logit_diff = 0.0
        self.rows_compared = 0
        self.calls = 0

    def score(self, runner, batch, proposals, want_hidden=False):
        self.calls += 1
        first, second = (self.mqa, self.be) if self.calls % 2 else (self.be, self.mqa)
        a = first.score(runner, batch, proposals, want_hidden)
        b = second.score(runner, batch, proposals, want_hidden)
        assert a.prefill_logits.shape == b.prefill_logits.shape
        if a.prefill_logits.numel():
            self.max_logit_diff = max(self.max_logit_diff, float((a.prefill_logits - b.prefill_logits).abs().max()))
        assert torch.equal(a.cu_num_logits, b.cu_num_logits) and a.decode_logits.shape == b.decode_logits.shape
        if a.decode_logits.numel():
            diff = (a.decode_logits - b.decode_logits).abs().max()  # flat: every row is a real one
            self.max_logit_diff = max(self.max_logit_diff, float(diff))
            self.rows_compared += a.decode_logits.shape[0]
        # identical decisions: same tokens emitted, same number accepted (generators are
        # rebuilt from each request's seed and position, so both see the same draws)
        da = decide(self.acceptance, batch, proposals, a)
        db = decide(self.acceptance, batch, proposals, b)
        assert (da.prefill_tokens, da.decode_tokens, da.num_accepted) == (
            db.prefill_tokens, db.decode_tokens, db.num_accepted), "scorers led to different accepted tokens"
        return b


def test_scorers_agree_on_every_step(llama_dir, spec_noisy_draft_dir):
    llm = LLM(model=str(llama_dir), block_size=4, max_num_batched_tokens=12, max_num_seqs=3,
              speculative={"proposer": "draft_model", "proposer_options": {"model": str(spec_noisy_draft_dir)},
                           "scorer": "mqa", "num_speculative_tokens": K})
    both = BothScorers(llm.engine.spec.acceptance)
    llm.engine.spec.scorer = both
    probe = StepProbe(llm)
    run(llm, PROMPTS, params())
    assert probe.mixed_steps > 0 and both.rows_compared > 20
    assert both.max_logit_diff <= LOGIT_ATOL, f"MQA and batch expansion logits differ by {both.max_logit_diff}"
    m = llm.get_metrics()
    assert 0 < m["num_accepted_tokens"] < m["num_draft_tokens"]


def test_whole_runs_identical_tokens_and_logprobs(llama_dir, spec_noisy_draft_dir):
    outs = {}
    for scorer in ("mqa", "batch_expansion"):
        llm = LLM(model=str(llama_dir), block_size=4, max_num_batched_tokens=9, max_num_seqs=4,
                  speculative={"proposer": "draft_model",
                               "proposer_options": {"model": str(spec_noisy_draft_dir)},
                               "scorer": scorer, "num_speculative_tokens": K})
        outs[scorer] = run(llm, PROMPTS, params())
    for a, b in zip(outs["mqa"], outs["batch_expansion"]):
        ca, cb = a.outputs[0], b.outputs[0]
        assert ca.token_ids == cb.token_ids
        assert len(ca.logprobs) == len(cb.logprobs) == len(ca.token_ids)
        for la, lb in zip(ca.logprobs, cb.logprobs):
            assert la.keys() == lb.keys()
            for t in la:
                assert abs(la[t] - lb[t]) <= LOGPROB_ATOL
        assert a.metrics["num_accepted_tokens"] == b.metrics["num_accepted_tokens"]
        assert a.metrics["num_draft_tokens"] == b.metrics["num_draft_tokens"]
    assert torch.tensor([o.metrics["num_draft_tokens"] for o in outs["mqa"]]).sum() > 0
