"""``speculant bench`` runs its repeats in rounds (every row once per round) and
merges them: samples joined, medians and percentiles recomputed, a failed or
inconsistent repeat failing its row."""

from __future__ import annotations

import json

import pytest

from speculant.bench.report import drop_raw, merge_repeats, timing_fields
from speculant.cli import main


def row(method, tps, decode, ttfts, gaps, tokens=(1, 2), status="ok", accept=None):
    return {"engine": "speculant", "method": method, "concurrency": 1, "status": status,
            "tokens_per_s_samples": [tps], "tokens_per_s": tps, "acceptance_rate": accept,
            "token_ids": [list(tokens)], **timing_fields([decode], ttfts, gaps)}


def test_rounds_merge_into_one_row_per_method_with_recomputed_statistics():
    rounds = [[row("no_spec", 10.0, 12.0, [0.2], [0.1, 0.1]), row("ngram", 20.0, 25.0, [0.3], [0.05], accept=0.5)],
              [row("no_spec", 30.0, 36.0, [0.4], [0.3, 0.3]), row("ngram", 40.0, 45.0, [0.1], [0.05], accept=0.7)],
              [row("no_spec", 20.0, 24.0, [0.6], [0.2, 0.2]), row("ngram", 60.0, 65.0, [0.2], [0.05], accept=0.9)]]
    rows = {r["method"]: r for r in merge_repeats(rounds)}
    plain = rows["no_spec"]
    assert plain["tokens_per_s_samples"] == [10.0, 30.0, 20.0] and plain["tokens_per_s"] == 20.0
    assert plain["decode_tokens_per_s_samples"] == [12.0, 36.0, 24.0] and plain["decode_tokens_per_s"] == 24.0
    assert plain["ttft_ms"] == pytest.approx(400.0)
    assert plain["itl_p50_ms"] == pytest.approx(200.0) and plain["itl_p99_ms"] == pytest.approx(300.0)
    assert rows["ngram"]["acceptance_rate"] == pytest.approx(0.7) and rows["ngram"]["tokens_per_s"] == 40.0
    drop_raw(list(rows.values()))
    assert not any(k in plain for k in ("_ttfts", "_gaps", "token_ids"))


def test_a_failed_or_inconsistent_repeat_fails_its_row():
    rounds = [[row("no_spec", 10.0, 12.0, [0.2], [0.1]), row("ngram", 20.0, 25.0, [0.3], [0.05])],
              [row("no_spec", 10.0, 12.0, [0.2], [0.1], status="error: RuntimeError: boom"),
               row("ngram", 20.0, 25.0, [0.3], [0.05], tokens=(1, 3))]]
    rows = {r["method"]: r for r in merge_repeats(rounds)}
    assert rows["no_spec"]["status"] == "error: RuntimeError: boom"
    assert rows["ngram"]["status"] == "error: greedy tokens differ between repeats"


def test_cli_rounds_give_one_sample_per_round(tmp_path, llama_dir, one_thread):
    out = tmp_path / "r.json"
    assert main(["bench", "--quick", "--no-hf", "--repeats", "2", "--target", str(llama_dir), "--out", str(out)]) == 0
    rows = [r for r in json.loads(out.read_text())["rows"] if r["status"] == "ok"]
    assert {"no_spec", "ngram"} <= {r["method"] for r in rows}
    for r in rows:
        assert len(r["tokens_per_s_samples"]) == 2 and len(r["decode_tokens_per_s_samples"]) == 2
        assert r["matches_no_spec"] is True and "_gaps" not in r
