"""The GPU check script of CUDA graphs (speculant/bench/graph_check.py), smoke-tested on the CPU."""

from __future__ import annotations

import json

import pytest

from speculant.bench import graph_check
from speculant.model import cuda_graphs

pytestmark = pytest.mark.usefixtures("one_thread")


def test_graph_check_runs_and_writes_its_json_on_the_cpu_with_stubbed_graphs(tmp_path, monkeypatch):
    monkeypatch.setattr(cuda_graphs, "resolve", cuda_graphs.resolve)  # restored after the script patches it
    monkeypatch.setattr(graph_check, "MAX_TOKENS", 8)
    out = tmp_path / "check.json"
    rc = graph_check.main(["--json", str(out), "--size", "tiny", "--device", "cpu", "--stub-graphs",
                           "--dtypes", "float32"])
    result = json.loads(out.read_text())
    assert rc == 0 and result["ok"], result
    assert [r["speculation"] for r in result["rows"]] == ["none", "ngram"]
    assert all(r["identical"] and r["replays"] > 0 and r["graph_keys"] for r in result["rows"])
    assert result["rows"][1]["num_draft_tokens"] > 0


def test_graph_check_without_cuda_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert graph_check.main(["--json", str(tmp_path / "x.json")]) == 2
    assert "no CUDA device" in capsys.readouterr().err
