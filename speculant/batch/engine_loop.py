"""One engine fed by several threads: each hands in its lines and waits for their records.

A Ray actor gets its next batch while the current one still runs (Ray calls
it from several threads at once). Were each call to run its batch through
the engine to the end, the engine would finish every batch with only its last
few requests running: a drain per batch, the steps cheap but many. Here one
background thread steps the one engine (``BatchRunner.serve``) with every line
any caller has queued, in the order they came, so the engine stays as full as
a local run's; ``run(lines)`` queues its lines and returns when all of them
have their records.

The engine is touched by the loop thread only. A line number is run once at a
time: handing in a line whose number is queued or running already is an
error (the records are sorted out by number). If the loop itself fails (the
engine raised), every waiting caller and every later one raises
``RuntimeError`` naming the cause; a request's own fault is its error record,
as in the local job.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from speculant.batch.lines import InputLine
from speculant.batch.runner import DONE, BatchRunner, Done, Record
from speculant.engine.openmp_pool import release_openmp_pool

if TYPE_CHECKING:  # imported by the Ray driver, which runs no engine
    from speculant.engine.llm_engine import LLMEngine


@dataclass
class _Batch:
    size: int
    records: list[tuple[int, Record]] = field(default_factory=list)


class EngineLoop:
    def __init__(self, engine: LLMEngine, max_in_flight: int | None = None) -> None:
        self.engine = engine
        self._runner = BatchRunner(engine, max_in_flight)
        self._cond = threading.Condition()
        self._queue: deque[InputLine] = deque()
        self._owners: dict[int, _Batch] = {}  # line number (queued or running) -> the batch awaiting it
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="speculant-engine-loop", daemon=True)
        release_openmp_pool()  # the loading thread's OpenMP pool would slow every region of the loop's (openmp_pool)
        self._thread.start()

    def run(self, lines: list[InputLine]) -> list[tuple[int, Record]]:
        """Queue ``lines`` behind those queued already; return all their records (in finishing order)."""
        batch = _Batch(len(lines))
        with self._cond:
            self._check()
            numbers = [line.number for line in lines]
            clash = [n for n in numbers if n in self._owners] or (
                numbers if len(set(numbers)) < len(numbers) else [])
            if clash:
                raise ValueError(f"line {clash[0]} is handed to the engine loop twice at once: each line number "
                                 "must be unique among the lines queued and running")
            for line in lines:
                self._owners[line.number] = batch
            self._queue.extend(lines)
            self._cond.notify_all()
            while len(batch.records) < batch.size and self._error is None:
                self._cond.wait()
            if len(batch.records) < batch.size:
                self._check()
        return batch.records

    def close(self) -> None:
        """Finish the lines queued and running, then stop the loop thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def _check(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"the engine loop stopped: {type(self._error).__name__}: {self._error}; this "
                               "engine cannot run more lines (a restarted actor builds a new one)") from self._error
        if self._closed:
            raise RuntimeError("the engine loop is closed: build a new EngineLoop to run more lines")

    def _take(self, wait: bool) -> InputLine | None | Done:
        with self._cond:
            while wait and not self._queue and not self._closed:
                self._cond.wait()
            if self._queue:
                return self._queue.popleft()
            return DONE if self._closed else None

    def _serve(self) -> None:
        try:
            for number, record in self._runner.serve(self._take):
                with self._cond:
                    batch = self._owners.pop(number)
                    batch.records.append((number, record))
                    if len(batch.records) == batch.size:
                        self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - every caller must hear of it, not wait for ever
            with self._cond:
                self._error = exc
                self._cond.notify_all()
