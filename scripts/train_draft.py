"""Distil a small standalone draft model for a target on CPU from cached teacher data.

    nice -n 10 python scripts/eagle_data.py --target "$(python scripts/smollm2_path.py)" --cache .train/eagle
    nice -n 10 python scripts/train_draft.py --target "$(python scripts/smollm2_path.py)" --cache .train/eagle \\
        --out /tmp/smollm2-draft --minutes 40 --eval

The draft (``draft_distill/model.py``) is a small Llama with the target's
tokenizer, saved in float16 as a Hugging Face directory with the target's
tokenizer files, so both Speculant's ``draft_model`` proposer and
transformers' assisted generation (``assistant_model=``) can load it.
``training.json`` records the settings, the held-out agreement with the
target and, with ``--eval``, the engine's acceptance on held-out chat prompts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_distill.model import DraftShape, build_draft, param_count
from draft_distill.train import train_draft
from eagle_training.engine_eval import engine_acceptance
from eagle_training.train import assistant_marker
from speculant.model.loading.files import read_text_config
from speculant.model.loading.gguf_source import resolve_model_source


def save_draft(draft, tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    draft.to(torch.float16).save_pretrained(out)
    cfg = draft.config
    GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
                     pad_token_id=cfg.pad_token_id).save_pretrained(out)
    tokenizer.save_pretrained(out)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="target HF directory or GGUF file")
    p.add_argument("--cache", default=".train/eagle", help="shards written by scripts/eagle_data.py")
    p.add_argument("--out", required=True)
    p.add_argument("--hidden", type=int, default=DraftShape.hidden)
    p.add_argument("--layers", type=int, default=DraftShape.layers)
    p.add_argument("--heads", type=int, default=DraftShape.heads)
    p.add_argument("--kv-heads", type=int, default=DraftShape.kv_heads)
    p.add_argument("--intermediate", type=int, default=DraftShape.intermediate)
    p.add_argument("--minutes", type=float, default=40.0, help="training wall-time budget")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--ce-weight", type=float, default=0.2, help="weight of the data's next token next to the KL")
    p.add_argument("--val-rows", type=int, default=24)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--fp32", action="store_true",
                   help="float32 matmuls (default: bfloat16 autocast for the draft and a bfloat16 teacher "
                        "output layer, ~5x faster on CPUs with AVX512-BF16)")
    p.add_argument("--init", default=None, help="continue training this draft directory (its shape wins over "
                                                "--hidden/--layers/...)")
    p.add_argument("--eval", action="store_true", help="measure the engine's acceptance on held-out chat prompts")
    p.add_argument("--eval-dtype", default="float32")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    target_dir = resolve_model_source(args.target, None, "float32")
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval().requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    if args.init:
        draft = AutoModelForCausalLM.from_pretrained(args.init, dtype=torch.float32)
        c = draft.config
        shape = DraftShape(c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
                           c.intermediate_size)
    else:
        shape = DraftShape(args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate)
        draft = build_draft(read_text_config(target_dir), target.get_input_embeddings().weight, shape)
    lm_w = target.get_output_embeddings().weight
    lm_w = lm_w if args.fp32 else lm_w.to(torch.bfloat16)
    t0 = time.time()
    result = train_draft(draft, Path(args.cache), lm_w, minutes=args.minutes, batch=args.batch,
                         seq_len=args.seq_len, lr=args.lr, ce_weight=args.ce_weight, val_rows=args.val_rows,
                         bf16=not args.fp32, marker=assistant_marker(tokenizer))
    out = Path(args.out)
    save_draft(draft, tokenizer, out)
    report = {"target": str(args.target), "params": param_count(draft), "shape": shape.__dict__,
              "data": json.loads((Path(args.cache) / "meta.json").read_text()),
              "settings": {k: getattr(args, k) for k in ("minutes", "batch", "seq_len", "lr", "ce_weight",
                                                         "threads", "fp32", "init")},
              "train_seconds": round(time.time() - t0, 1), **result}
    if args.eval:
        report["engine_eval"] = engine_acceptance(args.target, "draft_model", {"model": str(out)}, 4, 128,
                                                  args.eval_dtype)
    (out / "training.json").write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
