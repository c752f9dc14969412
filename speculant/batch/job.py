"""A batch job from input file to output file, whatever runs the lines.

``plan`` reads the input and the output written so far: the lines a rerun
skips (their key is answered already), the lines to run, and the records that
need no engine (a second line with an id already used: ids must be unique,
since a rerun finds lines by their id). ``write`` then takes records from a
source (the local runner, or the Ray job) in any order and appends them in
input order, with a progress bar.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from speculant.batch.lines import InputLine, read_lines
from speculant.batch.output import Key, OrderedWriter, answered, error_record, key_of

Record = dict[str, Any]
Source = Callable[[list[InputLine]], Iterable[tuple[int, Record]]]


@dataclass
class Plan:
    to_run: list[InputLine] = field(default_factory=list)
    duplicates: dict[int, Record] = field(default_factory=dict)
    """line number -> its error record (an id used on an earlier line)."""
    num_skipped: int = 0
    """Lines answered by an earlier run."""

    @property
    def numbers(self) -> list[int]:
        return sorted([line.number for line in self.to_run] + list(self.duplicates))


def plan(input_path: str, output_path: str) -> Plan:
    lines = read_lines(input_path)
    done = answered(output_path)
    first: dict[Key, int] = {}
    out = Plan()
    for line in lines:
        key = key_of(line)
        if key in done:
            out.num_skipped += 1
        elif key in first:
            out.duplicates[line.number] = error_record(
                key[1], None, f"line {line.number}: id {key[1]!r} is already used on line {first[key]}; ids must "
                              "be unique (a rerun skips the ids already answered), so this line was not run")
        else:
            first[key] = line.number
            out.to_run.append(line)
    return out


@dataclass
class Summary:
    num_written: int
    num_errors: int
    num_skipped: int
    seconds: float


def write(job: Plan, output_path: str, source: Source, progress: bool = True,
          started: float | None = None) -> Summary:
    """Run ``job`` through ``source`` and append its records to ``output_path`` in input order; the
    summary's seconds count from ``started`` (a ``time.perf_counter()`` reading: a Ray job starts before
    its writing does), else from now."""
    start = time.perf_counter() if started is None else started
    num_errors = len(job.duplicates)
    total = job.num_skipped + len(job.numbers)
    with open(output_path, "a", encoding="utf-8") as f, \
            tqdm(total=total, initial=job.num_skipped, desc="batch", unit="line", disable=not progress) as bar:
        writer = OrderedWriter(f, job.numbers)
        for number, record in job.duplicates.items():
            bar.update(writer.add(number, record))
        for number, record in source(job.to_run):
            num_errors += "error" in record
            bar.update(writer.add(number, record))
        if not writer.done:
            missing = writer.order[writer.next:][:5]
            raise RuntimeError(f"the job ended without records for input lines {missing} (and maybe more); "
                               "the output holds every line before them: rerun the same command to finish")
    return Summary(len(writer.order), num_errors, job.num_skipped, time.perf_counter() - start)
