"""``scripts/train_demo_models.py --init-from``: continuing from an HF model
directory accepts exactly the architecture and tokenizer being trained, and
records the starting weights' digest in the run's spec (a resume that would
start from other weights is then refused as a changed trajectory)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tiny_models import build_model, build_tokenizer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from demo_training import cli, sizes, trainer  # noqa: E402

SIZE = sizes.Size(hidden=64, layers=2, heads=4, kv_heads=4, intermediate=128, lr=1e-3)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("init")
    tok = build_tokenizer(root / "tokenizer")
    model_dir = build_model("llama", root / "model", root / "tokenizer")
    return root, model_dir, {"vocab_size": len(tok)}


def test_init_from_loads_the_weights_and_records_their_digest(run):
    root, model_dir, meta = run
    spec = {"size": "test"}
    model = cli._init_model(str(model_dir), SIZE, meta, cli.Paths(root, root), spec)
    from transformers import AutoModelForCausalLM
    want = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), want.state_dict().values()))
    assert spec["init_digest"] == cli.sha256_file(model_dir / "model.safetensors")
    assert "init_digest" in trainer.TRAJECTORY_KEYS


def test_init_from_refuses_another_size(run):
    root, model_dir, meta = run
    wider = sizes.Size(hidden=96, layers=2, heads=4, kv_heads=4, intermediate=128, lr=1e-3)
    with pytest.raises(SystemExit, match=r"differs from the selected size test"):
        cli._init_model(str(model_dir), wider, meta, cli.Paths(root, root), {"size": "test"})


def test_init_from_refuses_another_tokenizer(run, tmp_path):
    root, model_dir, meta = run
    other = tmp_path / "tokenizer"
    other.mkdir()
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast.from_pretrained(root / "tokenizer")
    tok.add_tokens(["<|extra|>"])
    tok.save_pretrained(other)
    paths = cli.Paths(tmp_path, tmp_path)
    with pytest.raises(SystemExit, match="tokenizer differs"):
        cli._init_model(str(model_dir), SIZE, meta, paths, {"size": "test"})


def test_init_from_needs_a_model_directory(run, tmp_path):
    root, _, meta = run
    with pytest.raises(SystemExit, match="no model.safetensors"):
        cli._init_model(str(tmp_path), SIZE, meta, cli.Paths(root, root), {"size": "test"})
