"""Build a small local model pair (until the trained demo models ship) and
write examples/quickstart.toml pointing at it.

The target is a random-weight Llama whose layers after the first make small
corrections (their output projections are scaled down); the draft is the
target's first layer (early exit sharing its embeddings and LM head), so the
two agree often enough to show speculation at work. The text is not meaningful: the weights
are random. Everything is built locally; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parent.parent


def build_tokenizer(out: Path, vocab_size: int) -> PreTrainedTokenizerFast:
    import collections
    import json as json_mod
    import textwrap

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|eos|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([inspect.getsource(m) for m in (collections, json_mod.decoder, textwrap)], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eos|>")
    fast.save_pretrained(out)
    return fast


def build_pair(out: Path, seed: int = 0) -> tuple[Path, Path]:
    torch.manual_seed(seed)
    target_dir, draft_dir = out / "target", out / "draft"
    tok = build_tokenizer(target_dir, 2048)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
                      eos_token_id=tok.eos_token_id, tie_word_embeddings=False, initializer_range=0.06)
    target = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(0.05)
            layer.mlp.down_proj.weight.mul_(0.05)
    target.save_pretrained(target_dir)
    draft_cfg = LlamaConfig(**{**cfg.to_dict(), "num_hidden_layers": 1})
    draft = AutoModelForCausalLM.from_config(draft_cfg, dtype=torch.float32)
    state = {k: v for k, v in target.state_dict().items() if not k.startswith("model.layers.")
             or k.startswith("model.layers.0.")}
    draft.load_state_dict(state)
    draft.save_pretrained(draft_dir)
    tok.save_pretrained(draft_dir)
    return target_dir, draft_dir


def write_config(target: Path, draft: Path, path: Path) -> None:
    path.write_text(f"""# Written by scripts/quickstart.py: a random-weight local model pair.
[model]
path = "{target}"
max_model_len = 1024

[scheduler]
max_num_batched_tokens = 256
max_num_seqs = 32
enable_chunked_prefill = true

[speculative]
proposer = "draft_model"
proposer_options = {{ model = "{draft}" }}
scorer = "mqa"
acceptance = "rejection"
num_speculative_tokens = 4
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".demo")
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "quickstart.toml")
    args = parser.parse_args()
    marker = args.out / "built.json"
    if marker.exists():
        target, draft = args.out / "target", args.out / "draft"
    else:
        target, draft = build_pair(args.out)
        marker.write_text(json.dumps({"target": str(target), "draft": str(draft)}))
    write_config(target.resolve(), draft.resolve(), args.config)
    print(f"model pair in {args.out}; config written to {args.config}")


if __name__ == "__main__":
    main()
