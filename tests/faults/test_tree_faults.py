"""Faults of a tree proposer cost only speculation: ngram and suffix trees behind
``TreeFaultyProposer`` (raises, malformed trees, parents or probs off the tree
contract). Each fault is named and counted; a row fault drops only its decode's
tree; greedy output equals no speculation, also with preemptions, aborts between
steps and aborts while a tree is proposed; pools and tables end idle. The target
has a 16-token vocabulary, so trees are real and accepted."""

from __future__ import annotations

import logging

import pytest
import torch
from tree_faults import TREE_FAULTS, TreeFaultyProposer

from conftest import assert_idle
from conftest import drive as drive_all
from speculant import LLM, SamplingParams
from tiny_models import build_model

V = 16
PROMPTS = [torch.randint(V, (n,), generator=torch.Generator().manual_seed(n)).tolist()
           for n in (5, 9, 17, 30, 12, 21)]
GREEDY = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.9, seed=3, max_tokens=30, ignore_eos=True)


def tree_llm(model_dir, proposer: str = "ngram", **kw) -> LLM:
    args = dict(block_size=4, num_blocks=256, max_num_batched_tokens=64, max_num_seqs=6)
    args.update(kw)
    return LLM(model=str(model_dir), **args,
               speculative={"proposer": proposer, "num_speculative_tokens": 4, "tree_width": 2,
                            "max_tree_tokens": 8, "draft_length": {"policy": "fixed"}})


@pytest.fixture(scope="module")
def v16(tmp_path_factory, tokenizer_dir):
    return build_model("llama", tmp_path_factory.mktemp("v16_tree_faults"), tokenizer_dir, vocab_size=V, seed=7)


@pytest.fixture(scope="module")
def plain(v16) -> list[list[int]]:
    """Each prompt's greedy output without speculation."""
    outs = LLM(model=str(v16), block_size=4, num_blocks=256).generate(PROMPTS, GREEDY, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def drive(llm: LLM, params: list[SamplingParams], abort_at=(), seed: int = 0):
    """``conftest.drive`` over ``PROMPTS``: (finished outputs by prompt index, indices it aborted)."""
    results, aborted = drive_all(llm, PROMPTS, params.__getitem__, abort_at, seed)
    return {int(rid[1:]): out for rid, out in results.items()}, {int(rid[1:]) for rid in aborted}


@pytest.mark.parametrize("kind", list(TREE_FAULTS))
def test_each_tree_fault_is_named_counted_and_costs_only_its_row(kind, v16, plain, caplog):
    llm = tree_llm(v16)
    faulty = TreeFaultyProposer(llm.engine.spec.proposer, kinds=[kind])
    llm.engine.spec.proposer = faulty
    with caplog.at_level(logging.WARNING, logger="speculant.engine.proposer_guard"):
        results, _ = drive(llm, [GREEDY] * len(PROMPTS))
    assert [results[i].outputs[0].token_ids for i in range(len(PROMPTS))] == plain
    assert faulty.injected.get(kind, 0) >= 3, faulty.injected
    m = llm.get_metrics()
    assert m["proposer_errors"] >= faulty.injected[kind], m
    row_fault, expected = TREE_FAULTS[kind]
    messages = [r.getMessage() for r in caplog.records]
    assert any("proposer 'faulty_trees'" in s and expected in s for s in messages), messages[:3]
    if row_fault:  # only the spoiled row was dropped: the other decodes' trees were verified and accepted
        assert faulty.spoiled and m["num_accepted_tokens"] > 0, (faulty.spoiled, m)
    assert_idle(llm)


def test_a_tree_where_chains_were_asked_is_refused_by_name(v16, plain, caplog):
    """With tree_width = 1 the engine asks for chains: parents are a structural fault."""
    llm = LLM(model=str(v16), block_size=4, num_blocks=256,
              speculative={"proposer": "ngram", "num_speculative_tokens": 4, "draft_length": {"policy": "fixed"}})
    real = llm.engine.spec.proposer

    class ChainsAsTrees(TreeFaultyProposer):
        def propose(self, batch):
            out = real.propose(batch)
            parents = [j - 1 for r in out.to_lists() for j in range(len(r))]
            self.injected["parents"] = self.injected.get("parents", 0) + bool(parents)
            return type(out)(out.token_ids, out.cu_num_draft_tokens, parents=torch.tensor(parents, dtype=torch.long))

    llm.engine.spec.proposer = faulty = ChainsAsTrees(real, kinds=[])
    with caplog.at_level(logging.WARNING, logger="speculant.engine.proposer_guard"):
        results, _ = drive(llm, [GREEDY] * len(PROMPTS))
    assert [results[i].outputs[0].token_ids for i in range(len(PROMPTS))] == plain
    assert faulty.injected["parents"] > 0 and llm.get_metrics()["num_draft_tokens"] == 0
    assert any("this engine asks for trees only with speculative.tree_width > 1" in r.getMessage()
               for r in caplog.records)
    assert_idle(llm)


@pytest.mark.parametrize("proposer", ["ngram", "suffix"])
def test_random_tree_faults_under_preemption_and_aborts(proposer, v16, plain):
    """A small pool (preemptions), aborts between steps and while trees are proposed,
    a sampled request beside greedy ones, random tree faults at 35% of the calls."""
    llm = tree_llm(v16, proposer, num_blocks=28)
    faulty = TreeFaultyProposer(llm.engine.spec.proposer, rate=0.35, seed=len(proposer))
    faulty.abort_in_propose = (llm.engine, 0.04)
    llm.engine.spec.proposer = faulty
    params = [SAMPLED if i == 4 else GREEDY for i in range(len(PROMPTS))]
    results, aborted = drive(llm, params, abort_at=(6, 13), seed=1)
    assert faulty.aborted_in_propose, "no abort landed while a tree was proposed"
    # an abort during a step takes effect when the step ends, and the request leaves without an output
    # (unless that step finished it)
    aborted |= {int(rid[1:]) for rid in faulty.aborted_in_propose}
    assert set(results) | aborted == set(range(len(PROMPTS))) and len(aborted) >= 3, (set(results), aborted)
    assert sum(o.metrics["num_preemptions"] for o in results.values()) > 0, "the pool was meant to preempt"
    assert sum(faulty.injected.values()) >= 5, faulty.injected
    m = llm.get_metrics()
    assert m["proposer_errors"] >= 5 and m["num_accepted_tokens"] > 0, m
    for i, out in results.items():
        assert len(out.outputs[0].token_ids) == GREEDY.max_tokens
        if params[i] is GREEDY:
            assert out.outputs[0].token_ids == plain[i], f"prompt {i}"
    assert_idle(llm)
    faulty.rate, faulty.abort_in_propose = 0.0, None  # the proposer recovered: it proposes and is accepted again
    before = llm.get_metrics()["num_accepted_tokens"]
    again, _ = drive(llm, [GREEDY] * len(PROMPTS))
    assert [again[i].outputs[0].token_ids for i in range(len(PROMPTS))] == plain
    assert llm.get_metrics()["num_accepted_tokens"] > before
    assert_idle(llm)
