"""Batched transformers rows of ``speculant bench`` (concurrency > 1, not --quick):
the static left-padded ``generate`` batch and transformers continuous batching."""

from __future__ import annotations

import contextlib
import json

import pytest

from speculant.bench import hf_runs
from speculant.bench.hf_cb import CBFailed, CBUnsupported, run_continuous_batching
from speculant.cli import main


@pytest.fixture(scope="module")
def batched_result(tmp_path_factory, llama_dir, one_thread):
    root = tmp_path_factory.mktemp("bench_batched")
    prompts = root / "prompts.txt"
    prompts.write_text("def add(a, b):\\n    return\nclass Point:\\n    def __init__(self, x, y):\n")
    out = root / "r.json"
    code = main(["bench", "--target", str(llama_dir), "--prompts", str(prompts), "--max-tokens", "6",
                 "--repeats", "1", "--concurrency", "1,3", "--out", str(out)])
    return code, json.loads(out.read_text()) if out.is_file() else None


def test_continuous_batching_row(batched_result):
    code, data = batched_result
    assert code == 0
    hf = {(r["method"], r["concurrency"]): r for r in data["rows"] if r["engine"] == "transformers"}
    assert ("continuous_batching", 1) not in hf  # batch 1 is the generate row
    cb = hf[("continuous_batching", 3)]
    # transformers >= 5 (what pyproject requires) has continuous batching: anything but ok is a failure here
    assert cb["status"] == "ok", cb
    assert cb["num_requests"] == 3 and cb["num_tokens"] == 3 * 6 and cb["tokens_per_s"] > 0
    assert cb["matches_no_spec"] is True, cb
    assert cb["itl_p50_ms"] is None and "generate_batch" in cb["note"]


def test_static_batch_and_batch_one_only_rows(batched_result):
    _, data = batched_result
    hf = {(r["method"], r["concurrency"]): r for r in data["rows"] if r["engine"] == "transformers"}
    gen = hf[("generate", 3)]
    assert gen["status"] == "ok" and gen["num_tokens"] == 3 * 6
    assert gen["note"].startswith("static left-padded batch")
    assert hf[("assisted", 3)]["status"].startswith("skipped: no --draft")
    assert hf[("prompt_lookup", 3)]["status"].startswith("unsupported: prompt lookup")
    assert not any("token_ids" in r for r in data["rows"])  # used for matches_no_spec, then dropped


def test_assisted_at_concurrency_reason_mentions_generate_batch():
    assert "generate_batch" in hf_runs._unsupported_batched("assisted")
    assert "refuses an assistant model" in hf_runs._unsupported_batched("assisted")


def test_missing_continuous_batching_is_unsupported():
    class OldModel:  # transformers 4.x models have no continuous_batching_context_manager
        config = None

    with pytest.raises(CBUnsupported, match="transformers >= 5"):
        run_continuous_batching(OldModel(), [[1, 2, 3]], 4, 1, 512, 0)


def test_failing_continuous_batching_is_an_error_not_unsupported():
    class Broken:
        config = None

        def continuous_batching_context_manager(self, **kwargs):
            raise RuntimeError("paged attention unavailable")

    with pytest.raises(RuntimeError, match="paged attention unavailable") as info:
        run_continuous_batching(Broken(), [[1, 2, 3]], 4, 1, 512, 0)
    assert not isinstance(info.value, CBUnsupported)


def test_stopped_manager_is_an_error_not_unsupported():
    class StoppedManager:  # the background thread died: no result will ever come
        def add_request(self, prompt, max_new_tokens):
            return "r0"

        def get_result(self, timeout):
            return None

        def is_running(self):
            return False

    class Stopped:
        config = None

        @contextlib.contextmanager
        def continuous_batching_context_manager(self, **kwargs):
            yield StoppedManager()

    with pytest.raises(CBFailed, match="thread stopped before every request finished") as info:
        run_continuous_batching(Stopped(), [[1, 2, 3]], 4, 1, 512, 0)
    assert not isinstance(info.value, CBUnsupported)


@pytest.mark.parametrize("exc, status", [
    (CBUnsupported("no continuous batching here"), "unsupported: no continuous batching here"),
    (CBFailed("a request failed: out of pages"), "error: CBFailed: a request failed: out of pages"),
    (ValueError("bad page size"), "error: ValueError: bad page size"),
])
def test_run_hf_records_continuous_batching_failures(monkeypatch, llama_dir, one_thread, exc, status):
    """Only a missing feature is "unsupported"; an exception in the row is an error."""
    def fail(*args, **kwargs):
        raise exc

    monkeypatch.setattr(hf_runs, "run_continuous_batching", fail)
    rows = hf_runs.run_hf(str(llama_dir), None, [[5, 6, 7]], max_tokens=2, k=2, repeats=1, concurrency=[2],
                          batched=True, pad_id=0, log=lambda m: None)
    by = {r["method"]: r for r in rows}
    assert by["continuous_batching"]["status"] == status
    assert by["generate"]["status"] == "ok"


def test_quick_skips_batched_rows(llama_dir, one_thread):
    rows = hf_runs.run_hf(str(llama_dir), None, [[5, 6, 7]], max_tokens=2, k=2, repeats=1, concurrency=[2],
                          batched=False, pad_id=0, log=lambda m: None)
    by = {r["method"]: r for r in rows}
    assert by["generate"]["status"].startswith("skipped:") and "--quick" in by["generate"]["status"]
    assert by["continuous_batching"]["status"].startswith("skipped:")
