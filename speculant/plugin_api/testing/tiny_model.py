"""The tiny models the conformance kit runs plugins against, built locally.

Nothing is downloaded: the tokenizer is a byte-level BPE trained on a few
modules of Python's standard library, and the models are random llama
weights from a config, with a wide init so greedy text varies instead of
repeating one token. ``TinyModels.build(directory)`` writes them once and
reuses them on later calls (the same seed gives the same weights).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

VOCAB_SIZE = 384
"""Tokens of the trained tokenizer (and of the text model)."""
SMALL_VOCAB = 16
"""Vocabulary of the model the statistical checks sample from (every
continuation of a few tokens can be enumerated)."""
EOS = "<|eos|>"
BOS = "<|bos|>"


def training_text() -> list[str]:
    import collections
    import json
    import textwrap

    return [inspect.getsource(m) for m in (collections, json.decoder, textwrap)]


def build_tokenizer(out_dir: Path, texts: list[str] | None = None, vocab_size: int = VOCAB_SIZE,
                    pad_token: str | None = None):  # -> transformers.PreTrainedTokenizerFast
    """A byte-level BPE trained on ``texts`` (default: ``training_text()``), saved to ``out_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, BOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts if texts is not None else training_text(), trainer=trainer)
    extra = {"pad_token": pad_token} if pad_token is not None else {}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=BOS, **extra)
    fast.save_pretrained(out_dir)
    return fast


def build_llama(out_dir: Path, tokenizer_dir: Path, *, vocab_size: int | None = None, hidden: int = 64,
                layers: int = 2, heads: int = 4, max_positions: int = 256, seed: int = 0,
                init_std: float = 0.3) -> Path:
    """A random llama (float32) with the tokenizer of ``tokenizer_dir``, saved to ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    tok = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        num_key_value_heads=heads, vocab_size=vocab_size or len(tok), hidden_size=hidden,
        intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=heads,
        max_position_embeddings=max_positions, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
        pad_token_id=tok.eos_token_id, tie_word_embeddings=False, initializer_range=init_std,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


@dataclass(frozen=True)
class TinyModels:
    """The kit's models: ``text`` (the trained tokenizer's vocabulary) for the
    greedy checks, ``small`` (``SMALL_VOCAB`` tokens) for the statistical ones,
    and ``small_draft``, another random model of that vocabulary, as a draft
    whose distributions differ from ``small``'s."""

    text: Path
    small: Path
    small_draft: Path

    @classmethod
    def build(cls, directory: Path | str) -> TinyModels:
        root = Path(directory)
        tok, text, small, draft = root / "tokenizer", root / "llama", root / "llama-v16", root / "llama-v16-draft"
        if not (tok / "tokenizer.json").exists():
            build_tokenizer(tok)
        if not (text / "config.json").exists():
            build_llama(text, tok)
        if not (small / "config.json").exists():
            build_llama(small, tok, vocab_size=SMALL_VOCAB, seed=1)
        if not (draft / "config.json").exists():
            build_llama(draft, tok, vocab_size=SMALL_VOCAB, seed=2, init_std=0.2)
        return cls(text, small, draft)
