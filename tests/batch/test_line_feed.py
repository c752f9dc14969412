"""LineFeed: one engine fed by several threads, each waiting for its own records (no Ray)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from speculant.batch.line_feed import LineFeed
from speculant.batch.lines import InputLine
from speculant.batch.runner import run_lines
from speculant.config.compat import build_config
from speculant.config.models import apply_overrides
from speculant.engine.llm_engine import LLMEngine

pytestmark = pytest.mark.usefixtures("one_thread")


def lines(start: int, n: int, max_tokens: int) -> list[InputLine]:
    return [InputLine(i, json.dumps({"id": f"r{i}", "prompt": f"def f{i}(x):", "max_tokens": max_tokens,
                                     "temperature": 0, "ignore_eos": True})) for i in range(start, start + n)]


@pytest.fixture
def engine(llama_dir):
    return LLMEngine(build_config(apply_overrides({"model": {"path": str(llama_dir)}}, []), "test"))


def running_per_step(engine: LLMEngine) -> list[int]:
    """Note how many requests run in each step from now on."""
    seen: list[int] = []
    step = engine.step

    def counted():
        seen.append(engine.occupancy()["num_running"])
        return step()

    engine.step = counted  # type: ignore[method-assign]
    return seen


def test_a_second_batch_joins_the_running_one_and_can_finish_first(engine):
    seen = running_per_step(engine)
    loop = LineFeed(engine)
    first, second = lines(0, 2, 40), lines(2, 2, 3)
    results: dict[str, list] = {}
    worker = threading.Thread(target=lambda: results.setdefault("first", loop.run(first)))
    worker.start()
    deadline = time.monotonic() + 60
    while engine.num_steps < 2 and time.monotonic() < deadline:  # the first batch is running
        time.sleep(0.01)
    assert worker.is_alive()
    results["second"] = loop.run(second)
    assert worker.is_alive(), "the second batch waited for the first to drain: the engine was not kept fed"
    worker.join(60)
    loop.close()
    assert max(seen) == 4  # both batches' requests in one step
    assert sorted(n for n, _ in results["first"]) == [0, 1] and sorted(n for n, _ in results["second"]) == [2, 3]
    together = sorted(results["first"] + results["second"], key=lambda pair: pair[0])
    assert together == run_lines(engine, first + second)  # the same records as one runner over all four


def test_bad_lines_are_error_records(engine):
    loop = LineFeed(engine)
    records = dict(loop.run([InputLine(0, "{broken"), *lines(1, 1, 2)]))
    loop.close()
    assert "error" in records[0] and "error" not in records[1]


def test_a_line_number_twice_at_once_is_refused(engine):
    loop = LineFeed(engine)
    with pytest.raises(ValueError, match="line 3 is handed to the engine loop twice"):
        loop.run(lines(3, 1, 2) + lines(3, 1, 2))
    assert len(loop.run(lines(3, 1, 2))) == 1  # nothing was queued by the refused call
    loop.close()
    with pytest.raises(RuntimeError, match="closed"):
        loop.run(lines(4, 1, 2))


def test_a_failed_loop_fails_every_caller_with_the_cause(engine):
    def broken():
        raise MemoryError("no memory for the step")

    engine.step = broken  # type: ignore[method-assign]
    loop = LineFeed(engine)
    with pytest.raises(RuntimeError, match="the engine loop stopped: MemoryError: no memory for the step"):
        loop.run(lines(0, 2, 2))
    with pytest.raises(RuntimeError, match="MemoryError"):
        loop.run(lines(5, 1, 2))
