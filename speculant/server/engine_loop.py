"""One engine loop in a background thread, feeding every connection.

The thread calls ``LLMEngine.step()`` while any request is unfinished and
sleeps on a condition otherwise. Request handlers run on the asyncio event
loop: ``await submit(...)`` admits a request, then hands it to the engine
(``LLMEngine.add_request``, thread-safe, errors raised to the caller) from a
worker thread, because that tokenizes and checks the prompt, which takes a
while for a long prompt and must not stall the event loop; it returns a
``RequestStream``. Each step's ``RequestOutput`` for it is handed to the
event loop with ``call_soon_threadsafe`` and read with ``await stream.next()``. ``abort``
(a client that went away) reaches the engine between steps, which frees the
request's KV blocks then.

Admission is bounded: at most ``max_queued`` requests may wait for their
first step; one more is refused with ``QueueFull`` (the server's 429), so
memory never grows without bound however fast clients send.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from speculant.config.sampling_params import SamplingParams
from speculant.engine.llm_engine import LLMEngine
from speculant.engine.openmp_pool import release_openmp_pool
from speculant.engine.request import RequestOutput

logger = logging.getLogger(__name__)


class QueueFull(Exception):
    """The waiting queue holds ``max_queued`` requests."""


@dataclass
class RequestStream:
    """The outputs of one request, as the engine produces them (cumulative)."""

    request_id: str
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput | BaseException] = field(default_factory=asyncio.Queue)
    started: bool = False  # scheduled at least once (no longer counts as queued)
    finished: bool = False

    def put(self, item: RequestOutput | BaseException) -> None:
        """From the engine thread. An event loop already closed has no one left
        to read: the item is dropped, the engine thread carries on."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:
            logger.warning("request %r: its event loop is closed; output dropped", self.request_id)

    async def next(self) -> RequestOutput:
        item = await self.queue.get()
        if isinstance(item, BaseException):
            raise item
        if item.finished:
            self.finished = True
        return item


class EngineLoop:
    def __init__(self, engine: LLMEngine, max_queued: int,
                 on_step: Callable[[float, list[RequestOutput]], None] | None = None, id_prefix: str = "srv") -> None:
        self.engine = engine
        self.id_prefix = id_prefix  # request ids are f"{id_prefix}-{n}": unique per server (per replica)
        self.max_queued = max_queued
        self.on_step = on_step  # (step seconds, outputs), from the engine thread
        self._cv = threading.Condition()
        self._streams: dict[str, RequestStream] = {}
        self._num_queued = 0
        self._ids = itertools.count()
        self._stopping = False
        self.num_submitted = 0  # add_request calls (refused ones included)
        self._thread = threading.Thread(target=self._run, name="speculant-engine", daemon=True)

    @property
    def num_queued(self) -> int:
        return self._num_queued

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def start(self) -> None:
        """Start stepping; call it from the thread that loaded the engine, which gives its
        OpenMP pool back (``openmp_pool``: two pools would slow every parallel region)."""
        release_openmp_pool()
        self._thread.start()

    async def submit(self, prompt: str | list[int], params: SamplingParams) -> RequestStream:
        """Admit a request and hand it to the engine from a worker thread; raises
        ``QueueFull``, or ValueError / TypeError from the engine's checks (a bad
        prompt). A caller cancelled meanwhile (its client left) leaves the worker
        to finish, and a request that was added is then aborted."""
        stream = self._admit()
        adding = asyncio.ensure_future(asyncio.to_thread(self._add, stream, prompt, params))
        try:
            await asyncio.shield(adding)
        except asyncio.CancelledError:
            adding.add_done_callback(lambda done: self._added_for_nobody(stream, done))
            raise
        return stream

    def _admit(self) -> RequestStream:
        stream = RequestStream(f"{self.id_prefix}-{next(self._ids)}", asyncio.get_running_loop())
        with self._cv:
            if self._stopping:
                raise RuntimeError("the server is shutting down")
            if self._num_queued >= self.max_queued:
                raise QueueFull(f"{self._num_queued} requests are waiting (--max-queued {self.max_queued})")
            # registered first: the engine thread may step the request before add_request returns
            self._num_queued += 1
            self._streams[stream.request_id] = stream
        return stream

    def _add(self, stream: RequestStream, prompt: str | list[int], params: SamplingParams) -> None:
        """In a worker thread: tokenizing a long prompt takes a while."""
        with self._cv:
            self.num_submitted += 1
        try:
            self.engine.add_request(stream.request_id, prompt, params)
        except BaseException:
            with self._cv:
                self._num_queued -= 1
                del self._streams[stream.request_id]
            raise
        with self._cv:
            self._cv.notify()

    def _added_for_nobody(self, stream: RequestStream, adding: asyncio.Future) -> None:
        if not adding.cancelled() and adding.exception() is None:
            self.abort(stream)

    def abort(self, stream: RequestStream) -> None:
        """The client is gone: drop the request (its blocks are freed between steps)."""
        with self._cv:
            if self._streams.pop(stream.request_id, None) is not None and not stream.started:
                self._num_queued -= 1
        self.engine.abort_request(stream.request_id)

    def stop(self, timeout: float = 10.0) -> None:
        """Abort whatever is still in flight and end the thread."""
        with self._cv:
            self._stopping = True
            streams = list(self._streams.values())
            self._cv.notify()
        for stream in streams:
            self.engine.abort_request(stream.request_id)
            stream.put(RuntimeError("the server shut down before this request finished"))
        self._thread.join(timeout)

    # --- the engine thread ----------------------------------------------------
    def _wait_for_work(self) -> bool:
        with self._cv:
            while not self._stopping and not self.engine.has_unfinished_requests():
                self._cv.wait()
            return not self._stopping

    def _run(self) -> None:
        while self._wait_for_work():
            start = time.perf_counter()
            try:
                outputs = self.engine.step()
            except Exception as exc:  # the engine's own guard failed: fail what is in flight
                logger.exception("engine step raised; failing the requests in flight")
                self._fail_all(exc)
                continue
            seconds = time.perf_counter() - start
            self._deliver(outputs)
            if self.on_step is not None:
                self.on_step(seconds, outputs)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        with self._cv:
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if stream is None:
                    continue  # aborted by its client
                if not stream.started:
                    stream.started = True
                    self._num_queued -= 1
                if out.finished:
                    del self._streams[out.request_id]
                stream.put(out)

    def _fail_all(self, exc: Exception) -> None:
        with self._cv:
            streams = list(self._streams.values())
        for stream in streams:
            self.abort(stream)
            stream.put(RuntimeError(f"the engine step failed: {type(exc).__name__}: {exc}"))
