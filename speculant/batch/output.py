"""The output file of a batch job: what a rerun skips, and records written in input order.

One JSON object per line: ``{"id", "text", "finish_reason", "usage",
"speculant"}`` for a line that ran (``speculant.engine.output_record``,
as the server's responses carry them), ``{"id", "error"}`` for one that could not
(an input line whose id cannot be read also carries its ``line`` number, which
then stands for its id).

Records are written in input order, each flushed as it is written, so at any
moment the file holds answers to a prefix of the input. A rerun keeps every
complete record, cuts off a last line that was being written when the job
stopped (or anything after the first line that does not parse), and runs the
lines not answered yet.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import IO, Any

from speculant.batch.lines import InputLine, LineId, line_id_of
from speculant.engine.output_record import OutputRecord
from speculant.engine.request import RequestOutput

Key = tuple[str, LineId]
"""("id", the line's id), or ("line", its number) for a line whose id cannot be read."""


def key_of(line: InputLine) -> Key:
    line_id = line_id_of(line)
    return ("line", line.number) if line_id is None else ("id", line_id)


def _record_key(record: Any) -> Key | None:
    if not isinstance(record, dict):
        return None
    if record.get("id") is not None:
        return ("id", record["id"])
    if isinstance(record.get("line"), int):
        return ("line", record["line"])
    return None


def answered(path: str) -> set[Key]:
    """The keys of the complete records in ``path`` (none if it does not exist); the file
    is cut after the last of them, dropping a partly written line."""
    if not os.path.exists(path):
        return set()
    keys: set[Key] = set()
    good = 0
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break  # written in part when the job stopped
            try:
                key = _record_key(json.loads(raw))
            except (json.JSONDecodeError, UnicodeDecodeError):
                key = None
            if key is None:
                break
            keys.add(key)
            good += len(raw)
    if good != os.path.getsize(path):
        with open(path, "r+b") as f:
            f.truncate(good)
    return keys


def result_record(line_id: LineId, out: RequestOutput) -> dict[str, Any]:
    record = OutputRecord.of(out)
    if record.error is not None:
        return error_record(line_id, None, record.error)
    return {"id": line_id, **record.fields()}


def error_record(line_id: LineId | None, number: int | None, message: str) -> dict[str, Any]:
    record: dict[str, Any] = {"id": line_id, "error": message}
    if line_id is None:
        record["line"] = number
    return record


class OrderedWriter:
    """Appends records to the output in the order of ``numbers`` (input line
    numbers), whatever order they arrive in; ``add`` returns how many it wrote."""

    def __init__(self, f: IO[str], numbers: Iterable[int]) -> None:
        self.f = f
        self.order = list(numbers)
        self.next = 0
        self.pending: dict[int, dict[str, Any]] = {}
        self.expected = set(self.order)

    def add(self, number: int, record: dict[str, Any]) -> int:
        if number not in self.expected:
            raise AssertionError(f"a record for input line {number}, which this job did not run or already wrote")
        self.expected.discard(number)
        self.pending[number] = record
        written = 0
        while self.next < len(self.order) and self.order[self.next] in self.pending:
            rec = self.pending.pop(self.order[self.next])
            self.f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            self.next += 1
            written += 1
        if written:
            self.f.flush()
        return written

    @property
    def done(self) -> bool:
        return self.next == len(self.order)
