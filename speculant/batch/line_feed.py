"""One engine fed by several threads: each hands in its lines and waits for their records.

A Ray actor gets its next batch while the current one still runs (Ray calls
it from several threads at once). Were each call to run its batch through
the engine to the end, the engine would finish every batch with only its last
few requests running: a drain per batch, the steps cheap but many. Here the
runner's engine loop steps the one engine in a thread of its own, with every
line any caller has queued, in the order they came, so the engine stays as
full as a local run's; ``run(lines)`` queues its lines and returns when all
of them have their records.

A line number is run once at a time: handing in a line whose number is queued
or running already is an error (the records are sorted out by number). If the
engine's step raised, every waiting caller and every later one raises
``RuntimeError`` naming the cause; a request's own fault is its error record,
as in the local job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from speculant.batch.lines import InputLine
from speculant.batch.runner import BatchRunner, Record

if TYPE_CHECKING:  # imported by the Ray driver, which runs no engine
    from speculant.engine.llm_engine import LLMEngine


class LineFeed:
    def __init__(self, engine: LLMEngine, max_in_flight: int | None = None) -> None:
        self.engine = engine
        self.runner = BatchRunner(engine, max_in_flight)
        self.runner.loop.start("speculant-engine-batch")  # from the loading thread: it gives its OpenMP pool back

    def run(self, lines: list[InputLine]) -> list[tuple[int, Record]]:
        """Queue ``lines`` behind those queued already; return all their records (in finishing order)."""
        return list(self.runner.run(lines))

    def close(self) -> None:
        """Finish the lines queued and running, then stop the loop thread."""
        self.runner.close()
