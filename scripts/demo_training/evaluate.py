"""Evaluation of a target/draft pair, written to JSON.

* held-out loss of both (fp32, non-overlapping windows over the held-out files);
* greedy agreement alpha: the target continues held-out prompts greedily; alpha
  is the fraction of those target tokens that the draft's argmax predicts from
  the same prefix (one teacher-forced draft forward over prompt + continuation);
  from the same match pattern, the mean tokens per verify step that greedy
  speculation with k draft tokens would produce (accepted run + 1);
* degeneracy of the target's greedy text: distinct-4gram ratio, fraction of
  repeated lines and fraction of continuations that end in a loop, next to the
  same numbers for the real held-out continuations of the same prompts.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import torch
import torch.nn.functional as F


def pick_prompts(heldout: np.ndarray, docs: list[dict], n: int, prompt_len: int, gen_len: int,
                 seed: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """n prompts from distinct held-out files (cycling if there are fewer files), each followed by
    gen_len real tokens (the reference continuation)."""
    rng = np.random.default_rng([seed, 7])
    need = prompt_len + gen_len
    usable = [d for d in docs if d["end"] - d["start"] >= need]
    if not usable:
        raise ValueError("no held-out file is long enough for the prompt and continuation lengths")
    order = rng.permutation(len(usable))
    prompts, refs, paths = [], [], []
    for i in range(n):
        d = usable[int(order[i % len(usable)])]
        s = int(rng.integers(d["start"], d["end"] - need + 1))
        prompts.append(heldout[s:s + prompt_len])
        refs.append(heldout[s + prompt_len:s + need])
        paths.append(d["path"])

    def as_t(xs):
        return torch.from_numpy(np.stack(xs).astype(np.int64))

    return as_t(prompts), as_t(refs), paths


@torch.no_grad()
def greedy(model, prompts: torch.Tensor, n_new: int) -> torch.Tensor:
    """Batched greedy continuation with the KV cache (same-length prompts, no padding; EOS ignored)."""
    # transformers >= 5.2x names the cache argument `cache`; earlier 5.x `past_key_values`
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(input_ids=prompts, use_cache=True)
    tok = out.logits[:, -1].argmax(-1, keepdim=True)
    toks = [tok]
    for _ in range(n_new - 1):
        out = model(input_ids=tok, use_cache=True, **{name: out[name]})
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        toks.append(tok)
    return torch.cat(toks, dim=1)


@torch.no_grad()
def heldout_loss(model, heldout: np.ndarray, seq_len: int, batch_size: int, max_tokens: int | None) -> float:
    n = (len(heldout) - 1) // seq_len
    if max_tokens:
        n = min(n, max(1, max_tokens // seq_len))
    total, count = 0.0, 0
    for i in range(0, n, batch_size):
        rows = [heldout[j * seq_len:j * seq_len + seq_len + 1] for j in range(i, min(n, i + batch_size))]
        b = torch.from_numpy(np.stack(rows).astype(np.int64))
        logits = model(input_ids=b[:, :-1], use_cache=False).logits.float()
        total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), b[:, 1:].reshape(-1), reduction="sum").item()
        count += b[:, 1:].numel()
    return total / count


def tokens_per_step(matches: np.ndarray, k: int) -> float:
    """Mean tokens per verify step of greedy speculation with k proposals, given per-position
    draft==target matches along the target's own greedy text."""
    steps, produced = 0, 0
    for row in matches:
        i = 0
        while i < len(row):
            m = 0
            while m < k and i + m < len(row) and row[i + m]:
                m += 1
            got = min(m + 1, len(row) - i)
            produced += got
            steps += 1
            i += got
    return produced / steps


def distinct_ngrams(ids: list[int], n: int = 4) -> float:
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) / max(1, len(grams))


def repeated_line_fraction(text: str) -> float:
    lines = [ln.strip() for ln in text.split("\n")[:-1]]     # the last line may be cut off
    lines = [ln for ln in lines if ln]
    seen, rep = set(), 0
    for ln in lines:
        rep += ln in seen
        seen.add(ln)
    return rep / max(1, len(lines))


def ends_in_loop(ids: list[int], tail: int = 96, max_period: int = 48) -> bool:
    """The last `tail` tokens (at most half the continuation) repeat with a period <= max_period."""
    t = ids[-min(tail, len(ids) // 2):]
    periods = range(1, min(max_period, len(t) // 3) + 1)       # at least three repetitions
    return any(all(t[i] == t[i - p] for i in range(p, len(t))) for p in periods)


def text_stats(tokenizer, seqs: torch.Tensor) -> dict:
    ids = [row.tolist() for row in seqs]
    texts = [tokenizer.decode(r) for r in ids]
    return {"distinct_4gram": float(np.mean([distinct_ngrams(r) for r in ids])),
            "repeated_line_fraction": float(np.mean([repeated_line_fraction(t) for t in texts])),
            "loop_fraction": float(np.mean([ends_in_loop(r) for r in ids]))}


def evaluate_pair(target, draft, tokenizer, heldout: np.ndarray, docs: list[dict], *, n_prompts: int,
                  prompt_len: int, gen_len: int, seq_len: int, seed: int, loss_tokens: int | None,
                  n_samples: int = 4) -> dict:
    prompts, refs, paths = pick_prompts(heldout, docs, n_prompts, prompt_len, gen_len, seed)
    gen = greedy(target, prompts, gen_len)
    full = torch.cat([prompts, gen], dim=1)
    d_pred = draft(input_ids=full[:, :-1], use_cache=False).logits[:, prompt_len - 1:].argmax(-1)
    t_pred = target(input_ids=full[:, :-1], use_cache=False).logits[:, prompt_len - 1:].argmax(-1)
    matches = (d_pred == gen).numpy()
    alpha = float(matches.mean())
    gen_stats, ref_stats = text_stats(tokenizer, gen), text_stats(tokenizer, refs)
    non_degenerate = (gen_stats["distinct_4gram"] >= 0.7 * ref_stats["distinct_4gram"]
                      and gen_stats["loop_fraction"] <= 0.25
                      and gen_stats["repeated_line_fraction"] <= ref_stats["repeated_line_fraction"] + 0.2)
    t_loss = heldout_loss(target, heldout, seq_len, 8, loss_tokens)
    d_loss = heldout_loss(draft, heldout, seq_len, 8, loss_tokens)
    return {
        "heldout_loss": {"target": t_loss, "draft": d_loss},
        "heldout_ppl": {"target": math.exp(t_loss), "draft": math.exp(d_loss)},
        "alpha_greedy": alpha,
        "alpha_by_position_quartile": [float(q.mean()) for q in np.array_split(matches, 4, axis=1)],
        "tokens_per_verify_step": {f"k={k}": tokens_per_step(matches, k) for k in (1, 2, 3, 4, 5, 6)},
        "target_consistency": float((t_pred == gen).float().mean()),
        "target_text": gen_stats,
        "reference_text": ref_stats,
        "non_degenerate": bool(non_degenerate),
        "goal_alpha_0_75": alpha >= 0.75,
        "settings": {"n_prompts": n_prompts, "prompt_len": prompt_len, "gen_len": gen_len, "seed": seed,
                     "seq_len": seq_len, "loss_tokens": loss_tokens or int(len(heldout))},
        "samples": [{"file": paths[i], "prompt": tokenizer.decode(prompts[i].tolist()),
                     "target": tokenizer.decode(gen[i].tolist())} for i in range(min(n_samples, n_prompts))],
    }
