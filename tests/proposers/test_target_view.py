"""A proposer sees the target through a ``TargetView``: the fields it needs,
the target's own LM head, final norm and token embedding, and a factory for its own runner on
the target's backend and KV geometry; nothing else."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from speculant import LLMEngine
from speculant.config.compat import build_config
from speculant.config.models import ModelConfig
from speculant.interfaces import TargetView

FIELDS = {"tokenizer", "vocab_size", "device", "dtype", "max_model_len", "block_size", "num_blocks",
          "output_embedding", "final_norm", "input_embedding", "new_runner"}


@pytest.fixture(scope="module")
def engine(llama_dir):
    return LLMEngine(build_config({"model": {"path": str(llama_dir)}, "cache": {"num_blocks": 64, "block_size": 8},
                                   "speculative": {"proposer": "ngram"}}))


def test_the_view_holds_what_proposers_need_and_nothing_else(engine):
    view = engine.spec.proposer.context.target
    assert isinstance(view, TargetView)
    assert {f.name for f in dataclasses.fields(TargetView)} == FIELDS
    runner = engine.runner
    assert (view.vocab_size, view.device, view.dtype, view.max_model_len, view.block_size, view.num_blocks) == \
        (runner.vocab_size, runner.device, runner.model.dtype, runner.max_model_len, 8, 64)
    assert view.tokenizer is runner.tokenizer
    assert view.output_embedding is runner.model.get_output_embeddings()
    assert view.final_norm is runner.model.base_model.norm
    assert view.input_embedding is runner.model.get_input_embeddings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.vocab_size = 1  # type: ignore[misc]


def test_output_embedding_maps_hidden_states_to_the_targets_logits(engine):
    view, runner = engine.spec.proposer.context.target, engine.view
    from speculant.interfaces import QuerySpan

    out = runner.forward([QuerySpan(runner.block_manager.allocate("probe", 4), 0, [5, 6, 7, 8], [3])],
                         want_hidden=True)
    runner.block_manager.free("probe")
    with torch.inference_mode():
        assert torch.allclose(view.output_embedding(out.hidden_states).float(), out.logits, atol=1e-5)


def test_new_runner_shares_the_targets_backend_and_kv_geometry(engine, llama_dir):
    view = engine.spec.proposer.context.target
    runner = view.new_runner(ModelConfig(path=str(llama_dir)), option="speculative.proposer_options.model")
    assert runner.backend is engine.runner.backend
    assert (runner.block_size, runner.num_blocks) == (8, 64)
    assert runner.block_manager is not engine.blocks
