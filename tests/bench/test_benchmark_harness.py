"""benchmarks/harness.py, the one harness every benchmark script stands on:
its rounds and ratios, the result file it writes (always with the
environment), and that the scripts use it instead of helpers of their own."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import harness  # noqa: E402

HELPERS = {"harness.py", "bench_models.py", "oracle_proposer.py", "repeated_tasks.py", "spec_replay.py",
           "fetch_gguf_parts.py", "llamacpp_rows.py"}
# fetch_gguf_parts: fetches a model for the benchmarks, measures nothing; llamacpp_rows: llama.cpp's rows for
# the scripts that run them under the harness's rounds (real_size_rows, long_prompt_rows, llamacpp_agreement)
OWN_HELPERS = {"environment", "git_commit", "cpu_name", "cpu_model", "write_json", "smollm2_path", "time_calls",
               "alternating_runs", "measure_read_bandwidth", "percentile", "pct", "wait_for_quiet"}


def scripts() -> list[Path]:
    return sorted(p for p in BENCHMARKS.glob("*.py") if p.name not in HELPERS)


def test_rounds_run_every_config_once_per_round_in_alternating_order():
    seen: list[str] = []
    runs = harness.rounds(["a", "b", "c"], 3, lambda name: seen.append(name) or {"x": len(seen)})
    assert seen == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert {name: [r["x"] for r in rs] for name, rs in runs.items()} == {"a": [1, 6, 7], "b": [2, 5, 8],
                                                                         "c": [3, 4, 9]}


def test_medians_and_ratios():
    runs = {"base": [{"t": 10.0}, {"t": 20.0}, {"t": 12.0}], "new": [{"t": 15.0}, {"t": 30.0}, {"t": 12.0}]}
    meds = harness.medians(runs, "t")
    assert meds == {"base": 12.0, "new": 15.0}
    assert harness.ratios(meds, "base") == {"base": 1.0, "new": 1.25}
    assert harness.per_round_ratios(runs, "new", "base", "t") == [1.5, 1.5, 1.0]
    assert harness.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5


def test_timed_takes_both_clocks():
    with harness.timed() as t:
        sum(range(10000))
    assert t.wall > 0 and t.cpu >= 0


def test_a_result_file_carries_the_environment_options_and_command(tmp_path, monkeypatch):
    ap = harness.arg_parser("Title.\n\nMore.", out=tmp_path / "r.json", repeats=2, dtype="float32", quick="tiny")
    args = ap.parse_args(["--repeat", "5"])
    assert (args.repeats, args.dtype, args.threads, args.quick) == (5, "float32", None, False)
    bench = harness.start("demo", args, busy_warning=False)
    written = bench.write({"results": {"x": 1}})
    data = json.loads((tmp_path / "r.json").read_text())
    assert data == json.loads(json.dumps(written, default=str))
    assert data["benchmark"] == "demo" and data["results"] == {"x": 1} and data["options"]["repeats"] == 5
    env = data["environment"]
    for key in ("cpu", "machine", "date_utc", "git_commit", "torch", "transformers", "torch_threads", "load_avg",
                "load_avg_end", "seconds"):
        assert key in env, key


def test_a_quick_run_leaves_the_results_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "QUICK_DIR", tmp_path / "quick")
    ap = harness.arg_parser(None, out=harness.RESULTS_DIR / "x.json", quick="tiny")
    args = harness.start("x", ap.parse_args(["--quick"]), busy_warning=False).args
    assert args.out == tmp_path / "quick" / "x.json"
    args = harness.start("x", ap.parse_args(["--quick", "--out", str(tmp_path / "y.json")]), busy_warning=False).args
    assert args.out == tmp_path / "y.json"


@pytest.mark.parametrize("script", scripts(), ids=lambda p: p.name)
def test_every_script_stands_on_the_harness(script):
    tree = ast.parse(script.read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "harness" in imported, f"{script.name} does not use benchmarks/harness.py"
    own = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)} & OWN_HELPERS
    assert not own, f"{script.name} defines {sorted(own)} of its own: use harness's"
    assert not {"common", "spec_common"} & imported
