"""Config strictness and ``speculant config check`` against the model and the
machine: wrong types and out-of-range values are refused with the key path,
the value, the reason and the fix; limits the schema cannot know (the
model's positions, the machine's memory, CUDA, corrupt weight files) are
reported by ``config check`` instead of failing at engine build."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from speculant import LLM
from speculant.cli import main
from speculant.config.compat import build_config, load_config
from speculant.config.models import MAX_MODEL_LEN, MAX_NUM_BLOCKS, MAX_SEED, ConfigError
from speculant.model import resources as resource_checks


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def toml_config(tmp_path: Path, model_dir, extra: str = "", name: str = "engine.toml") -> Path:
    return write(tmp_path, name, f'[model]\npath = "{model_dir}"\ndevice = "cpu"\n{extra}')


def problems_of(data: dict) -> list[str]:
    data.setdefault("model", {}).setdefault("path", "m")
    with pytest.raises(ConfigError) as err:
        build_config(data)
    return err.value.problems


BAD_TOML = {
    # name: (section, TOML line, words of the one problem)
    "max_num_seqs=true": ("scheduler", "max_num_seqs = true",
                          ["scheduler.max_num_seqs = True", "valid integer", "whole number without quotes"]),
    "max_num_seqs='8'": ("scheduler", 'max_num_seqs = "8"', ["scheduler.max_num_seqs = '8'", "valid integer"]),
    "block_size=16.0": ("cache", "block_size = 16.0", ["cache.block_size = 16.0", "valid integer"]),
    "chunked='yes'": ("scheduler", 'enable_chunked_prefill = "yes"',
                      ["scheduler.enable_chunked_prefill = 'yes'", "valid boolean", "true or false"]),
    "chunked=1": ("scheduler", "enable_chunked_prefill = 1", ["scheduler.enable_chunked_prefill = 1", "valid boolean"]),
    "dtype=32": ("model", "dtype = 32", ["model.dtype = 32", "float32"]),
    "seed=-1": ("model", "seed = -1", ["model.seed = -1", "greater than or equal to 0", "[0, 2**63 - 1]"]),
    "seed=true": ("model", "seed = true", ["model.seed = True", "valid integer"]),
    "memory_gb=nan": ("cache", "memory_gb = nan", ["cache.memory_gb = nan", "finite number"]),
    "memory_gb=inf": ("cache", "memory_gb = inf", ["cache.memory_gb = inf", "finite number"]),
    "memory_gb=true": ("cache", "memory_gb = true", ["cache.memory_gb = True", "valid number"]),
    "num_blocks=huge": ("cache", f"num_blocks = {MAX_NUM_BLOCKS + 1}",
                        [f"cache.num_blocks = {MAX_NUM_BLOCKS + 1}", f"less than or equal to {MAX_NUM_BLOCKS}",
                         "raise cache.block_size"]),
    "max_model_len=huge": ("model", f"max_model_len = {MAX_MODEL_LEN + 1}",
                           [f"model.max_model_len = {MAX_MODEL_LEN + 1}", "less than or equal to",
                            "max_position_embeddings"]),
    "fast_forward=true": ("model", "fast_forward = true", ["model.fast_forward = True", "'auto', 'on' or 'off'"]),
    "fast_forward='yes'": ("model", 'fast_forward = "yes"', ["model.fast_forward = 'yes'", "'auto', 'on' or 'off'"]),
    "num_speculative_tokens=true": ("speculative", "num_speculative_tokens = true",
                                    ["speculative.num_speculative_tokens = True", "valid integer"]),
}


@pytest.mark.parametrize("name", list(BAD_TOML))
def test_bad_toml_value(name, tmp_path):
    section, line, words = BAD_TOML[name]
    text = '[model]\npath = "m"\n' + (f"{line}\n" if section == "model" else f"[{section}]\n{line}\n")
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "engine.toml", text))
    assert len(err.value.problems) == 1, err.value.problems
    for w in words + [str(tmp_path / "engine.toml")]:
        assert w in str(err.value), f"{w!r} missing from:\n{err.value}"


def test_seed_bounds_through_llm_kwargs_and_dicts(llama_dir):
    (problem,) = problems_of({"model": {"seed": MAX_SEED + 1}})
    assert problem.startswith(f"model.seed = {MAX_SEED + 1}: Input should be less than or equal to {MAX_SEED}")
    assert build_config({"model": {"path": "m", "seed": MAX_SEED}}).model.seed == MAX_SEED
    with pytest.raises(ConfigError, match="model.seed = False"):
        LLM(str(llama_dir), seed=False)


def test_yaml_and_overrides_keep_their_types(tmp_path):
    cfg = write(tmp_path, "engine.yaml", "model:\n  path: m\ncache:\n  memory_gb: 2\nscheduler:\n"
                                          "  enable_chunked_prefill: false\n  max_num_seqs: 8\n")
    config = load_config(cfg, ["model.seed=7", "cache.block_size=8"])
    assert (config.cache.memory_gb, config.scheduler.max_num_seqs, config.model.seed) == (2.0, 8, 7)
    assert config.scheduler.enable_chunked_prefill is False and config.cache.block_size == 8
    with pytest.raises(ConfigError, match="scheduler.max_num_seqs = 'many': Input should be a valid integer"):
        load_config(cfg, ["scheduler.max_num_seqs=many"])
    with pytest.raises(ConfigError, match="enable_chunked_prefill = 'on'"):
        load_config(cfg, ["scheduler.enable_chunked_prefill='on'"])


# --- config check against the model and the machine -----------------------------

def check(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(["config", "check", *args])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out, out.err


def test_config_check_passes_a_good_config(tmp_path, llama_dir, capsys):
    code, out, err = check([str(toml_config(tmp_path, llama_dir))], capsys)
    assert code == 0 and err == "" and "[model]" in out


def test_config_check_max_model_len_beyond_the_model(tmp_path, llama_dir, capsys):
    code, _, err = check([str(toml_config(tmp_path, llama_dir, "max_model_len = 300\n"))], capsys)
    assert code == 1
    assert "model.max_model_len = 300 exceeds the 256 positions of the model" in err
    assert "set it to at most 256" in err


def test_config_check_kv_pool_larger_than_memory(tmp_path, llama_dir, capsys, monkeypatch):
    monkeypatch.setattr(resource_checks, "total_memory_bytes", lambda device: 1 << 30)
    # tiny llama: 2 layers, 4 KV heads, head dim 16, float32 -> 2*2*4*16*4 = 1024 bytes per token
    cfg = toml_config(tmp_path, llama_dir, "[cache]\nblock_size = 16\nnum_blocks = 65537\n")
    code, _, err = check([str(cfg)], capsys)
    assert code == 1
    assert ("cache.num_blocks = 65537: the KV cache needs 65537 blocks x 16384 bytes (2 x 2 layers x 4 KV heads "
            "x 16 head dim x 4 bytes (float32) x 16 tokens) = 1.00 GiB, more than the 1.00 GiB of RAM") in err
    assert "lower cache.num_blocks (at most 65536 blocks fit" in err
    ok = toml_config(tmp_path, llama_dir, "[cache]\nblock_size = 16\nnum_blocks = 65536\n", "ok.toml")
    assert check([str(ok)], capsys)[0] == 0
    big = toml_config(tmp_path, llama_dir, "[cache]\nmemory_gb = 1.5\n", "gb.toml")
    code, _, err = check([str(big)], capsys)
    assert code == 1 and "cache.memory_gb = 1.5: the KV cache needs 1.5 GiB = 1.50 GiB" in err
    assert "lower cache.memory_gb below 1.00" in err


def test_total_memory_is_this_machines_ram():
    total = resource_checks.total_memory_bytes("cpu")
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        line = next(ln for ln in meminfo.read_text().splitlines() if ln.startswith("MemTotal:"))
        assert total == int(line.split()[1]) * 1024
    assert total is None or total > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_config_check_cuda_without_cuda(tmp_path, llama_dir, capsys):
    cfg = write(tmp_path, "engine.toml", f'[model]\npath = "{llama_dir}"\ndevice = "cuda"\n')
    code, _, err = check([str(cfg)], capsys)
    assert code == 1
    assert "model.device = 'cuda': torch sees no CUDA device" in err and "set model.device = 'cpu' or 'auto'" in err


def test_config_check_lists_every_machine_problem_at_once(tmp_path, llama_dir, capsys, monkeypatch):
    monkeypatch.setattr(resource_checks, "total_memory_bytes", lambda device: 1 << 20)
    monkeypatch.setattr(resource_checks, "device_problems", lambda config: ["model.device = 'cuda': (stub)"])
    cfg = toml_config(tmp_path, llama_dir, "max_model_len = 512\n[cache]\nnum_blocks = 4096\n")
    code, _, err = check([str(cfg)], capsys)
    assert code == 1 and str(cfg) in err
    assert "(stub)" in err and "model.max_model_len = 512" in err and "cache.num_blocks = 4096" in err


def test_config_check_reports_a_corrupt_weight_file(tmp_path, llama_dir, capsys):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(llama_dir, model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    code, _, err = check([str(toml_config(tmp_path, model))], capsys)
    assert code == 1 and f"weight file {str(weights)!r} is truncated" in err


def test_kv_block_shape_reads_common_config_keys():
    assert resource_checks.kv_block_shape({"num_hidden_layers": 2, "num_attention_heads": 8,
                                           "hidden_size": 512}) == (2, 8, 64)
    assert resource_checks.kv_block_shape({"n_layer": 3, "n_head": 4, "n_embd": 64}) == (3, 4, 16)
    assert resource_checks.kv_block_shape({"num_hidden_layers": 2, "num_attention_heads": 8,
                                           "num_key_value_heads": 2, "head_dim": 128}) == (2, 2, 128)
    assert resource_checks.kv_block_shape({"num_hidden_layers": 2}) is None
