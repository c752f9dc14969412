"""`speculant batch --ray`: Ray Data over a pool of engines, identical to the local run, a killed actor, and an
actor that takes its next batch while one runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from batch_helpers import chat_model, greedy_rows, read_jsonl, write_jsonl
from speculant.batch import ray_job
from speculant.batch.ray_job import KILL_ENV, Predictor
from speculant.cli import main

pytest.importorskip("ray", reason="Ray is not installed: pip install 'speculant[ray]'")

KILL_AFTER = 8  # lines one actor has run when it dies (the end of its second batch of 4)


@pytest.fixture(scope="module")
def flag(tmp_path_factory):
    return tmp_path_factory.mktemp("kill") / "killed"


@pytest.fixture(scope="module")
def ray_env(flag):  # the workers see it: the first actor to have run KILL_AFTER lines dies
    return {KILL_ENV: f"{KILL_AFTER}:{flag}"}


@pytest.fixture(scope="module")
def model(llama_dir, tmp_path_factory):
    return chat_model(llama_dir, tmp_path_factory.mktemp("batch-model"))


def test_killed_actor_is_restarted_and_its_lines_redone(ray_cluster, flag, tmp_path, model, one_thread, capsys):
    rows = greedy_rows(30)
    rows[5] = "{broken"  # an error record on Ray as well
    rows[11] = {"id": "bad", "prompt": "x", "top_p": 0}
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    local = tmp_path / "local.jsonl"
    assert main(["batch", str(src), "--output", str(local), "--model", str(model), "--no-progress"]) == 0
    out = tmp_path / "ray.jsonl"
    local_lines = local.read_text().splitlines(keepends=True)
    out.write_text("".join(local_lines[:3]) + local_lines[3][:20])  # an earlier run stopped while writing line 4
    capsys.readouterr()
    assert not flag.exists()
    assert main(["batch", str(src), "--output", str(out), "--model", str(model), "--no-progress", "--ray",
                 "--replicas", "2", "--cpus-per-replica", "0.5", "--ray-batch-size", "4"]) == 0
    assert flag.exists(), "no actor was killed: the test proved nothing"
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["skipped"], summary["written"], summary["errors"]) == (3, 27, 2)
    assert out.read_text() == local.read_text()  # nothing lost, nothing twice, input order, same text
    records = read_jsonl(out)
    assert [r["id"] for r in records] == [r["id"] if isinstance(r, dict) else None for r in rows]


class CallCounts(Predictor):
    """A Predictor that notes, for each call, the calls running when it began (itself included), a file per
    actor (never killed). Its first call waits (at most ``WAIT`` s) for a second call to begin: an actor that
    takes its next batch while one runs lets it, one that does not leaves the first call to give up waiting."""

    out_dir = ""  # set before the job: the class goes to the workers by value
    WAIT = 120.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.kill_after = None
        self.count_lock, self.running, self.calls = threading.Lock(), 0, 0
        self.second = threading.Event()

    def __call__(self, batch):
        with self.count_lock:
            self.running += 1
            self.calls += 1
            first, running = self.calls == 1, self.running
            if running >= 2:
                self.second.set()
        saw_second = self.second.wait(self.WAIT) if first else None
        out = super().__call__(batch)
        with self.count_lock:
            self.running -= 1
        with open(Path(self.out_dir) / f"{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps({"running": running, "first_saw_a_second": saw_second}) + "\n")
        return out


def test_an_actor_takes_its_next_batch_while_one_runs(ray_cluster, tmp_path, model, one_thread, monkeypatch):
    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    monkeypatch.setattr(CallCounts, "out_dir", str(tmp_path))
    monkeypatch.setattr(ray_job, "Predictor", CallCounts)
    rows = greedy_rows(8)
    for i, row in enumerate(rows):
        row["max_tokens"] = 24 if i < 2 else 2  # the first batch runs longest
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    local, out = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    assert main(["batch", str(src), "--output", str(local), "--model", str(model), "--no-progress"]) == 0
    assert main(["batch", str(src), "--output", str(out), "--model", str(model), "--no-progress", "--ray",
                 "--replicas", "1", "--cpus-per-replica", "1", "--ray-batch-size", "2"]) == 0
    assert out.read_text() == local.read_text()
    [calls] = [[json.loads(line) for line in f.read_text().splitlines()] for f in tmp_path.glob("*.jsonl")
               if f.stem.isdigit()]
    assert len(calls) == 4
    # counts, not clock times: the first call saw a second one begin, which began with two running
    assert [c["first_saw_a_second"] for c in calls if c["first_saw_a_second"] is not None] == [True], calls
    assert max(c["running"] for c in calls) >= 2, f"every batch waited for the one before it to return: {calls}"


def _cpus_back(ray, want: float, within: float = 20.0) -> float:
    """The cluster's free CPUs once they are ``want`` again (or whatever they are after ``within`` s)."""
    deadline = time.monotonic() + within
    while (free := ray.available_resources().get("CPU", 0.0)) < want and time.monotonic() < deadline:
        time.sleep(0.1)
    return free


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "speculant.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_config_the_driver_refuses_ends_the_job_it_started(ray_cluster, tmp_path, model, replicas):
    """From the command line (it connects to the cluster) the job starts before the driver's config check
    ends (the actors start meanwhile): a refused config still exits 2 naming the problem, writes nothing,
    prints no traceback, and its actors end."""
    src = write_jsonl(tmp_path / "in.jsonl", greedy_rows(4))
    out = tmp_path / "out.jsonl"
    env = {"RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address}
    done = _cli("batch", str(src), "--output", str(out), "--model", str(model), "--no-progress", "--ray",
                "--set", "speculative.proposer=nope", "--replicas", str(replicas),
                "--cpus-per-replica", str(2 / replicas), env=env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "speculative.proposer = 'nope': no proposer named 'nope'" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert not out.exists()
    assert _cpus_back(ray_cluster, 2.0) == 2.0, "the refused job's actors still hold their CPUs"


def test_a_refused_config_in_process_cancels_the_job_and_keeps_the_connection(ray_cluster, tmp_path, model,
                                                                               capsys):
    src = write_jsonl(tmp_path / "in.jsonl", greedy_rows(4))
    out = tmp_path / "out.jsonl"
    capsys.readouterr()
    assert main(["batch", str(src), "--output", str(out), "--model", str(model), "--no-progress", "--ray",
                 "--set", "speculative.proposer=nope", "--cpus-per-replica", "2"]) == 2
    assert "no proposer named 'nope'" in capsys.readouterr().err
    assert not out.exists()
    assert ray_cluster.is_initialized(), "the caller's own connection was closed"
    assert _cpus_back(ray_cluster, 2.0) == 2.0, "the refused job's actor still holds its CPUs"


class SlowBatches:
    """A Ray Data actor that says it has started (creates ``started``), then takes half a second per batch."""

    def __init__(self, started: str) -> None:
        Path(started).touch()

    def __call__(self, batch):
        time.sleep(0.5)
        return batch


def _until(condition, within: float = 120.0) -> bool:
    """Whether ``condition()`` holds within ``within`` s (polled: a signal to wait for, not a time to sleep)."""
    deadline = time.monotonic() + within
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def test_a_row_stream_cancelled_before_its_rows_are_taken_ends_and_frees_its_actor(ray_cluster, tmp_path):
    from ray.data import ActorPoolStrategy

    from speculant.batch.ray_stream import RowStream

    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    started = tmp_path / "started"
    ds = ray_cluster.data.range(40, override_num_blocks=40).map_batches(
        SlowBatches, batch_size=None, compute=ActorPoolStrategy(size=1), num_cpus=2,
        fn_constructor_kwargs={"started": str(started)})
    stream = RowStream(ds)
    # the pool's actor has started and holds the cluster's CPUs, as when the driver's config check ends
    assert _until(started.exists), "the pool's actor never started"
    assert _until(lambda: ray_cluster.available_resources().get("CPU", 0.0) == 0.0), "the actor holds no CPUs"
    assert stream.cancel(timeout=15.0), "the pump thread did not end"
    assert _cpus_back(ray_cluster, 2.0) == 2.0, "the cancelled job's actor still holds its CPUs"


def test_a_command_line_job_equals_the_in_process_one_and_leaves_the_cluster_free(ray_cluster, tmp_path, model):
    """The command line (which connects, starts the job, checks, and disconnects) writes what the
    in-process call (already connected: check first) writes, and both what the local run writes."""
    src = write_jsonl(tmp_path / "in.jsonl", greedy_rows(6))
    local, inproc, cli = tmp_path / "local.jsonl", tmp_path / "inproc.jsonl", tmp_path / "cli.jsonl"
    assert main(["batch", str(src), "--output", str(local), "--model", str(model), "--no-progress"]) == 0
    ray_args = ["--no-progress", "--ray", "--replicas", "1", "--cpus-per-replica", "1"]
    assert main(["batch", str(src), "--output", str(inproc), "--model", str(model), *ray_args]) == 0
    done = _cli("batch", str(src), "--output", str(cli), "--model", str(model), *ray_args,
                env={"RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address})
    assert done.returncode == 0, done.stderr[-2000:]
    assert inproc.read_text() == local.read_text(), "Ray in process differs from the local run"
    assert cli.read_text() == local.read_text(), "Ray from the command line differs from the local run"
    assert _cpus_back(ray_cluster, 2.0) == 2.0


def test_a_row_stream_raises_the_failure_of_its_execution(ray_cluster):
    from speculant.batch.ray_stream import RowStream

    def fail(batch):
        raise ValueError("this batch cannot run")

    ds = ray_cluster.data.range(2).map_batches(fail)
    with pytest.raises(Exception, match="this batch cannot run"):
        list(RowStream(ds))
