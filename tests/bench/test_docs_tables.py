"""The docs' result tables are generated from benchmarks/results/*.json by
benchmarks/docs/ (outside the wheel) and checked for staleness, like the
compatibility matrix."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.docs import generate as docs  # noqa: E402
from benchmarks.docs import tables as docs_tables  # noqa: E402
from benchmarks.docs.ray_tables import ray_scaling, ray_split  # noqa: E402


def test_the_generated_tables_in_the_docs_are_current():
    assert docs.stale_files() == [], "run: python -m benchmarks.docs"


def test_every_row_names_machine_date_and_commit(tmp_path):
    blocks = docs.render()
    assert blocks["headline"].count("\n") >= 3
    for line in blocks["headline"].splitlines()[2:]:
        assert "UTC" in line and ("AMD" in line or "Intel" in line or "NVIDIA" in line), line
    assert "measured on" in blocks["smollm2-batch-1"]


def test_the_readme_headline_table_stays_short():
    rows = docs.render()["headline"].splitlines()[2:]
    assert 0 < len(rows) <= docs.MAX_HEADLINE_ROWS == 12


def test_a_changed_result_makes_the_docs_stale(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(docs.RESULTS, results)
    readme = tmp_path / "README.md"
    readme.write_text(docs.apply(docs.ROOT.joinpath("README.md").read_text(encoding="utf-8"), docs.render(results)))
    assert docs.stale_files((readme,), results) == []
    path = results / "bench_smollm2_proposers.json"
    data = json.loads(path.read_text())
    no_spec = next(r for r in data["rows"] if r["method"] == "no_spec" and r["engine"] == "speculant")
    no_spec["tokens_per_s"] *= 2
    path.write_text(json.dumps(data))
    assert docs.stale_files((readme,), results) == [readme]


def test_measured_on_names_missing_fields():
    assert docs_tables.measured_on({}) == "machine not recorded, date not recorded UTC, commit not recorded"
    env = {"environment": {"cpu": "AMD EPYC", "date_utc": "2026-12-04T10:22:20+00:00",
                           "git_commit": "b96e956abc-dirty"}}
    assert docs_tables.measured_on(env) == "AMD EPYC, 2026-12-04 10:22 UTC, b96e956+dirty"


def _ray_scaling_result(job_extra: dict) -> dict:
    job = {"max_tokens": 8, "job_wall_s": {"local": 10.0, "ray_1x2": 11.0},
           "ray_overhead_s": {"ray_1x2": 1.0}, "ray_overhead_pct_of_local": {"ray_1x2": 10.0},
           "outputs_identical_to_local": {"local": True, "ray_1x2": True}, **job_extra}
    serve = {"replicas": 2, "cpus_per_replica": 1.0, "streams": 8, "completed": 8, "failed": 0,
             "distinct_response_ids": 8, "all_equal_llm_generate": True, "deploy_s": 9.0, "streams_wall_s": 3.0}
    return {"options": {"repeats": 3}, "environment": {"cpu": "AMD EPYC", "date_utc": "2026-12-06T09:00:00+00:00"},
            "summary": {"prompts": 20, "total_threads": 2, "cluster_start_s": 2.0, "jobs": [job], "serve": serve}}


def test_ray_scaling_table_shows_each_round_against_its_local_neighbour(tmp_path):
    (tmp_path / "ray_scaling.json").write_text(json.dumps(_ray_scaling_result(
        {"ray_overhead_pct_by_round": {"ray_1x2": [4.0, 12.5, -1.0]},
         "ray_overhead_pct_paired_median": {"ray_1x2": 4.0}})))
    rows = [line for line in ray_scaling(tmp_path) if line.startswith("| 8 |")]
    assert rows[0].split("|")[5].strip() == "–"  # the local row has no ratio
    assert rows[1].split("|")[5].strip() == "+4.0, +12.5, -1.0 % (+4.0 %)"


def test_ray_scaling_table_reads_a_result_written_before_the_paired_rounds(tmp_path):
    (tmp_path / "ray_scaling.json").write_text(json.dumps(_ray_scaling_result({})))
    rows = [line for line in ray_scaling(tmp_path) if line.startswith("| 8 |")]
    assert [row.split("|")[5].strip() for row in rows] == ["–", "–"]
    assert rows[1].split("|")[4].strip() == "+1.0 s (+10.0 %)"


def test_ray_scaling_text_names_the_first_ray_job_when_recorded(tmp_path):
    data = _ray_scaling_result({})
    (tmp_path / "ray_scaling.json").write_text(json.dumps(data))
    assert not any("first Ray job" in line for line in ray_scaling(tmp_path))
    data["summary"]["first_ray_job_s"] = 9.25
    (tmp_path / "ray_scaling.json").write_text(json.dumps(data))
    text = " ".join(ray_scaling(tmp_path))
    assert "Its first Ray job (4 lines, outside the rounds) took 9.2 s" in text
    data["summary"]["first_ray_job_lines"] = 7
    (tmp_path / "ray_scaling.json").write_text(json.dumps(data))
    assert "Its first Ray job (7 lines, outside the rounds) took 9.2 s" in " ".join(ray_scaling(tmp_path))


def test_ray_split_table_shows_medians_and_each_pair(tmp_path):
    assert ray_split(tmp_path) == []
    row = {"wall_s": 10.0, "engine_ready_s": 3.5, "engine_phase_s": 6.0, "after_s": 0.0, "steps": 268}
    data = {"options": {"repeats": 2}, "environment": {"cpu": "AMD EPYC", "date_utc": "2026-12-06T23:00:00+00:00"},
            "summary": {"prompts": 200, "max_tokens": 96, "total_threads": 2, "outputs_identical": False,
                        "median": {"local": row, "ray_1x2": {**row, "wall_s": 14.0, "engine_ready_s": 7.0}},
                        "pairs": [{"fixed_extra_s": 3.2, "engine_phase_pct": -4.5, "wall_pct": 40.0},
                                  {"fixed_extra_s": 3.6, "engine_phase_pct": 2.0, "wall_pct": 42.0}],
                        "paired_median": {"fixed_extra_s": 3.4, "engine_phase_pct": -1.25, "wall_pct": 41.0}}}
    (tmp_path / "ray_split.json").write_text(json.dumps(data))
    lines = ray_split(tmp_path)
    assert "2 alternating rounds" in lines[0] and "AMD EPYC, 2026-12-06 23:00 UTC" in lines[0]
    assert "| `--ray --replicas 1 --cpus-per-replica 2` | 14.0 s | 7.0 s | 6.0 s | 0.0 s | 268 |" in lines
    assert lines[-1].startswith("Round by round")
    assert "+3.2, +3.6 s (+3.4 s)" in lines[-1] and "-4.5, +2.0 % (-1.2 %)" in lines[-1]
    assert lines[-1].endswith("Records identical to local: **no**.")
