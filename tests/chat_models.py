"""Tiny chat models for tests: a copy of a tiny model with a minimal chat template."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from tiny_models import copy_model

TEMPLATE = ("{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|bos|>assistant:{% endif %}")


def with_chat_template(model_dir: Path, out: Path) -> Path:
    """Copy ``model_dir`` to ``out`` with ``TEMPLATE`` in its tokenizer config."""
    out = copy_model(model_dir, out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(out)
    return out
