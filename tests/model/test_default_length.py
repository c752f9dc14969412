"""A defaulted ``model.max_model_len`` that the KV cache cannot hold is lowered to what fits,
in one logged line; an explicit one that does not fit stays an error naming both settings."""

from __future__ import annotations

import logging

import pytest

from speculant import LLM, SamplingParams
from speculant.config.models import CacheConfig, ModelConfig
from speculant.model.attention.torch_ref import TorchAttentionBackend
from speculant.model.runner import ModelRunner


def test_a_default_length_is_lowered_to_what_num_blocks_hold(llama_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="speculant.model.runner"):
        runner = ModelRunner(ModelConfig(path=str(llama_dir)), CacheConfig(num_blocks=8, block_size=4),
                             TorchAttentionBackend())
    assert runner.max_model_len == 32
    lines = [r.getMessage() for r in caplog.records if "max_model_len" in r.getMessage()]
    assert len(lines) == 1 and "lowered from the model's 256 positions to 32" in lines[0]
    assert "cache.num_blocks = 8" in lines[0]


def test_a_default_length_is_lowered_to_what_memory_gb_holds(llama_dir, caplog):
    probe = ModelRunner(ModelConfig(path=str(llama_dir)), CacheConfig(num_blocks=64, block_size=4),
                        TorchAttentionBackend())
    memory_gb = 10 * 4 * probe.kv_bytes_per_token / (1 << 30)  # ten blocks' worth
    with caplog.at_level(logging.WARNING, logger="speculant.model.runner"):
        runner = ModelRunner(ModelConfig(path=str(llama_dir)), CacheConfig(memory_gb=memory_gb, block_size=4),
                             TorchAttentionBackend())
    assert (runner.num_blocks, runner.max_model_len) == (10, 40)
    assert any("cache.memory_gb" in r.getMessage() for r in caplog.records)


def test_the_lowered_length_is_what_the_engine_enforces(llama_dir):
    llm = LLM(model=str(llama_dir), block_size=4, num_blocks=8, max_num_batched_tokens=32, max_num_seqs=4)
    assert llm.engine.max_model_len == 32
    out = llm.generate(["a b c"], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True), use_tqdm=False)
    assert out[0].outputs[0].finish_reason == "length"
    assert len(out[0].prompt_token_ids) + len(out[0].outputs[0].token_ids) == 32
    with pytest.raises(ValueError, match="max_model_len is 32"):
        llm.generate(["x " * 40], SamplingParams(max_tokens=4), use_tqdm=False)


def test_an_explicit_length_that_does_not_fit_stays_an_error(llama_dir):
    with pytest.raises(ValueError, match=r"cache.num_blocks = 8 holds 32 tokens, less than one sequence of "
                                         r"model.max_model_len = 256; raise cache.num_blocks to at least 64"):
        ModelRunner(ModelConfig(path=str(llama_dir), max_model_len=256), CacheConfig(num_blocks=8, block_size=4),
                    TorchAttentionBackend())
