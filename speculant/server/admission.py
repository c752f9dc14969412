"""The server's way into the engine loop: bounded admission, and outputs handed to the event loop.

One ``EngineLoop`` (``speculant.engine.loop``) steps the engine in its own
thread for every connection. Request handlers run on the asyncio event loop:
``await submit(...)`` admits a request, then hands it to the engine loop from a
worker thread, because the engine tokenizes and checks the prompt there, which
takes a while for a long prompt and must not stall the event loop; it returns
an ``AsyncRequestStream``. Each step's ``RequestOutput`` for it is handed to
the event loop with ``call_soon_threadsafe`` and read with ``await stream.next()``.
``abort`` (a client that went away) reaches the engine between steps, which
frees the request's KV blocks then.

Admission is bounded: at most ``max_queued`` requests may wait for their
first step; one more is refused with ``QueueFull`` (the server's 429), so
memory never grows without bound however fast clients send.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from speculant.config.sampling_params import SamplingParams
from speculant.engine.llm_engine import LLMEngine
from speculant.engine.loop import EngineLoop, LoopClosed
from speculant.engine.request import RequestOutput

logger = logging.getLogger(__name__)

SHUT_DOWN = "was aborted: the server shut down before this request finished"


class QueueFull(Exception):
    """The waiting queue holds ``max_queued`` requests."""


class AsyncRequestStream:
    """The outputs of one request, as the engine produces them (cumulative), read on an event loop."""

    def __init__(self, request_id: str, admission: Admission) -> None:
        self.request_id = request_id
        self.admission = admission
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.started = False  # scheduled at least once (no longer counts as queued)
        self.finished = False

    def put(self, request_id: str, item: RequestOutput | BaseException) -> None:
        """From the engine loop's thread. An event loop already closed has no one left to read: the item
        is dropped, the engine loop carries on."""
        if not self.started:
            self.started = True
            self.admission.left_queue()
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


class Admission:
    def __init__(self, engine: LLMEngine, max_queued: int,
                 on_step: Callable[[float, list[RequestOutput]], None] | None = None, id_prefix: str = "srv") -> None:
        self.engine = engine
        # request ids are f"{id_prefix}-{n}": unique per server (per replica)
        self.loop = EngineLoop(engine, id_prefix=id_prefix, on_step=on_step)
        self.max_queued = max_queued
        self._lock = threading.Lock()
        self._num_queued = 0
        self._stopping = False
        self.num_submitted = 0  # requests handed to the engine (refused ones included)

    @property
    def num_queued(self) -> int:
        return self._num_queued

    @property
    def num_in_flight(self) -> int:
        return self.loop.num_in_flight

    def start(self) -> None:
        """Start stepping; call it from the thread that loaded the engine (``EngineLoop.start``)."""
        self.loop.start()

    def left_queue(self) -> None:
        with self._lock:
            self._num_queued -= 1

    async def submit(self, prompt: str | list[int], params: SamplingParams) -> AsyncRequestStream:
        """Admit a request and hand it to the engine from a worker thread; raises ``QueueFull``, or
        ValueError / TypeError from the engine's checks (a bad prompt). A caller cancelled meanwhile (its
        client left) leaves the worker to finish, and a request that was added is then aborted."""
        stream = self._admit()
        adding = asyncio.ensure_future(asyncio.to_thread(self._add, stream, prompt, params))
        try:
            await asyncio.shield(adding)
        except asyncio.CancelledError:
            adding.add_done_callback(lambda done: self._added_for_nobody(stream, done))
            raise
        return stream

    def _admit(self) -> AsyncRequestStream:
        stream = AsyncRequestStream(self.loop.new_id(), self)
        with self._lock:
            if self._stopping:
                raise LoopClosed("the server is shutting down")
            if self._num_queued >= self.max_queued:
                raise QueueFull(f"{self._num_queued} requests are waiting (--max-queued {self.max_queued})")
            self._num_queued += 1
        return stream

    def _add(self, stream: AsyncRequestStream, prompt: str | list[int], params: SamplingParams) -> None:
        """In a worker thread: tokenizing a long prompt takes a while."""
        with self._lock:
            self.num_submitted += 1
        try:
            self.loop.submit(prompt, params, stream, stream.request_id)
        except BaseException:
            self.left_queue()
            raise

    def _added_for_nobody(self, stream: AsyncRequestStream, adding: asyncio.Future) -> None:
        if not adding.cancelled() and adding.exception() is None:
            self.abort(stream)

    def abort(self, stream: AsyncRequestStream) -> None:
        """The client is gone: drop the request (its blocks are freed between steps)."""
        self.loop.abort(stream.request_id)

    def stop(self, timeout: float = 10.0) -> None:
        """Abort whatever is still in flight and end the engine loop's thread."""
        with self._lock:
            self._stopping = True
        self.loop.stop(timeout, SHUT_DOWN)
