"""Cache teacher data for scripts/train_eagle.py (run once; resumable by shard).

    nice -n 10 python scripts/eagle_data.py --target "$(python scripts/smollm2_path.py)" --cache .train/eagle

Writes ``chat_<i>.pt`` (the target's own greedy replies to training chat
prompts; ``chatb_<i>.pt`` from the second prompt set, ``--prompt-set b``) and
``text_<i>.pt`` (local text snippets), each with teacher-forced hidden states;
see ``scripts/eagle_training/data.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eagle_training.chat_prompts import training_prompts
from eagle_training.data import chat_sequences, corpus_sequences, write_shard
from speculant.model.loading.gguf_source import resolve_model_source


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="target HF directory or GGUF file")
    p.add_argument("--cache", default=".train/eagle")
    p.add_argument("--chat-shards", type=int, default=6)
    p.add_argument("--chat-per-shard", type=int, default=64)
    p.add_argument("--prompt-set", choices=("a", "b", "c"), default="a",
                   help="training prompt set (chat_prompts.py); set a writes chat_<i>.pt, set b chatb_<i>.pt, "
                        "set c chatc_<i>.pt")
    p.add_argument("--chat-max-tokens", type=int, default=256)
    p.add_argument("--text-shards", type=int, default=2)
    p.add_argument("--text-per-shard", type=int, default=128)
    p.add_argument("--text-len", type=int, default=256)
    p.add_argument("--gen-dtype", default="bfloat16", help="dtype the replies are generated in")
    p.add_argument("--max-num-seqs", type=int, default=32, help="replies generated concurrently")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    meta_path = cache / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    target_dir = resolve_model_source(args.target, None, "float32")
    gen_dir = resolve_model_source(args.target, None, args.gen_dtype)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompts = training_prompts(args.chat_shards * args.chat_per_shard, prompt_set=args.prompt_set)
    prefix = "chat_" if args.prompt_set == "a" else f"chat{args.prompt_set}_"
    length = 64 + args.chat_max_tokens
    for i in range(args.chat_shards):
        name = f"{prefix}{i}"
        if name in meta:
            continue
        t0 = time.time()
        chunk = prompts[i * args.chat_per_shard: (i + 1) * args.chat_per_shard]
        seqs = chat_sequences(gen_dir, chunk, args.chat_max_tokens, args.gen_dtype, args.max_num_seqs)
        print(f"{name}: generated {sum(map(len, seqs))} tokens in {time.time() - t0:.0f}s", flush=True)
        write_shard(cache, name, model, seqs, length, pad, meta)
        meta[name]["generate_s"] = round(time.time() - t0, 1)
        meta_path.write_text(json.dumps(meta, indent=2))
        print(f"{name}: {meta[name]}", flush=True)
    for i in range(args.text_shards):
        name = f"text_{i}"
        if name in meta:
            continue
        seqs = corpus_sequences(tokenizer, args.text_per_shard, args.text_len, seed=100 + i)
        write_shard(cache, name, model, seqs, args.text_len, pad, meta)
        print(f"{name}: {meta[name]}", flush=True)


if __name__ == "__main__":
    main()
