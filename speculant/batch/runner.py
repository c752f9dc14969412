"""One engine working through batch lines: as many in flight as it batches, records as they finish.

``BatchRunner(engine).run(lines)`` keeps up to ``max_in_flight`` requests in
the engine (twice ``scheduler.max_num_seqs`` by default, so the scheduler
always has the next ones waiting while memory stays bounded for any file
length), steps it, and yields ``(line number, record)`` as each request
finishes: in finishing order, which ``OrderedWriter`` turns back into input
order (``serve(take)`` does the same with lines that arrive while it runs:
``EngineLoop``'s one engine fed by several callers). A line that cannot run
(``BadLine``, or a prompt the engine refuses: too long, bad token) yields its
error record at once; a request the engine fails is an error record too; the
other lines are unaffected. The local job and each Ray actor run the same
class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from speculant.batch.lines import BadLine, InputLine, LineId, to_request
from speculant.batch.output import error_record, result_record

if TYPE_CHECKING:  # the Ray driver imports this module and runs no engine (it loads no model code)
    from speculant.engine.llm_engine import LLMEngine

Record = dict[str, Any]


class Done:
    """What ``BatchRunner.serve``'s ``take`` returns when no line will follow."""


DONE = Done()


class BatchRunner:
    def __init__(self, engine: LLMEngine, max_in_flight: int | None = None) -> None:
        engine.stream_text = False  # finished outputs are all a batch job reads
        self.engine = engine
        self.max_in_flight = max_in_flight or 2 * engine.config.scheduler.max_num_seqs
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight={self.max_in_flight}: must be at least 1")

    def run(self, lines: Iterable[InputLine]) -> Iterator[tuple[int, Record]]:
        pending = iter(lines)
        return self.serve(lambda wait: next(pending, DONE))

    def serve(self, take: Callable[[bool], InputLine | None | Done]) -> Iterator[tuple[int, Record]]:
        """``run`` over lines that arrive while it runs: ``take(wait)`` gives the next line, None when
        there is none yet (only when ``wait`` is False: the engine has work, so the runner must not
        block), or ``DONE`` when there will be no more."""
        in_flight: dict[str, tuple[int, LineId]] = {}  # engine request id -> (line number, line id)
        more = True
        try:
            while more or in_flight:
                while more and len(in_flight) < self.max_in_flight:
                    line = take(not in_flight)
                    if line is None:
                        break
                    if isinstance(line, Done):
                        more = False
                        break
                    rejected = self._add(line, in_flight)
                    if rejected is not None:
                        yield line.number, rejected
                if not in_flight:
                    continue
                if not self.engine.has_unfinished_requests():  # aborted from outside: never silently lost
                    for number, line_id in in_flight.values():
                        yield number, error_record(line_id, number, "the request was aborted before it finished")
                    in_flight.clear()
                    continue
                for out in self.engine.step():
                    if out.finished and out.request_id in in_flight:
                        number, line_id = in_flight.pop(out.request_id)
                        yield number, result_record(line_id, out)
        finally:  # stopped early (an exception, or the consumer went away): leave nothing queued
            for rid in in_flight:
                self.engine.abort_request(rid)

    def _add(self, line: InputLine, in_flight: dict[str, tuple[int, LineId]]) -> Record | None:
        """Queue the line's request; its error record if it cannot run."""
        try:
            req = to_request(line, self.engine.tokenizer, self.engine.max_model_len)
        except BadLine as exc:
            return error_record(exc.id, line.number, str(exc))
        try:
            rid = self.engine.add_request(None, req.prompt, req.params)
        except (TypeError, ValueError) as exc:  # the engine's prompt checks (length, token ids)
            return error_record(req.id, line.number, f"line {line.number} (id {req.id!r}): {exc}")
        in_flight[rid] = (line.number, req.id)
        return None


def run_lines(engine: LLMEngine, lines: list[InputLine]) -> list[tuple[int, Record]]:
    """Every line's record, in input order (for callers that want them all at once)."""
    return sorted(BatchRunner(engine).run(lines), key=lambda pair: pair[0])

