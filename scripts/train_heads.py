"""Fit Medusa or MLP-speculator heads to a target by self-distillation.

The target writes its own greedy continuations of corpus snippets (through
Speculant, batched); the heads learn to predict those tokens from the
target's final hidden states: Medusa head j at position t predicts token
t+2+j; MLP-speculator stage j also sees token t+1+j (teacher forcing).
Held-out top-1 accuracy per head is written to the heads directory, and
with ``--eval-prompts N`` the engine's own acceptance rate and mean accepted
length with these heads on N held-out prompts (greedy, k = ``--k``).

    python scripts/train_heads.py --target models/demo-target --kind medusa --out models/demo-medusa \
        --manifest .train/corpus/manifest.json --save-dtype float16 --eval-prompts 32

``--manifest`` (written by ``scripts/train_demo_models.py``) keeps training
snippets to its train files and evaluation prompts to its held-out files;
without it snippets come from every top-level stdlib module and the
evaluation (if asked for) reuses them.
"""

from __future__ import annotations

import argparse
import json
import random
import sysconfig
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from speculant import LLM, SamplingParams
from speculant.proposers.heads.common import save_heads
from speculant.proposers.heads.medusa import MedusaHeads, medusa_config
from speculant.proposers.heads.mlp_speculator import MLPSpeculator, mlp_speculator_config


def corpus_files(manifest: str | None, split: str) -> list[Path]:
    """Source files to cut snippets from: a manifest's ``split`` files, or every
    top-level stdlib module."""
    if manifest is None:
        return sorted(p for p in Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    data = json.loads(Path(manifest).read_text())
    root = Path(data["stdlib_root"])
    files = [root / f["path"] for f in data["files"] if f["split"] == split]
    if not files:
        raise SystemExit(f"--manifest {manifest}: no {split!r} files listed")
    return files


def corpus_prompts(tokenizer, num: int, prompt_len: int, seed: int,
                   files: list[Path] | None = None) -> list[list[int]]:
    """Token-id snippets from the Python standard library's source."""
    files = files if files is not None else corpus_files(None, "train")
    rng = random.Random(seed)
    prompts = []
    while len(prompts) < num:
        ids = tokenizer(rng.choice(files).read_text(errors="ignore"), add_special_tokens=False)["input_ids"]
        if len(ids) > prompt_len:
            start = rng.randrange(len(ids) - prompt_len)
            prompts.append(ids[start: start + prompt_len])
    return prompts


def self_distill_sequences(target_dir: str, prompts: list[list[int]], gen_len: int) -> list[list[int]]:
    llm = LLM(model=target_dir, max_num_seqs=64, max_num_batched_tokens=2048)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=gen_len, ignore_eos=True), use_tqdm=False)
    return [p + o.outputs[0].token_ids for p, o in zip(prompts, outs)]


@torch.no_grad()
def hidden_states(model, seqs: list[list[int]]) -> torch.Tensor:  # [N, T, H]
    ids = torch.tensor(seqs)
    return torch.cat([model.base_model(input_ids=ids[i: i + 16]).last_hidden_state for i in range(0, len(ids), 16)])


def examples(hidden: torch.Tensor,  # [N, T, H]
             seqs: torch.Tensor,  # [N, T]
             start: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h_t [M, H], teacher tokens x_{t+1..t+k} [M, k], labels x_{t+2..t+k+1} [M, k]) for t >= start."""
    t_max = seqs.shape[1] - k - 1
    h = hidden[:, start - 1: t_max].reshape(-1, hidden.shape[-1])
    prev = torch.stack([seqs[:, start + j: t_max + 1 + j] for j in range(k)], dim=-1).reshape(-1, k)
    labels = torch.stack([seqs[:, start + 1 + j: t_max + 2 + j] for j in range(k)], dim=-1).reshape(-1, k)
    return h, prev, labels


def head_logits(kind: str, heads, lm_head, h, prev):  # [k, M, V]
    return heads(h, lm_head) if kind == "medusa" else heads(h, prev)


def train(args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    hidden_size = model.config.get_text_config().hidden_size
    vocab = model.get_output_embeddings().weight.shape[0]
    t0 = time.time()
    prompts = corpus_prompts(tokenizer, args.num_sequences, args.prompt_len, args.seed,
                             corpus_files(args.manifest, "train"))
    seqs = torch.tensor(self_distill_sequences(args.target, prompts, args.gen_len))
    hidden = hidden_states(model, seqs.tolist())
    n_val = max(1, len(seqs) // 10)
    train_ex = examples(hidden[n_val:], seqs[n_val:], args.prompt_len, args.k)
    val_ex = examples(hidden[:n_val], seqs[:n_val], args.prompt_len, args.k)
    if args.kind == "medusa":
        cfg = medusa_config(hidden_size, vocab, args.k, args.layers, share_lm_head=True)
        heads = MedusaHeads.from_config(cfg)
    else:
        cfg = mlp_speculator_config(hidden_size, vocab, args.k, args.inner_dim)
        heads = MLPSpeculator.from_config(cfg)
    lm_head = model.get_output_embeddings().requires_grad_(False)
    opt = torch.optim.AdamW(heads.parameters(), lr=args.lr, weight_decay=0.0)
    num = train_ex[0].shape[0]
    for _ in range(args.steps):
        idx = torch.randint(0, num, (args.batch_size,))
        logits = head_logits(args.kind, heads, lm_head, train_ex[0][idx], train_ex[1][idx])  # [k, B, V]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), train_ex[2][idx].T.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        val_logits = head_logits(args.kind, heads, lm_head, val_ex[0], val_ex[1])
        accuracy = (val_logits.argmax(-1) == val_ex[2].T).float().mean(dim=1).tolist()
    save_heads(heads.to(getattr(torch, args.save_dtype)), cfg, args.out)
    report = {"kind": args.kind, "target": str(args.target), "k": args.k, "steps": args.steps,
              "final_train_loss": float(loss.detach()), "heldout_top1_per_head": accuracy,
              "num_sequences": args.num_sequences, "save_dtype": args.save_dtype,
              "train_seconds": round(time.time() - t0, 1)}
    if args.eval_prompts:
        report["engine_eval"] = engine_acceptance(args)
    (Path(args.out) / "training.json").write_text(json.dumps(report, indent=2))
    return report


def engine_acceptance(args: argparse.Namespace) -> dict:
    """Greedy generation through the engine with the saved heads: acceptance
    rate and mean accepted length (tokens per verify step) on held-out prompts."""
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    split = "heldout" if args.manifest else "train"
    prompts = corpus_prompts(tokenizer, args.eval_prompts, args.eval_prompt_len, args.seed + 1,
                             corpus_files(args.manifest, split))
    llm = LLM(model=args.target, max_num_seqs=16, max_num_batched_tokens=2048, enable_chunked_prefill=False,
              speculative={"proposer": args.kind, "num_speculative_tokens": args.k,
                           "proposer_options": {"path": str(args.out)}})
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=args.gen_len, ignore_eos=True), use_tqdm=False)
    m = llm.get_metrics()
    return {"prompts": f"{args.eval_prompts} x {args.eval_prompt_len} tokens from {split} files",
            "new_tokens": args.gen_len, "num_speculative_tokens": args.k,
            "acceptance_rate": m["acceptance_rate"], "mean_accepted_length": m["mean_accepted_length"]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--kind", choices=["medusa", "mlp_speculator"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--k", type=int, default=4, help="heads / stages = largest num_speculative_tokens")
    p.add_argument("--layers", type=int, default=1, help="Medusa residual blocks per head")
    p.add_argument("--inner-dim", type=int, default=None, help="MLP speculator width (default: hidden)")
    p.add_argument("--num-sequences", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--gen-len", type=int, default=96)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--manifest", default=None,
                   help="corpus manifest of scripts/train_demo_models.py: train on its train files, "
                        "evaluate on its held-out files")
    p.add_argument("--save-dtype", choices=["float32", "float16", "bfloat16"], default="float32",
                   help="dtype of the saved weights (loaded in the target's dtype)")
    p.add_argument("--eval-prompts", type=int, default=0,
                   help="also measure engine acceptance on this many prompts (0: skip)")
    p.add_argument("--eval-prompt-len", type=int, default=64)
    return p.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(train(parse_args()), indent=2))
