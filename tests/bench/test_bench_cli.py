"""``speculant bench --quick`` end to end on tiny random models."""

from __future__ import annotations

import json

import pytest

from speculant.cli import main
from tiny_models import build_model

SPECULANT_METHODS = {"no_spec", "ngram", "suffix", "suffix_adaptive", "draft_mqa", "draft_batch_expansion",
                     "draft_suffix"}
HF_METHODS = {"generate", "assisted", "prompt_lookup"}


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory, tokenizer_dir):
    """A smaller llama sharing the target's tokenizer (vocabulary)."""
    return build_model("llama", tmp_path_factory.mktemp("bench_draft"), tokenizer_dir, hidden=32, layers=1,
                       heads=4, seed=1)


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory, llama_dir, draft_dir, one_thread):
    out = tmp_path_factory.mktemp("bench") / "r.json"
    code = main(["bench", "--quick", "--target", str(llama_dir), "--draft", str(draft_dir), "--out", str(out)])
    return code, out


def test_quick_bench_exits_zero_and_writes_json(quick_result):
    code, out = quick_result
    assert code == 0
    assert out.is_file()
    data = json.loads(out.read_text())
    for key in ("torch", "transformers", "torch_threads", "load_avg"):
        assert key in data["env"]
    assert data["settings"]["max_tokens"] == 8 and data["settings"]["concurrency"] == [1]
    assert data["settings"]["num_prompts"] == 2 and data["settings"]["quick"] is True
    assert data["settings"]["draft_confidence"] == 0.4  # transformers' own assistant default


def test_quick_bench_rows(quick_result):
    data = json.loads(quick_result[1].read_text())
    rows = data["rows"]
    got = {(r["engine"], r["method"]) for r in rows}
    assert got == {("speculant", m) for m in SPECULANT_METHODS} | {("transformers", m) for m in HF_METHODS}
    assert all(r["concurrency"] == 1 for r in rows)  # --quick: bs=1 only
    by = {(r["engine"], r["method"]): r for r in rows}
    for m in SPECULANT_METHODS:
        r = by[("speculant", m)]
        assert r["status"] == "ok", r
        assert r["matches_no_spec"] is True, r
        assert r["tokens_per_s"] > 0 and r["num_tokens"] == 2 * 8
        assert r["itl_p50_ms"] > 0 and r["itl_p99_ms"] >= r["itl_p50_ms"]
        if m == "no_spec":
            assert r["acceptance_rate"] is None
        else:
            assert 0.0 <= r["acceptance_rate"] <= 1.0 and r["mean_accepted_length"] >= 0.0
    for m in HF_METHODS:
        r = by[("transformers", m)]
        assert r["status"] == "ok" or r["status"].startswith("unsupported:"), r
        assert r["acceptance_rate"] is None
        if r["status"] == "ok":
            assert r["tokens_per_s"] > 0
    assert by[("transformers", "generate")]["matches_no_spec"] is True


def test_bench_without_draft_skips_draft_rows(tmp_path, llama_dir, one_thread, capsys):
    out = tmp_path / "nodraft.json"
    code = main(["bench", "--quick", "--no-hf", "--target", str(llama_dir), "--out", str(out)])
    assert code == 0
    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == SPECULANT_METHODS
    assert rows["draft_mqa"]["status"].startswith("skipped") and rows["draft_suffix"]["status"].startswith("skipped")
    assert rows["ngram"]["matches_no_spec"] is True
    assert "| engine |" in capsys.readouterr().out  # Markdown table printed


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_quick_bench_writes_png_chart(quick_result):
    pytest.importorskip("matplotlib")
    code, out = quick_result
    data = json.loads(out.read_text())
    chart = out.with_suffix(".png")
    assert data["chart"] == str(chart)
    assert chart.is_file() and chart.stat().st_size > 1000
    assert chart.read_bytes()[:8] == PNG_MAGIC


def test_bench_rejects_missing_target(tmp_path, capsys):
    assert main(["bench", "--quick", "--target", str(tmp_path / "nope"), "--out", str(tmp_path / "x.json")]) == 2
    assert "config.json" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-0.5", "1"])
def test_bench_rejects_draft_confidence_out_of_range(value, tmp_path, llama_dir, capsys):
    out = tmp_path / "x.json"
    assert main(["bench", "--quick", "--target", str(llama_dir), "--draft-confidence", value, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--draft-confidence" in err and "[0, 1)" in err
    assert not out.exists()


def test_draft_confidence_reaches_both_engines():
    from speculant.bench.hf_runs import hf_methods
    from speculant.bench.speculant_runs import speculant_methods

    ours = {m.name: m for m in speculant_methods(4, "d", 0.25)}
    assert ours["draft_mqa"].speculative["proposer_options"]["confidence_threshold"] == 0.25
    assert ours["draft_batch_expansion"].speculative["proposer_options"]["confidence_threshold"] == 0.25
    assert ours["draft_suffix"].speculative["proposer_options"] == {
        "draft": {"model": "d", "confidence_threshold": 0.25}}
    hf = {name: extra for name, extra, _ in hf_methods(4, "d", 0.25)}
    assert hf["assisted"]["assistant_confidence_threshold"] == 0.25


def test_warm_up_prompt_is_never_a_measured_prompt():
    from speculant.bench.speculant_runs import warm_up_prompt

    assert warm_up_prompt([[1, 2, 3], [4]]) == [3, 2, 1]
    assert warm_up_prompt([[1, 2, 1], [5]]) == [1, 2, 1, 1]  # a palindrome is lengthened
    assert warm_up_prompt([[1, 2], [2, 1], [2, 1, 2]]) == [2, 1, 2, 2]
