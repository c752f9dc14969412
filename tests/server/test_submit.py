"""``Admission.submit`` hands a request to the engine from a worker thread (the
engine tokenizes there, off the event loop, which keeps serving meanwhile); a
refused request leaves no trace; a request whose client left while it was being
added is aborted once the add finishes."""

from __future__ import annotations

import asyncio
import threading

import pytest

from speculant.config.sampling_params import SamplingParams
from speculant.server.admission import Admission


class SlowEngine:
    """add_request waits for ``release`` (a long tokenization) and records its thread."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.added: list[str] = []
        self.aborted: list[str] = []
        self.threads: set[int] = set()

    def add_request(self, request_id, prompt, params):
        self.threads.add(threading.get_ident())
        assert self.release.wait(30)
        if prompt == "bad":
            raise ValueError("prompt is bad")
        self.added.append(request_id)

    def abort_request(self, request_id):
        self.aborted.append(request_id)

    def has_unfinished_requests(self):
        return False


def test_the_engine_adds_in_a_worker_thread_while_the_event_loop_keeps_running():
    engine = SlowEngine()
    loop = Admission(engine, max_queued=4)

    async def main():
        submitting = asyncio.ensure_future(loop.submit("x" * 1000, SamplingParams()))
        ticks = 0
        while ticks < 20:  # the event loop turns while add_request is blocked
            await asyncio.sleep(0.01)
            ticks += 1
        engine.release.set()
        stream = await submitting
        return stream, threading.get_ident()

    stream, event_loop_thread = asyncio.run(main())
    assert engine.added == [stream.request_id] and event_loop_thread not in engine.threads
    assert loop.num_submitted == 1 and loop.num_queued == 1


def test_a_refused_request_leaves_no_trace():
    engine = SlowEngine()
    engine.release.set()
    loop = Admission(engine, max_queued=4)
    with pytest.raises(ValueError, match="prompt is bad"):
        asyncio.run(loop.submit("bad", SamplingParams()))
    assert loop.num_queued == 0 and loop.num_in_flight == 0 and loop.num_submitted == 1


def test_a_client_gone_while_its_request_is_added_gets_it_aborted():
    engine = SlowEngine()
    loop = Admission(engine, max_queued=4)

    async def main():
        submitting = asyncio.ensure_future(loop.submit("x", SamplingParams()))
        await asyncio.sleep(0.05)
        submitting.cancel()  # what a disconnect does to the handler
        with pytest.raises(asyncio.CancelledError):
            await submitting
        engine.release.set()
        for _ in range(200):
            if engine.aborted:
                break
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert engine.aborted == engine.added and len(engine.added) == 1
    assert loop.num_queued == 0 and loop.num_in_flight == 0
