"""The one loop that steps an engine: submission, streaming, aborts and step failures, for every front end.

``EngineLoop(engine)`` is the only caller of ``LLMEngine.step()`` outside the
engine package (``tests/engine/test_one_loop.py``). Requests come in through
``submit`` from any thread; each one's outputs go to a ``Sink``: a
``RequestStream`` (one request, every step's output, in order: the server,
the chat, the bench) or a ``Mailbox`` (many requests' finished outputs:
``LLM.generate``, batch jobs). Two ways to step, one step routine:

- **its own thread** (``start()``: the server, a Ray actor). The thread that
  calls ``start`` (the one that loaded the engine) first gives back its OpenMP
  pool (``openmp_pool``: two pools on a small machine slow every parallel
  region by 25-35%). The thread sleeps while there is nothing to do.
- **the waiting caller's thread** (no ``start``: ``LLM.generate``, the CLI
  chat, the bench, a local batch job). A caller waiting on its sink steps the
  engine itself, one caller at a time, so a single-threaded program runs its
  steps in the thread that loaded the model, with no hand-off at all.

``feed`` (optional) is called by the stepping thread before every step: a
batch job tops up its in-flight window there, between steps, as a plain loop
would.

Faults: ``LLMEngine.step`` blames a faulty request itself (its output has
finish_reason "error"). Should ``step()`` itself raise, no request can be
blamed: every request in flight is aborted and its sink gets ``StepFailed``
naming the cause; the loop keeps serving what comes next. A request aborted
through ``abort`` gets ``RequestAborted``, as does one aborted behind the
loop's back (``LLMEngine.abort_request`` directly), at the latest when the
engine runs out of work: no caller waits for ever.

Exit: a stepping thread is a daemon, so a program may end while it runs. At
interpreter exit (``atexit``, before daemon threads are frozen) every loop
still stepping is stopped and its thread joined, so no step is left inside
torch's or the kernels' OpenMP regions while the runtime's own destructors
run (that ended test processes with a segfault after all tests passed).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from speculant.engine.openmp_pool import release_openmp_pool

if TYPE_CHECKING:  # the Ray batch driver imports the batch runner, which imports this module: no model code
    from speculant.config.sampling_params import SamplingParams
    from speculant.engine.llm_engine import LLMEngine
    from speculant.engine.request import RequestOutput

logger = logging.getLogger(__name__)

_STEPPING: weakref.WeakSet[EngineLoop] = weakref.WeakSet()  # loops with a thread of their own, until stopped


@atexit.register
def _stop_stepping_loops() -> None:
    """Stop every loop whose thread may still be stepping (module doc, Exit)."""
    for loop in list(_STEPPING):
        loop.stop(timeout=30.0, why="was aborted: the program exited before it finished")

class RequestAborted(RuntimeError):
    """The request was aborted before it finished (by its caller, a shutdown, or from outside the loop)."""


class StepFailed(RuntimeError):
    """``LLMEngine.step()`` raised with this request in flight; the request was aborted."""


class LoopClosed(RuntimeError):
    """``submit`` after ``stop``."""


class Sink(Protocol):
    """Where the loop puts a request's outputs: called by the stepping thread, under the loop's lock."""

    def put(self, request_id: str, item: RequestOutput | BaseException) -> None: ...


class RequestStream:
    """One request's outputs, every step's (cumulative text and tokens), in step order; read from one thread."""

    def __init__(self, loop: EngineLoop, request_id: str) -> None:
        self.loop = loop
        self.request_id = request_id
        self.items: deque[RequestOutput | BaseException] = deque()
        self.finished = False

    def put(self, request_id: str, item: RequestOutput | BaseException) -> None:
        self.items.append(item)

    def next(self, timeout: float | None = None) -> RequestOutput:
        """The next output (waiting, or stepping the engine when no thread does); raises what failed it."""
        self.loop.wait(lambda: bool(self.items), timeout)
        item = self.items.popleft()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    def __iter__(self) -> Iterator[RequestOutput]:
        while not self.finished:
            yield self.next()


class Mailbox:
    """The finished outputs (or failures) of many requests, in finishing order."""

    def __init__(self, loop: EngineLoop) -> None:
        self.loop = loop
        self.items: deque[tuple[str, RequestOutput | BaseException]] = deque()

    def put(self, request_id: str, item: RequestOutput | BaseException) -> None:
        if isinstance(item, BaseException) or item.finished:
            self.items.append((request_id, item))

    def take(self, timeout: float | None = None) -> list[tuple[str, RequestOutput | BaseException]]:
        """Wait until something finished, then everything that has."""
        self.loop.wait(lambda: bool(self.items), timeout)
        with self.loop.lock:
            taken = list(self.items)
            self.items.clear()
        return taken


class EngineLoop:
    def __init__(self, engine: LLMEngine, *, id_prefix: str = "req",
                 on_step: Callable[[float, list[RequestOutput]], None] | None = None,
                 feed: Callable[[], None] | None = None) -> None:
        self.engine = engine
        self.id_prefix = id_prefix  # request ids are f"{id_prefix}-{n}", unique per loop
        self.on_step = on_step  # (step seconds, outputs), from the stepping thread
        self.feed = feed
        self.lock = threading.Condition()
        self._sinks: dict[str, Sink] = {}
        self._adding: set[str] = set()  # registered, add_request not returned yet: not in the engine yet
        self._wakeups = 0  # counts submits and ``wake`` calls: a stepping thread sleeps only if none came
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stepping = False  # a thread is inside ``_step_once``
        self._stopping = False

    @property
    def num_in_flight(self) -> int:
        return len(self._sinks)

    # --- requests, from any thread --------------------------------------------
    def new_id(self) -> str:
        return f"{self.id_prefix}-{next(self._ids)}"

    def submit(self, prompt: str | list[int], params: SamplingParams | None, sink: Sink,
               request_id: str | None = None) -> str:
        """Queue a request whose outputs go to ``sink``; returns its id (``request_id``, else a new one).
        Raises ``LoopClosed`` after ``stop``, and the engine's own ValueError / TypeError for a bad prompt
        or parameters (nothing is left queued then)."""
        request_id = request_id or self.new_id()
        with self.lock:
            if self._stopping:
                raise LoopClosed("the engine loop is stopped: it takes no more requests (its server or job "
                                 "is shutting down)")
            if request_id in self._sinks:
                raise ValueError(f"request_id {request_id!r} is already in flight in this engine loop; "
                                 "pick a unique id")
            # registered first: a stepping thread may run the request before add_request returns
            self._sinks[request_id] = sink
            self._adding.add(request_id)
        try:
            self.engine.add_request(request_id, prompt, params)
        except BaseException:
            with self.lock:
                self._sinks.pop(request_id, None)
                self._adding.discard(request_id)
            raise
        with self.lock:
            self._adding.discard(request_id)
            aborted = self._sinks.get(request_id) is not sink  # by ``abort`` or ``stop`` while it was added
            self._wakeups += 1
            self.lock.notify_all()
        if aborted:
            self.engine.abort_request(request_id)
        return request_id

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None) -> RequestStream:
        """Queue a request and return its stream of outputs."""
        stream = RequestStream(self, self.new_id())
        self.submit(prompt, params, stream, stream.request_id)
        return stream

    def abort(self, request_id: str, why: str = "was aborted before it finished") -> bool:
        """Drop a request: its sink gets ``RequestAborted`` now, its blocks are freed between steps.
        False if the loop no longer holds it (finished, or aborted already)."""
        with self.lock:
            sink = self._sinks.pop(request_id, None)
            if sink is not None:
                sink.put(request_id, RequestAborted(f"request {request_id!r} {why}"))
                self.lock.notify_all()
        if sink is not None:
            self.engine.abort_request(request_id)
        return sink is not None

    def wake(self) -> None:
        """Tell the stepping thread there may be work (a ``feed`` has new requests)."""
        with self.lock:
            self._wakeups += 1
            self.lock.notify_all()

    # --- stepping ---------------------------------------------------------------
    def start(self, name: str = "speculant-engine") -> None:
        """Step in a thread of the loop's own. Call it from the thread that loaded the engine."""
        if self._thread is not None:
            raise RuntimeError("EngineLoop.start() called twice: one loop has one stepping thread")
        release_openmp_pool()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        _STEPPING.add(self)
        self._thread.start()

    def stop(self, timeout: float = 10.0, why: str = "was aborted: the engine loop stopped before it finished"
             ) -> None:
        """Refuse new requests, abort those in flight (their sinks get ``RequestAborted`` saying ``why``),
        end the thread (called from it, by a ``feed``: it ends after this step)."""
        with self.lock:
            self._stopping = True
            ids = list(self._sinks)
        for request_id in ids:
            self.abort(request_id, why)
        self.wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if not self._thread.is_alive():
                _STEPPING.discard(self)

    def wait(self, ready: Callable[[], bool], timeout: float | None = None) -> None:
        """Return once ``ready()`` (checked under the loop's lock). Without a thread of the loop's own, the
        waiting caller steps the engine (one at a time); raises TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self.lock:
                if ready():
                    return
                if self._thread is not None or self._stepping:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError(f"no output within {timeout} s")
                    self.lock.wait(left)
                    continue
                self._stepping = True
            try:
                worked = self._step_once()
            finally:
                with self.lock:
                    self._stepping = False
                    self.lock.notify_all()
            with self.lock:
                if not worked and not ready():
                    raise RuntimeError("waiting for outputs of no request: nothing is in flight in the engine "
                                       "loop (submit a request first)")

    def _run(self) -> None:
        while True:
            with self.lock:
                seen = self._wakeups
            self._feed()
            with self.lock:
                if self._stopping:
                    return
                if not self.engine.has_unfinished_requests():
                    self._fail_orphans()
                    if self._wakeups == seen:  # nothing arrived since the feed: sleep until something does
                        self.lock.wait()
                    continue
                self._stepping = True
            try:
                self._step_once()
            finally:
                with self.lock:
                    self._stepping = False
                    self.lock.notify_all()

    def _feed(self) -> None:
        if self.feed is not None:
            self.feed()

    def _step_once(self) -> bool:
        """Feed, one step, its outputs to their sinks; False if there was nothing to run. One thread at a time."""
        self._feed()
        if not self.engine.has_unfinished_requests():
            with self.lock:
                return self._fail_orphans()
        start = time.perf_counter()
        try:
            outputs = self.engine.step()
        except Exception as exc:  # the engine's own guard failed: no request to blame, fail those in flight
            logger.exception("engine step raised; failing the requests in flight")
            with self.lock:
                failed = self._fail(StepFailed, f"failed: the engine step raised {type(exc).__name__}: {exc}", exc)
            for request_id in failed:
                self.engine.abort_request(request_id)
            return True
        seconds = time.perf_counter() - start
        with self.lock:
            for out in outputs:
                sink = self._sinks.get(out.request_id)
                if sink is None:
                    continue  # aborted meanwhile, or added to the engine by someone else
                if out.finished:
                    del self._sinks[out.request_id]
                sink.put(out.request_id, out)
            self.lock.notify_all()
        if self.on_step is not None:
            self.on_step(seconds, outputs)
        if not self.engine.has_unfinished_requests():
            self.engine.at_idle()  # after the outputs went out (a caller stepping itself waits for it, once)
        return True

    def _fail_orphans(self) -> bool:
        """The engine has nothing to run, yet requests wait: they were aborted behind the loop's back.
        Under the lock; True if there were any."""
        return bool(self._fail(RequestAborted, "was aborted outside the engine loop (LLMEngine.abort_request) "
                                               "before it finished"))

    def _fail(self, error: type[RuntimeError], why: str, cause: BaseException | None = None) -> list[str]:
        """Every request in flight (added to the engine) gets ``error``; their ids. Under the lock."""
        failed = [(rid, sink) for rid, sink in self._sinks.items() if rid not in self._adding]
        for request_id, sink in failed:
            del self._sinks[request_id]
            exc = error(f"request {request_id!r} {why}")
            exc.__cause__ = cause
            sink.put(request_id, exc)
        if failed:
            self.lock.notify_all()
        return [request_id for request_id, _ in failed]
