"""Fixtures and helpers of the fault-injection tests (tests/faults/).

Every test here checks three things after the faults: the other requests'
outputs are what they would have been, every block pool (target and draft)
and every proposer table is back to idle, and the engine serves new requests.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch

from greedy_compare import check_all_greedy
from speculant import LLM, SamplingParams
from tiny_models import random_prompts

PROPOSERS = ("ngram", "suffix", "draft_model", "medusa", "mlp_speculator", "eagle", "eagle_suffix", "draft_suffix")
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def spec_for(proposer: str, draft_dir, heads_dirs, k: int = 3) -> dict:
    if proposer in ("ngram", "suffix"):
        options = {}
    elif proposer == "draft_model":
        options = {"model": str(draft_dir)}
    elif proposer == "eagle_suffix":
        options = {"eagle": {"path": str(heads_dirs["eagle"])}, "min_match_len": 1}
    elif proposer == "draft_suffix":
        options = {"draft": {"model": str(draft_dir)}, "min_match_len": 1}
    else:
        options = {"path": str(heads_dirs[proposer])}
    return {"proposer": proposer, "proposer_options": options, "num_speculative_tokens": k}


def make_llm(llama_dir, proposer: str | None, draft_dir=None, heads_dirs=None, **kw) -> LLM:
    """A small engine (chunked prefill on, as by default, for every proposer)."""
    args = dict(block_size=4, max_model_len=64, max_num_batched_tokens=64, max_num_seqs=8)
    args.update(kw)
    if proposer is not None:
        args["speculative"] = spec_for(proposer, draft_dir, heads_dirs)
    return LLM(model=str(llama_dir), **args)


def real_proposer(llm: LLM):
    p = llm.engine.spec.proposer
    return getattr(p, "real", p)


def assert_idle(llm: LLM) -> None:
    """No request left anywhere, every pool and proposer table empty."""
    eng = llm.engine
    assert not eng.has_unfinished_requests()
    assert not eng._requests and not eng.scheduler.running and not eng.scheduler.waiting
    pools = [("target", eng.blocks)]
    prop = real_proposer(llm)
    parts = list(getattr(prop, "parts", [prop]))  # a hybrid's parts hold the state
    for part in parts:
        if part is not None and hasattr(part, "runner"):
            pools.append(("draft", part.runner._blocks))
    for what, bm in pools:
        bm.check()  # empty + cached + in use = total; reference counts equal the (now absent) block tables
        assert bm.num_free_blocks == bm.num_blocks and bm.num_used_blocks == 0, \
            f"{what} pool: {bm.num_blocks - bm.num_free_blocks} blocks leaked"
    for part in parts:
        for attr in ("_computed", "_pending", "_hidden", "_state", "_seqs"):
            left = getattr(part, attr, None)
            assert not left, f"proposer {type(part).__name__}.{attr} still holds {sorted(left)}"


def check_serves(llm: LLM, hf_reference, llama_dir, n: int = 3) -> None:
    """The engine still answers new requests correctly."""
    prompts = random_prompts([7, 12, 9][:n], seed=99)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    check_all_greedy([o.outputs[0].token_ids for o in outs],
                     [hf_reference(llama_dir).greedy(p, GREEDY.max_tokens) for p in prompts], "after faults")
    assert_idle(llm)


def drive(llm: LLM, prompts, params: Callable[[int], SamplingParams], abort_at=(), seed: int = 0,
          max_steps: int = 3000) -> tuple[dict, set]:
    """Add every prompt (request ``f"r{i}"`` with ``params(i)``), step to the end aborting
    a random unfinished request after the given step numbers; return (finished outputs
    by id, ids this function aborted)."""
    eng = llm.engine
    ids = [eng.add_request(f"r{i}", p, params(i)) for i, p in enumerate(prompts)]
    rng = random.Random(seed)
    results, aborted, steps = {}, set(), 0
    while eng.has_unfinished_requests():
        steps += 1
        assert steps <= max_steps, "engine stuck"
        for out in eng.step():
            assert out.outputs[0].finish_reason != "error", out.error
            if out.finished:
                results[out.request_id] = out
        if steps in abort_at:
            live = [i for i in ids if i not in results and i not in aborted]
            if live:
                victim = rng.choice(live)
                assert eng.abort_request(victim)
                aborted.add(victim)
    return results, aborted
