"""Distillation of the draft on cached teacher data (``scripts/eagle_data.py`` shards).

Each shard holds token rows and the target's final normed hidden states for
them, so the teacher's logits at any position are one matmul with its output
layer: no target forward while training. The loss at position j is
``KL(p_target(. | t_<=j) || p_draft(. | t_<=j)) + ce_weight * CE(draft, t_j+1)``
over valid positions; ``agree`` is the fraction where the draft's argmax is the
target's, the per-token greedy acceptance that speculative decoding turns into
accepted tokens.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F

from eagle_training.train import load_shards, reply_mask, sample_windows, set_lr

WARMUP = 100  # steps


def distill_loss(draft, lm_w: torch.Tensor,  # [V, H_target]
                 tokens: torch.Tensor, mask: torch.Tensor,  # [B, T], [B, T]
                 hidden: torch.Tensor,  # [B, T, H_target] float16
                 ce_weight: float,
                 reply: torch.Tensor | None = None,  # [B, T] bool: positions also scored as ``reply_agree``
                 ) -> tuple[torch.Tensor, dict[str, float]]:
    valid = mask[:, :-1] & mask[:, 1:]  # [B, T-1]: position j predicts token j+1
    logits = draft(input_ids=tokens[:, :-1], use_cache=False).logits[valid].float()  # [N, V]
    with torch.no_grad():
        teacher = hidden[:, :-1][valid].to(lm_w.dtype) @ lm_w.T  # [N, V]
        t_logp = teacher.float().log_softmax(-1)
    d_logp = logits.log_softmax(-1)
    kd = F.kl_div(d_logp, t_logp, log_target=True, reduction="batchmean")
    ce = F.nll_loss(d_logp, tokens[:, 1:][valid])
    with torch.no_grad():
        hit = (d_logp.argmax(-1) == t_logp.argmax(-1)).float()  # [N]
        stats = {"kd": kd.item(), "ce": ce.item(), "agree": hit.mean().item()}
        if reply is not None:
            scored = reply[:, :-1][valid].float()
            stats["reply_agree"] = ((hit * scored).sum() / scored.sum().clamp(min=1)).item()
    return kd + ce_weight * ce, stats


@torch.no_grad()
def evaluate(draft, lm_w, data: dict[str, torch.Tensor], rows: torch.Tensor, ce_weight: float,
             marker: list[int] | None = None, batch: int = 4) -> dict[str, float]:
    draft.eval()
    sums: dict[str, float] = {}
    for i in range(0, len(rows), batch):
        r = rows[i: i + batch]
        tokens, mask = data["tokens"][r], data["mask"][r]
        _, stats = distill_loss(draft, lm_w, tokens, mask, data["hidden"][r], ce_weight,
                                reply=reply_mask(tokens, mask, marker))
        for k, v in stats.items():
            sums[k] = sums.get(k, 0.0) + v * len(r)
    draft.train()
    return {k: round(v / len(rows), 4) for k, v in sums.items()}


def train_draft(draft, cache: Path, lm_w: torch.Tensor,  # [V, H_target], in the teacher's matmul dtype
                *, minutes: float, batch: int, seq_len: int,
                lr: float, ce_weight: float, val_rows: int, bf16: bool = False, log_every: int = 10,
                max_steps: int | None = None, seed: int = 0, marker: list[int] | None = None) -> dict:
    """AdamW, warmup then cosine decay over the wall-time budget (or ``max_steps``),
    random windows of ``seq_len`` tokens; the first ``val_rows`` rows (of ``chat_0``)
    are held out (``reply_agree``: agreement on the reply after the chat
    template's ``marker`` only, what drafting meets)."""
    gen = torch.Generator().manual_seed(seed)
    data = load_shards(cache)
    val_idx, train_idx = torch.arange(val_rows), torch.arange(val_rows, data["tokens"].shape[0])
    opt = torch.optim.AdamW(draft.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    before = evaluate(draft, lm_w, data, val_idx, ce_weight, marker)
    budget, t0, step, history = minutes * 60, time.time(), 0, []
    warmup = min(WARMUP, max(1, max_steps // 5)) if max_steps else WARMUP
    draft.train()
    while time.time() - t0 < budget and (max_steps is None or step < max_steps):
        frac = step / max_steps if max_steps else (time.time() - t0) / budget
        set_lr(opt, lr, step, frac, warmup)
        w = sample_windows(data, train_idx, batch, seq_len, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, stats = distill_loss(draft, lm_w, w["tokens"], w["mask"], w["hidden"], ce_weight)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        step += 1
        if step % log_every == 0:
            history.append({"step": step, "minutes": round((time.time() - t0) / 60, 1),
                            "loss": round(loss.item(), 4), **{k: round(v, 3) for k, v in stats.items()}})
            print(history[-1], flush=True)
    draft.eval()
    return {"steps": step, "train_tokens": int(data["mask"][val_rows:].sum()),
            "train_minutes": round((time.time() - t0) / 60, 1), "val_before": before,
            "val": evaluate(draft, lm_w, data, val_idx, ce_weight, marker), "history": history[-5:]}
