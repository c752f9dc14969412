"""``speculant bench --random-llama``: a target built from a config with random
weights (load_format dummy) and the oracle proposer at a controlled acceptance;
``--device`` puts both engines on one device."""

from __future__ import annotations

import json

import pytest
import torch

from speculant.bench.random_target import SIZES, _num_params, build_random_target
from speculant.cli import main


def expected_tokens_per_step(alpha: float, k: int) -> float:
    return (1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1.0


@pytest.fixture(scope="module")
def result(tmp_path_factory, one_thread):
    out = tmp_path_factory.mktemp("random_bench") / "r.json"
    code = main(["bench", "--random-llama", "tiny", "--alpha", "0.9,0.6", "--k", "4", "--max-tokens", "48",
                 "--repeats", "1", "--device", "cpu", "--out", str(out)])
    assert code == 0
    return json.loads(out.read_text())


def test_rows_and_labels(result):
    assert [(r["engine"], r["method"]) for r in result["rows"]] == [
        ("speculant", "no_spec"), ("speculant", "oracle_a0.9"), ("speculant", "oracle_a0.6"),
        ("transformers", "generate")]
    assert all(r["status"] == "ok" for r in result["rows"])
    assert result["settings"]["device"] == "cpu" and result["env"]["cpu"]
    assert result["rows"][0]["vs_baseline"] == pytest.approx(1.0)
    assert all(r["peak_gpu_memory_gb"] is None for r in result["rows"])  # measured on CUDA only


def test_each_row_is_compared_with_transformers(result):
    hf = result["rows"][-1]
    for r in result["rows"][:-1]:
        assert r["vs_transformers"] == pytest.approx(r["tokens_per_s"] / hf["tokens_per_s"])
        assert r["matches_transformers"] is not None
    assert hf["num_tokens"] == result["rows"][0]["num_tokens"] == 4 * 48


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_transformers_builds_the_same_random_weights(tmp_path, dtype):
    """The transformers rows build the model from the same config and seed as
    Speculant's ``load_format = "dummy"``: every tensor is equal, and another
    seed gives other weights (the tiny model's greedy text repeats the prompt's
    last token whatever the weights, so the tokens cannot show this)."""
    from transformers import AutoConfig

    from speculant.bench.hf_runs import _load
    from speculant.model.loading.hf_model import _random_model

    d = build_random_target("tiny", tmp_path / "t")
    ours = _random_model(AutoConfig.from_pretrained(d), dtype, torch.device("cpu"), "sdpa", 7).state_dict()
    for seed, same in ((7, True), (8, False)):
        theirs = _load(str(d), dtype, "cpu", random_seed=seed).state_dict()
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[k], theirs[k]) for k in ours) == same


@pytest.mark.parametrize("method,alpha", [("oracle_a0.9", 0.9), ("oracle_a0.6", 0.6)])
def test_the_oracle_gives_the_acceptance_asked_for(result, method, alpha):
    row = next(r for r in result["rows"] if r["method"] == method)
    # 4 prompts x 48 tokens: ~15-25 verify steps per prompt; the mean is within ~20 % of the formula
    assert row["mean_accepted_length"] == pytest.approx(expected_tokens_per_step(alpha, 4), rel=0.2)


def test_the_sizes_are_what_they_say():
    assert 1.0e9 < _num_params(SIZES["1b"]) < 1.6e9
    assert 7.5e9 < _num_params(SIZES["8b"]) < 8.5e9


def test_the_built_directory_has_config_and_tokenizer_only(tmp_path):
    d = build_random_target("tiny", tmp_path / "t")
    assert (d / "config.json").is_file() and (d / "tokenizer.json").is_file()
    assert not list(d.glob("*.safetensors"))


def test_target_and_random_llama_exclude_each_other(capsys, llama_dir, tmp_path):
    assert main(["bench", "--out", str(tmp_path / "x.json")]) == 2
    assert "exactly one of --target" in capsys.readouterr().err
    assert main(["bench", "--target", str(llama_dir), "--random-llama", "tiny"]) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is absent")
def test_cuda_asked_for_without_cuda_is_refused(capsys, llama_dir):
    assert main(["bench", "--target", str(llama_dir), "--device", "cuda"]) == 2
    assert "--device cuda" in capsys.readouterr().err


def test_a_bad_alpha_is_refused(capsys):
    assert main(["bench", "--random-llama", "tiny", "--alpha", "1.5", "--device", "cpu"]) == 2
    assert "--alpha 1.5" in capsys.readouterr().err


def test_the_bench_gives_transformers_the_engine_seed(monkeypatch, tmp_path):
    """``run_random_bench`` builds transformers' model with the seed Speculant's rows used."""
    from speculant.bench import hf_runs
    from speculant.bench.random_target import run_random_bench

    seen = []
    real = hf_runs._load
    monkeypatch.setattr(hf_runs, "_load", lambda *a, **kw: seen.append((a, kw)) or real(*a, **kw))
    res = run_random_bench("tiny", alphas=[0.5], k=2, max_tokens=4, repeats=1, concurrency=[1], dtype="float32",
                           device="cpu", num_prompts=1, prompt_len=8, hf=True, seed=11, log=lambda _m: None)
    assert res["settings"]["seed"] == 11 and [a[3] if len(a) > 3 else kw["random_seed"] for a, kw in seen] == [11]
    # the per-token samples behind the timing fields, and the tokens, stay out of the result
    assert all(not {"_ttfts", "_gaps", "token_ids"} & set(r) for r in res["rows"])
    assert any(r["itl_p50_ms"] is not None for r in res["rows"])
