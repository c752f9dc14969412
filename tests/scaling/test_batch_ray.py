"""`speculant batch --ray`: Ray Data over a pool of engines, identical to the local run, a killed actor, and an
actor that takes its next batch while one runs."""

from __future__ import annotations

import json
import os
import sys
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


class CallTimes(Predictor):
    """A Predictor that notes when each call starts and ends, a file per actor (never killed)."""

    out_dir = ""  # set before the job: the class goes to the workers by value

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.kill_after = None

    def __call__(self, batch):
        start = time.monotonic()
        out = super().__call__(batch)
        with open(Path(self.out_dir) / f"{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps([start, time.monotonic()]) + "\n")
        return out


def test_an_actor_takes_its_next_batch_while_one_runs(ray_cluster, tmp_path, model, one_thread, monkeypatch):
    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    monkeypatch.setattr(CallTimes, "out_dir", str(tmp_path))
    monkeypatch.setattr(ray_job, "Predictor", CallTimes)
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
    overlapping = [(a, b) for a in calls for b in calls if a < b and b[0] < a[1]]
    assert overlapping, f"every batch waited for the one before it to return: {calls}"
