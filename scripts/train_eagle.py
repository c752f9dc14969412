"""Train an EAGLE head for a target on CPU from cached teacher data.

    nice -n 10 python scripts/eagle_data.py --target "$(python scripts/smollm2_path.py)" --cache .train/eagle
    nice -n 10 python scripts/train_eagle.py --target "$(python scripts/smollm2_path.py)" --cache .train/eagle \\
        --out models/smollm2-eagle --minutes 45 --eval

The head (``speculant/proposers/eagle/model.py``) starts from the target's
last decoder layer and final norm, with a draft vocabulary of the
``--draft-vocab`` most frequent tokens of the data (FR-Spec); it is saved in
float16 with ``training.json`` (settings, held-out agreement and, with
``--eval``, the engine's acceptance on the held-out chat prompts).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eagle_training.engine_eval import engine_acceptance
from eagle_training.train import assistant_marker, frequent_tokens, load_shards, train_head
from speculant.model.loading.files import read_text_config
from speculant.model.loading.gguf_source import resolve_model_source
from speculant.proposers.eagle.model import EagleHead, eagle_config
from speculant.proposers.heads.common import save_heads

LAYER_WEIGHTS = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
                 "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
                 "down_proj": "mlp.down_proj", "input_norm": "input_layernorm",
                 "post_norm": "post_attention_layernorm"}


def init_from_target(head: EagleHead, target) -> None:
    """The head's layer starts as the target's last layer, its norm as the target's final norm."""
    last = target.model.layers[-1]
    with torch.no_grad():
        for ours, theirs in LAYER_WEIGHTS.items():
            getattr(head, ours).weight.copy_(last.get_submodule(theirs).weight)
        head.norm.weight.copy_(target.model.norm.weight)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="target HF directory or GGUF file")
    p.add_argument("--cache", default=".train/eagle")
    p.add_argument("--out", required=True)
    p.add_argument("--draft-vocab", type=int, default=8192, help="0: the target's whole vocabulary")
    p.add_argument("--minutes", type=float, default=45.0, help="training wall-time budget")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=192)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--depth", type=int, default=3, help="training passes that read the head's own features")
    p.add_argument("--noise", type=float, default=0.05, help="input-feature noise, relative to its std")
    p.add_argument("--cls-weight", type=float, default=1.0)
    p.add_argument("--val-rows", type=int, default=24)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast for the training matmuls")
    p.add_argument("--reply-only", action="store_true",
                   help="loss on the reply's positions only (after the chat template's assistant header)")
    p.add_argument("--init", default=None, help="start from this head directory (same draft vocabulary)")
    p.add_argument("--eval", action="store_true", help="measure the engine's acceptance on held-out chat prompts")
    p.add_argument("--eval-dtype", default="float32")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    target_dir = resolve_model_source(args.target, None, "float32")
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval().requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    data = load_shards(Path(args.cache))
    cfg = eagle_config(read_text_config(target_dir), args.draft_vocab or None)
    head = EagleHead(cfg)
    init_from_target(head, target)
    if args.draft_vocab:
        always = [tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]
        head.draft_ids.copy_(frequent_tokens(data["tokens"], data["mask"], args.draft_vocab, always,
                                                   cfg["vocab_size"]))
        coverage = float(torch.isin(data["tokens"][data["mask"]], head.draft_ids).float().mean())
    else:
        coverage = 1.0
    if args.init:  # continue a trained head: its weights and its draft vocabulary
        head.load_state_dict(load_file(str(Path(args.init) / "model.safetensors")))
        head.float()
    t0 = time.time()
    emb_w, lm_w = target.get_input_embeddings().weight, target.get_output_embeddings().weight
    result = train_head(head, Path(args.cache), emb_w, lm_w,
                        minutes=args.minutes, batch=args.batch, seq_len=args.seq_len, lr=args.lr, depth=args.depth,
                        noise=args.noise, cls_weight=args.cls_weight, val_rows=args.val_rows,
                        bf16=args.bf16, marker=assistant_marker(tokenizer),
                        reply_only=args.reply_only)
    save_heads(head.to(torch.float16), cfg, args.out)
    report = {"target": str(args.target), "data": json.loads((Path(args.cache) / "meta.json").read_text()),
              "draft_vocab": args.draft_vocab, "draft_vocab_coverage": round(coverage, 4),
              "settings": {k: getattr(args, k) for k in ("minutes", "batch", "seq_len", "lr", "depth", "noise",
                                                         "cls_weight", "threads", "bf16", "init", "reply_only")},
              "train_seconds": round(time.time() - t0, 1), **result}
    if args.eval:
        report["engine_eval"] = engine_acceptance(args.target, "eagle", {"path": args.out}, 4, 128, args.eval_dtype)
    (Path(args.out) / "training.json").write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
