"""Randomly initialised EAGLE heads for the tiny test models (correctness
never depends on training, so tests use untrained heads)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig

from speculant.proposers.eagle.model import EagleHead, eagle_config
from speculant.proposers.heads.common import save_heads


def save_random_eagle(target_dir: Path, out: Path, draft_vocab_size: int | None, seed: int = 0) -> Path:
    """A randomly initialised EAGLE head for ``target_dir`` (any architecture:
    a small layer of its own, the target's hidden and vocabulary sizes),
    optionally with a random draft vocabulary of ``draft_vocab_size`` target ids."""
    torch.manual_seed(seed)
    text = AutoConfig.from_pretrained(target_dir).get_text_config()
    layer = {"hidden_size": text.hidden_size, "vocab_size": text.vocab_size, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96}
    cfg = eagle_config(layer, draft_vocab_size)
    head = EagleHead(cfg)
    if draft_vocab_size:
        head.draft_ids.copy_(torch.randperm(cfg["vocab_size"])[:draft_vocab_size].sort().values)
    save_heads(head, cfg, out)
    return out
