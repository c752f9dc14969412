"""openmp_pool: the thread that loaded an engine gives its OpenMP workers back before another thread steps it."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from speculant.engine import openmp_pool
from speculant.engine.openmp_pool import loaded_openmp_runtimes, release_openmp_pool

needs_openmp = pytest.mark.skipif(not torch.backends.openmp.is_available() or not os.path.isdir("/proc/self/task"),
                                  reason="torch without OpenMP, or no /proc (not Linux)")


def thread_ids() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def test_the_runtimes_are_read_from_the_mapped_files(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /venv/torch/lib/libgomp.so.1\n"
        "7f01-7f02 r--p 00001000 08:01 1 /venv/torch/lib/libgomp.so.1\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/libc.so.6\n"
        "7f03-7f04 rw-p 00000000 00:00 0 \n"
        "7f04-7f05 r-xp 00000000 08:01 3 /opt/intel/lib/libiomp5.so\n")
    assert loaded_openmp_runtimes(str(maps)) == ["/venv/torch/lib/libgomp.so.1", "/opt/intel/lib/libiomp5.so"]
    assert loaded_openmp_runtimes(str(tmp_path / "absent")) == []


@needs_openmp
def test_torch_s_runtime_is_found():
    assert any(os.path.basename(p).startswith("libgomp") for p in loaded_openmp_runtimes()) or \
        any(os.path.basename(p).startswith(("libiomp5", "libomp")) for p in loaded_openmp_runtimes())


@needs_openmp
def test_releasing_ends_the_thread_s_workers_and_a_later_region_still_runs():
    """A thread that opened a 2-thread region holds a worker; released, the worker exits;
    the same thread's next region builds a new pool and computes the same result."""
    x = torch.arange(1 << 20, dtype=torch.float32)
    expected = torch.exp(x * 1e-6)
    before_threads = torch.get_num_threads()
    found: dict[str, object] = {}

    def body():
        torch.set_num_threads(2)
        before = thread_ids()
        torch.exp(x * 1e-6)  # a region over 2 threads: the runtime starts a worker for this thread
        found["workers"] = thread_ids() - before
        found["released"] = release_openmp_pool()
        deadline = time.monotonic() + 5
        while found["workers"] & thread_ids() and time.monotonic() < deadline:
            time.sleep(0.01)
        found["left"] = found["workers"] & thread_ids()
        found["again"] = torch.equal(torch.exp(x * 1e-6), expected)

    try:
        worker = threading.Thread(target=body)
        worker.start()
        worker.join(30)
    finally:
        torch.set_num_threads(before_threads)
    assert found["workers"], "no OpenMP worker was started: the test did not open a parallel region"
    assert found["released"] is True
    assert found["left"] == set(), "the released pool's workers are still alive"
    assert found["again"] is True


@pytest.mark.parametrize("which", ["server", "batch"])
def test_both_engine_loops_release_the_loading_thread_s_pool_before_stepping(monkeypatch, which):
    """The engine loop calls it from the thread that starts it (the server's, a batch actor's), before its
    own thread runs."""
    calls: list[tuple[str, bool]] = []

    class NoEngine:
        def has_unfinished_requests(self):
            return False

    def record():
        calls.append((threading.current_thread().name, any(
            t.name.startswith("speculant-engine") for t in threading.enumerate())))
        return True

    from speculant.engine import loop as module

    monkeypatch.setattr(module, "release_openmp_pool", record)
    if which == "server":
        from speculant.server.admission import Admission

        loop = Admission(NoEngine(), max_queued=1)  # type: ignore[arg-type]
        loop.start()
        loop.stop()
    else:
        from speculant.batch.line_feed import LineFeed

        LineFeed(NoEngine(), max_in_flight=1).close()  # type: ignore[arg-type]
    assert calls == [(threading.current_thread().name, False)]


def test_without_an_openmp_runtime_nothing_is_paused(monkeypatch):
    monkeypatch.setattr(openmp_pool, "_pause_functions", lambda: ())
    assert release_openmp_pool() is False
