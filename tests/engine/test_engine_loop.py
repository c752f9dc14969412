"""``EngineLoop``: requests from several threads, streams in step order, aborts, step failures and
shutdown, on a real (tiny) engine, both stepped by the loop's own thread and by the waiting caller."""

from __future__ import annotations

import threading

import pytest

from speculant import LLMEngine, SamplingParams
from speculant.config.models import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from speculant.engine.loop import EngineLoop, LoopClosed, Mailbox, RequestAborted, StepFailed
from tiny_models import random_prompts

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = random_prompts([5, 19, 11, 7, 13, 9], seed=48)  # 19 > budget 8: chunked over three steps
TIMEOUT = 60


@pytest.fixture
def engine(llama_dir) -> LLMEngine:
    return LLMEngine(EngineConfig(
        model=ModelConfig(path=str(llama_dir)), cache=CacheConfig(block_size=4),
        scheduler=SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=4)))


@pytest.fixture(scope="module")
def solo(llama_dir) -> dict[tuple[int, int], list[int]]:
    """Each prompt's greedy tokens, run alone through the engine's own steps (no loop)."""
    engine = LLMEngine(EngineConfig(model=ModelConfig(path=str(llama_dir)), cache=CacheConfig(block_size=4)))
    cache: dict[tuple[int, int], list[int]] = {}
    for i, prompt in enumerate(PROMPTS):
        for n in (6, 12):
            engine.add_request(f"solo-{i}-{n}", prompt, greedy(n))
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished:
                        cache[i, n] = list(out.outputs[0].token_ids)
    return cache


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def run_threads(target, n: int) -> None:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a caller is still waiting: the loop hung"


@pytest.mark.parametrize("threaded", [True, False], ids=["own-thread", "caller-steps"])
def test_requests_from_several_threads_each_equal_their_solo_run(engine, solo, threaded):
    loop = EngineLoop(engine)
    if threaded:
        loop.start()
    got: dict[int, list[int]] = {}

    def client(i: int) -> None:
        stream = loop.stream(PROMPTS[i], greedy(12))
        *_, last = stream
        assert last.finished and last.outputs[0].finish_reason == "length"
        got[i] = list(last.outputs[0].token_ids)

    run_threads(client, len(PROMPTS))
    loop.stop()
    assert got == {i: solo[i, 12] for i in range(len(PROMPTS))}
    assert not engine.has_unfinished_requests() and loop.num_in_flight == 0


def test_a_stream_grows_step_by_step_and_finishes_once(engine, solo):
    loop = EngineLoop(engine)
    streams = [loop.stream(p, greedy(6)) for p in PROMPTS[:3]]
    for i, stream in enumerate(streams):
        seen: list[list[int]] = []
        for out in stream:
            assert out.request_id == stream.request_id
            tokens = list(out.outputs[0].token_ids)
            if seen:
                assert tokens[: len(seen[-1])] == seen[-1], "a stream's tokens changed instead of growing"
            assert out.finished == (len(tokens) == 6)
            seen.append(tokens)
        assert seen[-1] == solo[i, 6]
        assert stream.finished and sum(1 for s in seen if len(s) == 6) == 1


def test_abort_mid_stream_ends_that_stream_and_the_others_finish(engine, solo):
    loop = EngineLoop(engine)
    loop.start()
    doomed, others = loop.stream(PROMPTS[0], greedy(200)), [loop.stream(p, greedy(12)) for p in PROMPTS[1:3]]
    first = doomed.next(TIMEOUT)
    second = doomed.next(TIMEOUT)
    assert not second.finished and len(second.outputs[0].token_ids) >= len(first.outputs[0].token_ids)
    assert loop.abort(doomed.request_id) is True
    with pytest.raises(RequestAborted, match=rf"request '{doomed.request_id}' was aborted before it finished"):
        while True:
            doomed.next(TIMEOUT)
    assert loop.abort(doomed.request_id) is False  # once only
    for i, stream in enumerate(others, start=1):
        *_, last = stream
        assert list(last.outputs[0].token_ids) == solo[i, 12]
    loop.stop()
    assert not engine.has_unfinished_requests()
    assert engine.occupancy()["num_running"] == 0


def test_an_error_in_a_step_reaches_every_waiting_caller_and_the_loop_serves_on(engine, solo):
    loop = EngineLoop(engine)
    loop.start()
    step = engine.step
    calls = {"n": 0}
    gate = threading.Event()

    def failing_once():
        calls["n"] += 1
        if calls["n"] == 3:
            assert gate.wait(TIMEOUT)  # every caller is waiting by now
            raise MemoryError("no memory for the step")
        return step()

    engine.step = failing_once  # type: ignore[method-assign]
    streams = [loop.stream(p, greedy(12)) for p in PROMPTS[:3]]
    errors: dict[int, BaseException] = {}

    def client(i: int) -> None:
        try:
            for _ in streams[i]:
                pass
        except StepFailed as exc:
            errors[i] = exc

    waiting = [threading.Thread(target=client, args=(i,)) for i in range(3)]
    for t in waiting:
        t.start()
    gate.set()
    for t in waiting:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in waiting), "a caller still waits after the step failed"
    assert sorted(errors) == [0, 1, 2]
    for i, exc in errors.items():
        assert str(exc) == (f"request '{streams[i].request_id}' failed: the engine step raised MemoryError: "
                            "no memory for the step")
        assert isinstance(exc.__cause__, MemoryError)
    # the failed requests were aborted (blocks freed); later requests run as if nothing happened
    box = Mailbox(loop)
    ids = [loop.submit(p, greedy(6), box) for p in PROMPTS[3:]]
    done: dict[str, list[int]] = {}
    while len(done) < len(ids):
        for rid, out in box.take(timeout=TIMEOUT):
            assert not isinstance(out, BaseException), out
            done[rid] = list(out.outputs[0].token_ids)
    assert [done[rid] for rid in ids] == [solo[i, 6] for i in range(3, len(PROMPTS))]
    loop.stop()


def test_a_request_aborted_behind_the_loop_s_back_does_not_hang_its_caller(engine):
    loop = EngineLoop(engine)
    stream = loop.stream(PROMPTS[0], greedy(50))
    stream.next()
    engine.abort_request(stream.request_id)  # not through the loop
    with pytest.raises(RequestAborted, match="aborted outside the engine loop"):
        for _ in stream:
            pass


def test_shutdown_with_requests_pending_fails_them_and_refuses_more(engine):
    loop = EngineLoop(engine)
    loop.start()
    streams = [loop.stream(p, greedy(500)) for p in PROMPTS[:5]]  # more than max_num_seqs: some still queued
    streams[0].next(TIMEOUT)
    loop.stop(why="was aborted: shutting down")
    for stream in streams:
        with pytest.raises(RequestAborted, match=rf"request '{stream.request_id}' was aborted: shutting down"):
            while True:
                stream.next(TIMEOUT)
    with pytest.raises(LoopClosed, match="the engine loop is stopped"):
        loop.stream(PROMPTS[0], greedy(4))
    assert not any(t.name == "speculant-engine" for t in threading.enumerate())
    assert not engine.has_unfinished_requests()


def test_a_refused_prompt_leaves_nothing_behind(engine):
    loop = EngineLoop(engine)
    with pytest.raises(ValueError, match=r"prompt token ids \[1000000000\] are outside the vocabulary"):
        loop.stream([1, 10**9], greedy(4))
    assert loop.num_in_flight == 0 and not engine.has_unfinished_requests()
    with pytest.raises(RuntimeError, match="waiting for outputs of no request"):
        Mailbox(loop).take()


def test_an_abort_while_the_request_is_being_added_leaves_nothing_running(engine):
    loop = EngineLoop(engine)
    entered, release = threading.Event(), threading.Event()
    add = engine.add_request

    def slow_add(*args, **kwargs):  # a long prompt being tokenized
        entered.set()
        assert release.wait(TIMEOUT)
        return add(*args, **kwargs)

    engine.add_request = slow_add  # type: ignore[method-assign]
    box = Mailbox(loop)
    adding = threading.Thread(target=loop.submit, args=(PROMPTS[0], greedy(50), box, "late-1"))
    adding.start()
    assert entered.wait(TIMEOUT)
    assert loop.abort("late-1") is True
    release.set()
    adding.join(TIMEOUT)
    [(rid, item)] = box.take(timeout=TIMEOUT)
    assert rid == "late-1" and isinstance(item, RequestAborted)
    assert not engine.has_unfinished_requests() and loop.num_in_flight == 0
