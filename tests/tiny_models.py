"""Build tiny random Hugging Face models and a locally trained tokenizer.

Nothing is downloaded: the tokenizer is a byte-level BPE trained on Python
standard-library source (the conformance kit's, ``speculant.plugin_api.testing``),
and models are random weights from a config. Weights use a wide init so greedy
text varies instead of repeating one token.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, PreTrainedTokenizerFast, Qwen2Config

from speculant.plugin_api.testing.tiny_model import (  # noqa: F401 - re-exported for the tests
    BOS,
    EOS,
    VOCAB_SIZE,
    build_tokenizer,
    training_text,
)

ARCHS = {
    "llama": lambda **kw: LlamaConfig(num_key_value_heads=4, **kw),
    "qwen2": lambda **kw: Qwen2Config(num_key_value_heads=2, use_sliding_window=False, **kw),
    "mistral": lambda **kw: MistralConfig(num_key_value_heads=1, sliding_window=None, **kw),
}


def build_model(arch: str, out_dir: Path, tokenizer_dir: Path, *, hidden: int = 64, layers: int = 2,
                heads: int = 4, max_positions: int = 256, seed: int = 0, init_std: float = 0.3,
                vocab_size: int | None = None) -> Path:
    torch.manual_seed(seed)
    tok = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    config = ARCHS[arch](
        vocab_size=vocab_size or len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, max_position_embeddings=max_positions,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, pad_token_id=tok.eos_token_id,
        tie_word_embeddings=False, initializer_range=init_std,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def patch_config(model_dir: Path, **changes) -> Path:
    path = Path(model_dir) / "config.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))
    return model_dir


# --- helpers for the engine test-suite (appended) ----------------------------

def build_gemma2(out_dir: Path, tokenizer_dir: Path, *, hidden: int = 64, layers: int = 2, heads: int = 4,
                 max_positions: int = 256, softcap: float | None = 50.0, seed: int = 0) -> Path:
    """A tiny random Gemma2 model; by default with ``attn_logit_softcapping``
    (an attention feature speculant refuses) and a window wider than
    ``max_positions`` (so the window itself is harmless)."""
    from transformers import Gemma2Config

    torch.manual_seed(seed)
    tok = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    config = Gemma2Config(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=2, head_dim=hidden // heads,
        max_position_embeddings=max_positions, sliding_window=4 * max_positions,
        attn_logit_softcapping=softcap, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
        pad_token_id=tok.eos_token_id,
    )
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def copy_model(model_dir: Path, out_dir: Path) -> Path:
    """Copy a saved model directory (to patch its config without touching the original)."""
    import shutil

    shutil.copytree(model_dir, out_dir, dirs_exist_ok=True)
    return Path(out_dir)


def set_eos_token(model_dir: Path, eos_token_id: int) -> Path:
    """Make ``eos_token_id`` the model's EOS in config.json and
    generation_config.json (both the engine and ``generate()`` read it there);
    the weights, and so the greedy text, are unchanged."""
    patch_config(model_dir, eos_token_id=eos_token_id)
    gen = Path(model_dir) / "generation_config.json"
    if gen.is_file():
        data = json.loads(gen.read_text())
        data["eos_token_id"] = eos_token_id
        gen.write_text(json.dumps(data))
    return Path(model_dir)


def random_prompts(lengths: list[int], seed: int = 0, vocab_size: int = VOCAB_SIZE) -> list[list[int]]:
    """Token-id prompts of the given lengths (ids 2.. so no special tokens)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab_size, (n,), generator=gen).tolist() for n in lengths]


def loaded_tiny_model(arch: str, tmp_path: Path, seq_len: int = 9):
    """A freshly built 2-layer model of ``arch`` loaded in float32 eval mode, and
    a [1, seq_len] batch of random token ids for it."""
    build_tokenizer(tmp_path / "tok")
    path = build_model(arch, tmp_path / arch, tmp_path / "tok", layers=2)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, seq_len), generator=torch.Generator().manual_seed(1))
    return model, ids
