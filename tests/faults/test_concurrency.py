"""add_request / abort_request from other threads while one loop steps.

Before, adding and aborting from a second thread while ``step()`` ran lost
121 of 150 requests. Now changes made during a step wait in the engine's
inbox and are applied when it ends.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from conftest import assert_idle, make_llm
from faulty_proposer import FaultyProposer
from speculant import SamplingParams
from tiny_models import random_prompts


def test_concurrent_adders_and_aborter_lose_nothing(llama_dir):
    llm = make_llm(llama_dir, "ngram", num_blocks=24)  # small pool: preemption too
    eng = llm.engine
    threads_n, per_thread = 3, 50
    added: list[tuple[str, int]] = []
    aborted: set[str] = set()
    lock = threading.Lock()
    done_adding = threading.Event()

    def adder(t: int) -> None:
        rng = random.Random(t)
        for i in range(per_thread):
            prompt = random_prompts([rng.randint(3, 12)], seed=1000 * t + i)[0]
            n = rng.randint(1, 6)
            rid = eng.add_request(f"t{t}-{i}", prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
            with lock:
                added.append((rid, n))
            time.sleep(rng.random() * 0.002)

    def aborter() -> None:
        rng = random.Random(99)
        while not done_adding.is_set():
            with lock:
                pick = rng.choice(added)[0] if added else None
            if pick is not None and eng.abort_request(pick):
                with lock:
                    aborted.add(pick)
            time.sleep(0.003)

    adders = [threading.Thread(target=adder, args=(t,)) for t in range(threads_n)]
    stopper = threading.Thread(target=aborter)
    for th in adders + [stopper]:
        th.start()
    finished: dict[str, object] = {}
    deadline = time.time() + 300
    while any(th.is_alive() for th in adders) or eng.has_unfinished_requests():
        assert time.time() < deadline, "engine loop did not drain"
        if not any(th.is_alive() for th in adders):
            done_adding.set()
        outs = eng.step()
        for out in outs:
            if out.finished:
                assert out.request_id not in finished, f"{out.request_id} finished twice"
                finished[out.request_id] = out
        if not outs:
            time.sleep(0.001)
    done_adding.set()
    stopper.join()
    for th in adders:
        th.join()
    assert len(added) == threads_n * per_thread
    ids = {rid for rid, _ in added}
    lost = ids - set(finished) - aborted
    assert not lost, f"{len(lost)} requests lost: {sorted(lost)[:5]}"
    assert set(finished) <= ids
    assert aborted, "the aborter never hit a live request"
    for rid, n in added:
        if rid in finished and rid not in aborted:
            out = finished[rid].outputs[0]
            assert out.finish_reason == "length" and len(out.token_ids) == n, (rid, out)
    assert_idle(llm)


def test_changes_during_a_step_wait_for_its_end(llama_dir):
    llm = make_llm(llama_dir, "ngram")
    eng = llm.engine
    eng.spec.proposer = FaultyProposer(eng.spec.proposer, faults=[], sleep_s=0.3)
    first = eng.add_request("first", [5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=4))
    seen = {}

    def during() -> None:
        time.sleep(0.1)  # inside the sleeping proposer of the step below
        seen["id"] = eng.add_request("late", [9, 10, 11], SamplingParams(temperature=0, max_tokens=2))
        seen["waiting"] = [r.request_id for r in eng.scheduler.waiting]
        seen["abort"] = eng.abort_request(first)
        seen["abort_again"] = eng.abort_request(first)
        seen["running"] = [r.request_id for r in eng.scheduler.running]
        with pytest.raises(RuntimeError, match="another step"):
            eng.step()
        seen["raised"] = True

    th = threading.Thread(target=during)
    th.start()
    outs = eng.step()
    th.join()
    assert seen.get("raised") and seen["id"] == "late"
    assert seen["waiting"] == [] and seen["running"] == ["first"], "a change reached the scheduler mid-step"
    assert seen["abort"] is True and seen["abort_again"] is False
    assert [o.request_id for o in outs] == ["first"]
    # applied at the end of the step: 'first' is aborted, 'late' is queued
    assert [r.request_id for r in eng.scheduler.waiting] == ["late"] and not eng.scheduler.running
    eng.spec.proposer = eng.spec.proposer.real
    while eng.has_unfinished_requests():
        eng.step()
    assert_idle(llm)


def test_one_request_id_reserved_once_across_threads(llama_dir):
    llm = make_llm(llama_dir, None)
    eng = llm.engine
    results: list[str] = []
    barrier = threading.Barrier(4)

    def add() -> None:
        barrier.wait()
        try:
            eng.add_request("same", [5, 6, 7], SamplingParams(max_tokens=1))
            results.append("ok")
        except ValueError as exc:
            assert "'same'" in str(exc) and "already in use" in str(exc)
            results.append("refused")

    ths = [threading.Thread(target=add) for _ in range(4)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert sorted(results) == ["ok", "refused", "refused", "refused"]
    while eng.has_unfinished_requests():
        eng.step()
    assert_idle(llm)
