"""`speculant generate`: plain and speculative runs, config files, overrides and errors."""

from __future__ import annotations

import json

from speculant.cli import main


def test_generate_with_model_dir_prints_text_and_summary(llama_dir, capsys):
    assert main(["generate", "--model", str(llama_dir), "--max-tokens", "5", "--ignore-eos",
                 "def foo(x):"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("def foo(x):")
    assert "num_tokens: 5" in out and "tokens_per_s:" in out


def test_generate_from_config_with_speculation_compare_and_json(tmp_path, llama_dir, capsys):
    config = tmp_path / "spec.toml"
    config.write_text(f'''
[model]
path = "{llama_dir}"

[speculative]
proposer = "draft_model"
proposer_options = {{ model = "{llama_dir}" }}
num_speculative_tokens = 4
''')
    code = main(["generate", "--config", str(config), "--set", "speculative.num_speculative_tokens=2",
                 "--max-tokens", "9", "--ignore-eos", "--compare", "--json", "import os", "x = 1"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    summary = result["summary"]
    assert summary["num_tokens"] == 18 and summary["speculative"] == "draft_model"
    assert summary["acceptance_rate"] == 1.0  # the target drafting for itself
    assert summary["mean_accepted_length"] > 2.0  # k = 2 from --set: at most 3 per step
    assert summary["same_text_as_baseline"] is True and summary["speedup"] > 0
    assert [o["finish_reason"] for o in result["outputs"]] == ["length", "length"]


def test_generate_reports_config_errors_with_exit_code_2(tmp_path, llama_dir, capsys):
    config = tmp_path / "bad.toml"
    config.write_text(f'[model]\npath = "{llama_dir}"\n[scheduler]\nmax_num_seqs = 0\nbogus = 1\n')
    assert main(["generate", "--config", str(config), "hello"]) == 2
    err = capsys.readouterr().err
    assert str(config) in err
    assert "scheduler.max_num_seqs" in err and "scheduler.bogus: unknown key" in err


def test_generate_rejects_bad_sampling_values(llama_dir, capsys):
    assert main(["generate", "--model", str(llama_dir), "--temperature", "-1", "hello"]) == 2
    assert "temperature" in capsys.readouterr().err


def test_generate_threads_option(llama_dir, capsys):
    import torch

    before = torch.get_num_threads()
    try:
        assert main(["generate", "--model", str(llama_dir), "--threads", "0", "hello"]) == 2
        assert "--threads 0: need at least 1 thread" in capsys.readouterr().err
        assert main(["generate", "--model", str(llama_dir), "--threads", "1", "--max-tokens", "2", "hi"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_generate_with_a_json_schema_or_regex(tmp_path, llama_dir, capsys):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    assert main(["generate", "--model", str(llama_dir), "--max-tokens", "20", "--json-schema", f"@{path}",
                 "--json", "def foo(x):"]) == 0
    out = json.loads(capsys.readouterr().out)["outputs"][0]
    assert json.loads(out["text"])["n"] in range(10) and out["finish_reason"] == "stop"
    assert main(["generate", "--model", str(llama_dir), "--max-tokens", "20", "--regex", "[ab]{3}", "--json",
                 "x"]) == 0
    out = json.loads(capsys.readouterr().out)["outputs"][0]
    assert len(out["text"]) == 3 and set(out["text"]) <= {"a", "b"}
    assert main(["generate", "--model", str(llama_dir), "--regex", "(a", "x"]) == 2
    assert "structured output regex cannot be compiled" in capsys.readouterr().err


def test_verbose_names_the_dtype_the_kernels_and_the_self_test(llama_dir, capsys, monkeypatch):
    """One plain line says which dtype runs and why, one which C kernels run and what is lost and
    why (here: the dispatch capped at scalar by SPECULANT_CPU_ISA, whatever this CPU has), and one
    the self-test's errors."""
    from speculant.model.kernels import build
    from speculant.model.kernels.abi import set_kernel_isa

    monkeypatch.setenv("SPECULANT_CPU_ISA", "scalar")
    lib = build.load_kernel()
    if lib is not None:
        set_kernel_isa(lib, "scalar")
    try:
        assert main(["generate", "--model", str(llama_dir), "--verbose", "--max-tokens", "2", "hello"]) == 0
    finally:
        monkeypatch.delenv("SPECULANT_CPU_ISA")
        if lib is not None:
            set_kernel_isa(lib, None)
    lines = capsys.readouterr().out.splitlines()
    assert "model.dtype = float32: the checkpoint does not allow bfloat16 (it is stored in float32)" in lines
    kernels = [ln for ln in lines if ln.startswith("C kernels:")]
    assert len(kernels) == 1
    if lib is not None:
        assert "are off: SPECULANT_CPU_ISA=scalar caps the C kernels at the scalar path" in kernels[0]
    assert any(ln.startswith("self-test: largest per-layer error against an upcast reference") for ln in lines)
