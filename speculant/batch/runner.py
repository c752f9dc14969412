"""One engine working through batch lines: as many in flight as it batches, records as they finish.

``BatchRunner(engine).run(lines)`` keeps up to ``max_in_flight`` requests in
the engine (twice ``scheduler.max_num_seqs`` by default, so the scheduler
always has the next ones waiting while memory stays bounded for any file
length) and yields ``(line number, record)`` as each request finishes: in
finishing order, which ``OrderedWriter`` turns back into input order. The
engine is stepped by the runner's ``EngineLoop`` (``speculant.engine.loop``),
whose ``feed`` tops the window up between steps, in the order the lines were
queued: in the caller's thread for a local job, in the loop's own thread in a
Ray actor (``LineFeed``, where several callers queue lines at once).

A line that cannot run (``BadLine``, or a prompt the engine refuses: too
long, bad token) gets its error record at once; a request the engine fails,
or one aborted from outside, is an error record too; the other lines are
unaffected. Should the engine's step itself raise, the runner stops: every
waiting caller and every later one raises ``RuntimeError`` naming the cause
(a rerun, or a restarted actor, redoes the lines left).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from speculant.batch.lines import BadLine, InputLine, LineId, to_request
from speculant.batch.output import error_record, result_record
from speculant.engine.loop import EngineLoop, StepFailed

if TYPE_CHECKING:  # the Ray driver imports this module and runs no engine (it loads no model code)
    from speculant.engine.llm_engine import LLMEngine
    from speculant.engine.request import RequestOutput

Record = dict[str, Any]


@dataclass
class LineBatch:
    """Lines queued together, and their records as they come."""

    size: int
    records: list[tuple[int, Record]] = field(default_factory=list)


class BatchRunner:
    def __init__(self, engine: LLMEngine, max_in_flight: int | None = None) -> None:
        engine.stream_text = False  # finished outputs are all a batch job reads
        self.engine = engine
        self.max_in_flight = max_in_flight or 2 * engine.config.scheduler.max_num_seqs
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight={self.max_in_flight}: must be at least 1")
        self.loop = EngineLoop(engine, id_prefix="line", feed=self._feed)
        # all under self.loop.lock:
        self._lines: deque[tuple[InputLine, LineBatch]] = deque()  # queued, not handed to the engine yet
        self._in_flight: dict[str, tuple[int, LineId, LineBatch]] = {}  # request id -> its line
        self._numbers: set[int] = set()  # line numbers queued or in flight
        self._feeding = False  # a line is between the queue and the engine
        self.failure: BaseException | None = None  # what the engine's step raised: the runner stopped
        self.closed = False

    def run(self, lines: list[InputLine]) -> Iterator[tuple[int, Record]]:
        """Queue ``lines`` and yield their records as they finish. A consumer that stops early leaves nothing
        of them queued or running."""
        batch = self.queue(lines)
        try:
            yield from self.records(batch)
        finally:
            self._drop(batch)

    def queue(self, lines: list[InputLine]) -> LineBatch:
        """Queue ``lines`` behind those queued already (from any thread)."""
        batch = LineBatch(len(lines))
        with self.loop.lock:
            self._check()
            numbers = [line.number for line in lines]
            clash = [n for n in numbers if n in self._numbers] or (
                numbers if len(set(numbers)) < len(numbers) else [])
            if clash:
                raise ValueError(f"line {clash[0]} is handed to the engine loop twice at once: each line number "
                                 "must be unique among the lines queued and running")
            self._numbers.update(numbers)
            self._lines.extend((line, batch) for line in lines)
        self.loop.wake()
        return batch

    def records(self, batch: LineBatch) -> Iterator[tuple[int, Record]]:
        """``batch``'s records as they come; raises once the runner has stopped."""
        taken = 0

        def ready() -> bool:
            return len(batch.records) > taken or self.failure is not None

        while taken < batch.size:
            self.loop.wait(ready)
            with self.loop.lock:
                if len(batch.records) == taken:
                    self._check()
                new = batch.records[taken:]
            taken += len(new)
            yield from new

    def close(self) -> None:
        """Refuse more lines, let those queued and running finish, then stop the loop."""
        with self.loop.lock:
            self.closed = True
        self.loop.wait(lambda: (not self._lines and not self._feeding and not self._in_flight)
                       or self.failure is not None)
        self.loop.stop()

    def _check(self) -> None:
        if self.failure is not None:
            raise RuntimeError(f"the engine loop stopped: {type(self.failure).__name__}: {self.failure}; this "
                               "engine cannot run more lines (a restarted actor builds a new one)") from self.failure
        if self.closed:
            raise RuntimeError("the engine loop is closed: build a new LineFeed to run more lines")

    # --- the stepping thread ---------------------------------------------------------
    def _feed(self) -> None:
        """Between steps: hand queued lines to the engine while the window has room."""
        while True:
            with self.loop.lock:
                failed = self.failure is not None
                if failed or not self._lines or len(self._in_flight) >= self.max_in_flight:
                    break
                line, batch = self._lines.popleft()
                self._feeding = True
            rejected: Record | None = None
            try:
                rejected = self._add(line, batch)  # only this thread adds to _in_flight: the window holds
            finally:
                with self.loop.lock:
                    self._feeding = False
                    if rejected is not None:
                        self._done(line.number, batch, rejected)
        if failed:  # the runner stopped: so does its loop (and a thread of its own)
            self.loop.stop()

    def _add(self, line: InputLine, batch: LineBatch) -> Record | None:
        """Queue the line's request; its error record if it cannot run."""
        try:
            req = to_request(line, self.engine.tokenizer, self.engine.max_model_len)
        except BadLine as exc:
            return error_record(exc.id, line.number, str(exc))
        request_id = self.loop.new_id()
        with self.loop.lock:
            self._in_flight[request_id] = (line.number, req.id, batch)
        try:
            self.loop.submit(req.prompt, req.params, self, request_id)
        except (TypeError, ValueError) as exc:  # the engine's prompt checks (length, token ids)
            with self.loop.lock:
                del self._in_flight[request_id]
            return error_record(req.id, line.number, f"line {line.number} (id {req.id!r}): {exc}")
        return None

    def put(self, request_id: str, item: RequestOutput | BaseException) -> None:
        """The loop's ``Sink``: a finished request, or its failure (under the loop's lock)."""
        if not isinstance(item, BaseException) and not item.finished:
            return
        number, line_id, batch = self._in_flight.pop(request_id)
        if isinstance(item, StepFailed):  # no record: the caller raises, and a rerun redoes the line
            self.failure = item.__cause__ or item
            self._numbers.discard(number)
            self.loop.lock.notify_all()
            return
        if isinstance(item, BaseException):
            record = error_record(line_id, number, "the request was aborted before it finished")
        else:
            record = result_record(line_id, item)
        self._done(number, batch, record)

    def _done(self, number: int, batch: LineBatch, record: Record) -> None:
        self._numbers.discard(number)
        batch.records.append((number, record))
        self.loop.lock.notify_all()

    def _drop(self, batch: LineBatch) -> None:
        """Forget ``batch``'s lines still queued, abort those running."""
        with self.loop.lock:
            kept = deque(pair for pair in self._lines if pair[1] is not batch)
            for line, _ in (pair for pair in self._lines if pair[1] is batch):
                self._numbers.discard(line.number)
            self._lines = kept
            running = [rid for rid, (_, _, b) in self._in_flight.items() if b is batch]
        for request_id in running:
            self.loop.abort(request_id)


def run_lines(engine: LLMEngine, lines: list[InputLine]) -> list[tuple[int, Record]]:
    """Every line's record, in input order (for callers that want them all at once)."""
    return sorted(BatchRunner(engine).run(lines), key=lambda pair: pair[0])
