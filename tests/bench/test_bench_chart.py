"""The PNG chart of ``speculant bench`` (``speculant.bench.chart``)."""

from __future__ import annotations

import pytest

from speculant.bench.chart import chart_data, chart_title, write_chart

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

ROWS = [
    {"engine": "speculant", "method": "no_spec", "concurrency": 1, "status": "ok", "tokens_per_s": 50.0},
    {"engine": "speculant", "method": "ngram", "concurrency": 1, "status": "ok", "tokens_per_s": 80.0},
    {"engine": "speculant", "method": "draft_mqa", "concurrency": 1, "status": "skipped: no --draft given"},
    {"engine": "speculant", "method": "no_spec", "concurrency": 8, "status": "ok", "tokens_per_s": 300.0},
    {"engine": "transformers", "method": "generate", "concurrency": 1, "status": "ok", "tokens_per_s": 40.0},
    {"engine": "transformers", "method": "prompt_lookup", "concurrency": 8, "status": "unsupported: batch 1"},
    {"engine": "transformers", "method": "continuous_batching", "concurrency": 8, "status": "ok",
     "tokens_per_s": 120.0},
    {"engine": "speculant", "method": "medusa", "concurrency": 8, "status": "error: boom"},
]
RESULT = {"rows": ROWS, "env": {"torch_threads": 1},
          "settings": {"target": "/models/t12m", "draft": "/models/d1m", "repeats": 3, "max_tokens": 64}}


def test_chart_data_groups_by_concurrency_and_omits_unmeasured_rows():
    groups, series, values = chart_data(ROWS)
    assert groups == [1, 8]
    assert series == [("speculant", "no_spec"), ("speculant", "ngram"), ("transformers", "generate"),
                      ("transformers", "continuous_batching")]  # Speculant first; skipped/unsupported/error out
    assert values[("speculant", "no_spec", 8)] == 300.0 and ("speculant", "ngram", 8) not in values


def test_chart_title_names_models_and_threads():
    title = chart_title(RESULT)
    assert "target t12m" in title and "draft d1m" in title and "1 torch thread" in title
    assert "draft none" in chart_title({**RESULT, "settings": {**RESULT["settings"], "draft": None}})


def test_write_chart_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "sub" / "chart.png"
    assert write_chart(path, RESULT) is None
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_write_chart_without_measured_rows(tmp_path):
    pytest.importorskip("matplotlib")
    note = write_chart(tmp_path / "c.png", {"rows": [ROWS[2]]})
    assert note == "chart skipped: no measured rows" and not (tmp_path / "c.png").exists()


def test_write_chart_without_matplotlib(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    note = write_chart(tmp_path / "c.png", RESULT)
    assert note.startswith("chart skipped: matplotlib is not installed") and "speculant[bench]" in note
