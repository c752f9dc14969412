"""Scheduler unit tests with fake requests (no model): the token budget,
decodes before prefill chunks, the prefill | decode layout, chunking and which
chunks sample, max_num_seqs, preemption by recompute, chunking off.

``commit`` below stands in for the model step: it advances each scheduled
request as the engine does and appends a fake token wherever one is sampled.
"""

from __future__ import annotations

import pytest

from speculant.config.models import SchedulerConfig
from speculant.config.sampling_params import SamplingParams
from speculant.engine.batch import StepBatch
from speculant.engine.block_manager import BlockManager
from speculant.engine.request import Request, RequestStatus
from speculant.engine.scheduler import Scheduler

FAKE_TOKEN = 7


def make_request(rid: str, num_prompt: int, max_tokens: int = 100) -> Request:
    return Request(request_id=rid, prompt=None, prompt_token_ids=list(range(2, 2 + num_prompt)),
                   params=SamplingParams(temperature=0.0, max_tokens=max_tokens), seed=0)


def make_scheduler(budget: int, max_seqs: int, *, num_blocks: int = 64, block_size: int = 4,
                   chunked: bool = True, max_model_len: int = 256) -> Scheduler:
    cfg = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, enable_chunked_prefill=chunked)
    return Scheduler(cfg, BlockManager(num_blocks, block_size), max_model_len)


def add(sched: Scheduler, *requests: Request) -> None:
    for r in requests:
        sched.add(r)


def shape(batch: StepBatch) -> tuple[list, list]:
    """(prefills, decodes) as (request_id, num_new_tokens, samples) tuples."""
    def rows(entries):
        return [(s.request.request_id, s.num_new_tokens, s.samples) for s in entries]
    return rows(batch.prefills), rows(batch.decodes)


def commit(batch: StepBatch) -> None:
    for s in batch.entries:
        samples = s.samples  # read before num_computed_tokens moves
        s.request.num_computed_tokens += s.num_new_tokens
        if samples:
            s.request.token_ids.append(FAKE_TOKEN)


def finish(sched: Scheduler, req: Request) -> None:
    req.status = RequestStatus.FINISHED
    sched.remove(req)


def step(sched: Scheduler) -> tuple[list, list]:
    batch = sched.schedule()
    check_batch(sched, batch)
    rows = shape(batch)
    commit(batch)
    return rows


def check_batch(sched: Scheduler, batch: StepBatch) -> None:
    """Invariants every batch must satisfy."""
    cfg = sched.config
    assert batch.num_tokens <= cfg.max_num_batched_tokens or (
        not cfg.enable_chunked_prefill and len(batch.entries) == 1), "token budget exceeded"
    assert len(batch.entries) <= cfg.max_num_seqs
    ids = [s.request.request_id for s in batch.entries]
    assert len(ids) == len(set(ids)), "a request scheduled twice in one step"
    assert batch.entries == batch.prefills + batch.decodes, "layout must be prefill | decode"
    for s in batch.entries:
        assert s.request.status is RequestStatus.RUNNING
        assert s.num_new_tokens >= 1
        slots = len(sched.blocks.block_table(s.request.request_id)) * sched.blocks.block_size
        assert slots >= s.start + s.num_new_tokens, "scheduled tokens without KV slots"
    for d in batch.decodes:
        assert d.num_new_tokens == 1 and d.request.is_decoding and d.samples
    for p in batch.prefills:
        assert not p.request.is_decoding


# --- budget, order, chunks -------------------------------------------------------

def test_decodes_first_then_prefill_chunks_fill_the_rest():
    sched = make_scheduler(budget=8, max_seqs=4)
    r0, r1 = make_request("r0", 4), make_request("r1", 20)
    add(sched, r0)
    assert step(sched) == ([("r0", 4, True)], [])
    add(sched, r1)
    # r0 decodes first; r1's prompt gets the 7 tokens left, in non-terminal chunks
    assert step(sched) == ([("r1", 7, False)], [("r0", 1, True)])
    assert step(sched) == ([("r1", 7, False)], [("r0", 1, True)])
    assert step(sched) == ([("r1", 6, True)], [("r0", 1, True)])  # terminal chunk samples
    assert step(sched) == ([], [("r0", 1, True), ("r1", 1, True)])
    assert r1.num_output_tokens == 2 and r0.num_output_tokens == 5


def test_non_terminal_chunks_do_not_sample():
    sched = make_scheduler(budget=5, max_seqs=2)
    r0 = make_request("r0", 12)
    add(sched, r0)
    assert [step(sched) for _ in range(3)] == [
        ([("r0", 5, False)], []), ([("r0", 5, False)], []), ([("r0", 2, True)], [])]
    assert r0.token_ids[12:] == [FAKE_TOKEN] and r0.num_output_tokens == 1


def test_several_prompts_chunked_in_one_step():
    sched = make_scheduler(budget=10, max_seqs=4)
    add(sched, make_request("r0", 3), make_request("r1", 4), make_request("r2", 6))
    assert step(sched) == ([("r0", 3, True), ("r1", 4, True), ("r2", 3, False)], [])
    assert step(sched) == ([("r2", 3, True)], [("r0", 1, True), ("r1", 1, True)])


def test_partially_prefilled_request_continues_before_new_ones():
    sched = make_scheduler(budget=8, max_seqs=4)
    add(sched, make_request("r0", 12), make_request("r1", 5))
    assert step(sched) == ([("r0", 8, False)], [])
    assert step(sched) == ([("r0", 4, True), ("r1", 4, False)], [])
    assert step(sched) == ([("r1", 1, True)], [("r0", 1, True)])


def test_max_num_seqs_limits_running_requests():
    sched = make_scheduler(budget=16, max_seqs=2)
    r0, r1, r2 = (make_request(f"r{i}", 3) for i in range(3))
    add(sched, r0, r1, r2)
    assert step(sched) == ([("r0", 3, True), ("r1", 3, True)], [])
    assert step(sched) == ([], [("r0", 1, True), ("r1", 1, True)])
    assert r2.status is RequestStatus.WAITING
    finish(sched, r0)
    assert step(sched) == ([("r2", 3, True)], [("r1", 1, True)])


def test_budget_and_invariants_hold_until_everything_finishes():
    """A mixed workload run to completion: every batch within budget and seats,
    nothing starves, every prompt fully prefilled exactly once."""
    lengths = [3, 20, 7, 1, 40, 12, 9, 30, 2, 16]
    sched = make_scheduler(budget=10, max_seqs=4, num_blocks=40)
    reqs = [make_request(f"r{i}", n, max_tokens=5) for i, n in enumerate(lengths)]
    add(sched, *reqs)
    prefilled = {r.request_id: 0 for r in reqs}
    for _ in range(200):
        if not sched.num_unfinished:
            break
        batch = sched.schedule()
        check_batch(sched, batch)
        assert not batch.is_empty, "unfinished requests but an empty batch: the engine would spin"
        for p in batch.prefills:
            prefilled[p.request.request_id] += p.num_new_tokens
        commit(batch)
        for r in reqs:
            if not r.finished and r.num_output_tokens >= r.params.max_tokens:
                finish(sched, r)
    assert sched.num_unfinished == 0
    assert all(r.num_output_tokens == 5 for r in reqs)
    assert prefilled == {r.request_id: n for r, n in zip(reqs, lengths)}  # no preemption here
    assert sched.blocks.num_free_blocks == 40


# --- preemption -------------------------------------------------------------------

def test_preempts_the_latest_arrival_when_blocks_run_out():
    sched = make_scheduler(budget=16, max_seqs=4, num_blocks=4, block_size=4)
    r0, r1 = make_request("r0", 7), make_request("r1", 7)
    add(sched, r0, r1)
    assert step(sched) == ([("r0", 7, True), ("r1", 7, True)], [])  # 2 blocks each: pool full
    assert step(sched) == ([], [("r0", 1, True), ("r1", 1, True)])  # position 7 still in block 2
    batch = sched.schedule()  # r0 needs a third block for position 8: r1 must go
    check_batch(sched, batch)
    assert batch.preempted == [r1]
    assert shape(batch) == ([], [("r0", 1, True)])
    assert r1.status is RequestStatus.WAITING and r1.num_computed_tokens == 0 and r1.num_preemptions == 1
    assert r1.token_ids == r1.prompt_token_ids + [FAKE_TOKEN] * 2, "preemption must keep generated tokens"
    assert not sched.blocks.has("r1") and sched.waiting[0] is r1
    commit(batch)
    finish(sched, r0)
    # recompute: prompt + outputs except the last one, in one chunk that samples nothing; the last
    # output is then fed as a decode, exactly as if r1 had never been preempted
    assert step(sched) == ([("r1", 8, False)], [])
    assert r1.num_output_tokens == 2 and r1.is_decoding
    assert step(sched) == ([], [("r1", 1, True)])
    assert r1.num_output_tokens == 3


def test_latest_arrival_preempts_itself():
    sched = make_scheduler(budget=16, max_seqs=4, num_blocks=4, block_size=4)
    r0, r1 = make_request("r0", 5), make_request("r1", 8)
    add(sched, r0, r1)
    step(sched)
    batch = sched.schedule()  # r1 (latest) needs a third block; r0 still fits
    check_batch(sched, batch)
    assert batch.preempted == [r1] and shape(batch) == ([], [("r0", 1, True)])
    assert r0.status is RequestStatus.RUNNING and sched.blocks.has("r0")


def test_request_larger_than_the_whole_pool_is_an_error_not_a_hang():
    sched = make_scheduler(budget=16, max_seqs=2, num_blocks=2, block_size=4)
    r0 = make_request("r0", 7)
    add(sched, r0)
    step(sched)  # 8 tokens: both blocks used
    step(sched)  # position 7 fits; now 9 tokens
    with pytest.raises(RuntimeError, match="cache.num_blocks"):
        sched.schedule()


# --- chunking off -------------------------------------------------------------------

def test_chunking_off_schedules_only_whole_prompts():
    sched = make_scheduler(budget=10, max_seqs=4, chunked=False)
    add(sched, make_request("r0", 6), make_request("r1", 6))
    assert step(sched) == ([("r0", 6, True)], [])  # r1 does not fit in the 4 left, and is not split
    assert step(sched) == ([("r1", 6, True)], [("r0", 1, True)])


def test_chunking_off_recompute_longer_than_budget_runs_alone():
    """A preempted request recomputes prompt + output (but the last token),
    which may exceed the budget; with chunking off it waits for an empty step
    and runs alone."""
    sched = make_scheduler(budget=8, max_seqs=4, chunked=False)
    r0 = make_request("r0", 2)
    add(sched, r0)
    step(sched)
    r1 = make_request("r1", 4)
    r1.token_ids += [FAKE_TOKEN] * 7  # as if preempted after 7 outputs: 11 tokens > budget 8
    add(sched, r1)
    assert step(sched) == ([], [("r0", 1, True)])
    finish(sched, r0)
    assert step(sched) == ([("r1", 10, False)], [])  # all but the last token, which is then decoded
    assert step(sched) == ([], [("r1", 1, True)])


def test_chunking_off_prompt_over_budget_is_refused_at_add_request(llama_dir):
    from speculant import LLM

    llm = LLM(str(llama_dir), enable_chunked_prefill=False, max_num_batched_tokens=16, max_num_seqs=4)
    engine = llm.engine
    with pytest.raises(ValueError) as err:
        engine.add_request(None, list(range(2, 19)), SamplingParams(max_tokens=2))  # 17 tokens
    msg = str(err.value)
    assert "17" in msg and "scheduler.max_num_batched_tokens" in msg and "enable_chunked_prefill" in msg
    assert not engine.has_unfinished_requests()
    out = llm.generate([list(range(2, 18))], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3  # 16 tokens fit exactly
