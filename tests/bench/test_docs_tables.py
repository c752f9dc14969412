"""The docs' result tables are generated from benchmarks/results/*.json and
checked for staleness, like the compatibility matrix."""

from __future__ import annotations

import json
import shutil

from speculant.bench import docs, docs_tables


def test_the_generated_tables_in_the_docs_are_current():
    assert docs.stale_files() == [], "run: python -m speculant.bench.docs"


def test_every_row_names_machine_date_and_commit(tmp_path):
    blocks = docs.render()
    assert blocks["headline"].count("\n") >= 3
    for line in blocks["headline"].splitlines()[2:]:
        assert "UTC" in line and ("AMD" in line or "Intel" in line or "NVIDIA" in line), line
    assert "measured on" in blocks["smollm2-batch-1"]


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
