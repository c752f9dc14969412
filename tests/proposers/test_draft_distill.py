"""The draft distillation (scripts/train_draft.py, scripts/draft_distill/): the
draft shares the target's vocabulary, special ids and positions; its embedding
starts on the target's principal directions; training on cached teacher
shards (the bundled trained demo target's own continuations) raises its
held-out agreement with the target; and the saved directory runs as the
``draft_model`` proposer with greedy output equal to no speculation."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from speculant import LLM, SamplingParams
from tiny_models import random_prompts

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from draft_distill.model import DraftShape, build_draft, draft_config, projected_embedding
from draft_distill.train import train_draft
from eagle_training.data import write_shard
from train_draft import save_draft

pytestmark = pytest.mark.usefixtures("one_thread")
TARGET = Path(__file__).resolve().parents[2] / "models" / "demo-target"
SHAPE = DraftShape(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64)


def _config(model_dir: Path) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())


def test_draft_config_shares_vocabulary_special_ids_and_positions(llama_dir):
    target = {**_config(llama_dir), "rope_parameters": {"rope_theta": 12345.0, "rope_type": "default"},
              "max_position_embeddings": 777}
    cfg = draft_config(target, SHAPE)
    for key in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id", "max_position_embeddings"):
        assert getattr(cfg, key) == target[key], key
    assert cfg.rope_parameters["rope_theta"] == 12345.0
    assert cfg.hidden_size == 32 and cfg.num_hidden_layers == 1 and cfg.tie_word_embeddings


def test_projected_embedding_keeps_the_targets_geometry():
    torch.manual_seed(0)
    emb = torch.randn(300, 16) @ torch.diag(torch.linspace(3, 0.1, 16))
    full = projected_embedding(emb, 16)  # all directions: a rotation, then one scale
    gram, gram_full = emb @ emb.T, full @ full.T
    assert torch.allclose(gram_full / gram_full.norm(), gram / gram.norm(), atol=1e-4)
    assert full.pow(2).mean().sqrt().item() == pytest.approx(16 ** -0.5, rel=1e-4)
    top = projected_embedding(emb, 4)  # the top-4 principal subspace beats any other 4 directions
    rand = emb @ torch.linalg.qr(torch.randn(16, 4))[0]

    def rel_err(x):
        g = x @ x.T
        return ((g / g.norm()) - gram / gram.norm()).norm()
    assert rel_err(top) < rel_err(rand)


@pytest.fixture(scope="module")
def teacher_cache(tmp_path_factory) -> Path:
    """One shard of the demo target's own greedy continuations with its hidden states."""
    cache = tmp_path_factory.mktemp("draft_cache")
    prompts = random_prompts([2, 3, 4] * 40, seed=11, vocab_size=_config(TARGET)["vocab_size"])
    llm = LLM(model=str(TARGET), max_num_batched_tokens=512, max_num_seqs=64)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=60, ignore_eos=True), use_tqdm=False)
    seqs = [p + list(o.outputs[0].token_ids) for p, o in zip(prompts, outs)]
    target = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    write_shard(cache, "chat_0", target, seqs, 64, 0, {})
    return cache


def test_training_raises_agreement_and_the_saved_draft_runs_exactly(teacher_cache, tmp_path):
    target = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval().requires_grad_(False)
    draft = build_draft(_config(TARGET), target.get_input_embeddings().weight, SHAPE)
    result = train_draft(draft, teacher_cache, target.get_output_embeddings().weight, minutes=5, batch=8,
                         seq_len=32, lr=1e-2, ce_weight=0.2, val_rows=16, max_steps=150)
    assert result["steps"] == 150
    assert result["val"]["kd"] < 0.7 * result["val_before"]["kd"], result
    assert result["val"]["agree"] > result["val_before"]["agree"] + 0.2, result
    # no chat marker given: every position counts as reply
    assert result["val"]["reply_agree"] == pytest.approx(result["val"]["agree"], abs=2e-4)

    out = tmp_path / "draft"
    save_draft(draft, AutoTokenizer.from_pretrained(TARGET), out)
    assert _config(out)["vocab_size"] == _config(TARGET)["vocab_size"]
    prompts = random_prompts([5, 9, 3], seed=12, vocab_size=_config(TARGET)["vocab_size"])
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(model=str(TARGET), max_num_batched_tokens=16, max_num_seqs=4, block_size=4)
    spec = LLM(model=str(TARGET), max_num_batched_tokens=16, max_num_seqs=4, block_size=4,
               speculative={"proposer": "draft_model", "num_speculative_tokens": 3,
                            "proposer_options": {"model": str(out)}})
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, greedy, use_tqdm=False)]
    got = [o.outputs[0].token_ids for o in spec.generate(prompts, greedy, use_tqdm=False)]
    assert got == want
    # the untrained draft agrees with the target at well under 1 % of positions (val_before)
    assert spec.get_metrics()["acceptance_rate"] > 0.05
