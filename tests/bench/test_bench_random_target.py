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
    assert [r["method"] for r in result["rows"]] == ["no_spec", "oracle_a0.9", "oracle_a0.6"]
    assert all(r["status"] == "ok" for r in result["rows"])
    assert result["settings"]["device"] == "cpu" and result["env"]["cpu"]
    assert result["rows"][0]["vs_baseline"] == pytest.approx(1.0)
    assert all(r["peak_gpu_memory_gb"] is None for r in result["rows"])  # measured on CUDA only


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
