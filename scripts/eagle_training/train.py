"""Fit an EAGLE head to cached teacher data (``data.py``).

Entry j reads (embedding of t_{j+1}, target hidden h_j) and learns the
target's next feature h_{j+1} (smooth-L1) and its next-token distribution
softmax(lm_head(h_{j+1})) restricted to the draft vocabulary (soft cross
entropy), as in EAGLE; ``unroll.py`` adds passes that read the head's own
predicted features, as drafting does after its first step.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

from eagle_training.unroll import unrolled_features
from speculant.proposers.eagle.model import EagleHead


def load_shards(cache: Path) -> dict[str, torch.Tensor]:
    """Every cached shard, concatenated: tokens [N, T], mask [N, T], hidden [N, T, H] (padded to one T)."""
    shards = [torch.load(p) for p in sorted(cache.glob("*.pt"))]
    if not shards:
        raise SystemExit(f"--cache {cache}: no shards; run scripts/eagle_data.py first")
    length = max(s["tokens"].shape[1] for s in shards)
    out: dict[str, list[torch.Tensor]] = {"tokens": [], "mask": [], "hidden": []}
    for s in shards:
        pad = length - s["tokens"].shape[1]
        out["tokens"].append(F.pad(s["tokens"], (0, pad)))
        out["mask"].append(F.pad(s["mask"], (0, pad)))
        out["hidden"].append(F.pad(s["hidden"], (0, 0, 0, pad)))
    return {k: torch.cat(v) for k, v in out.items()}


def frequent_tokens(tokens: torch.Tensor, mask: torch.Tensor, size: int, always: list[int],
                    vocab_size: int) -> torch.Tensor:
    """The draft vocabulary, sorted: ``always``, then the data's tokens by
    frequency, then the lowest unseen ids (BPE ids rise with merge order,
    roughly falling frequency) up to ``size``."""
    counts = Counter(tokens[mask].tolist())
    chosen = list(dict.fromkeys([t for t in always if t is not None] + [t for t, _ in counts.most_common()]))
    seen = set(chosen)
    extra = [t for t in range(vocab_size) if t not in seen]
    return torch.tensor(sorted((chosen + extra)[:size]))


def assistant_marker(tokenizer) -> list[int] | None:
    """The token ids the chat template puts before a reply (what adding the
    generation prompt appends); None for a tokenizer without a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    chat = [{"role": "user", "content": "x"}]
    bare = tokenizer.apply_chat_template(chat, tokenize=False)
    full = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    header = full[len(bare):] if full.startswith(bare) else ""
    return tokenizer.encode(header, add_special_tokens=False) or None


def reply_mask(tokens: torch.Tensor, mask: torch.Tensor,  # [N, T], [N, T]
               marker: list[int] | None) -> torch.Tensor:  # [N, T] bool
    """Positions of the reply: at or after the end of the last ``marker`` (the
    chat template's assistant header) in each row. The target's hidden state
    there predicts a reply token after the first, which is what a proposer drafts;
    rows without the marker (plain text) and ``marker=None`` count whole."""
    if not marker:
        return mask.clone()
    n, t, m = tokens.shape[0], tokens.shape[1], len(marker)
    hits = torch.ones(n, t - m + 1, dtype=torch.bool)
    for i, tok in enumerate(marker):
        hits &= tokens[:, i: t - m + 1 + i] == tok
    pos = torch.arange(t - m + 1).expand(n, -1)
    last = torch.where(hits, pos, torch.full_like(pos, -1)).max(dim=1).values  # [N]
    start = torch.where(last >= 0, last + m, torch.zeros_like(last))
    return mask & (torch.arange(t).expand(n, -1) >= start.unsqueeze(1))


def set_lr(opt: torch.optim.Optimizer, lr: float, step: int, frac: float, warmup: int) -> None:
    """Linear warmup over ``warmup`` steps, then cosine decay over the budget fraction ``frac``
    (floored at 2 % of ``lr``)."""
    scale = min(1.0, (step + 1) / warmup) * 0.5 * (1 + torch.cos(torch.tensor(frac * torch.pi)).item())
    for g in opt.param_groups:
        g["lr"] = lr * max(scale, 0.02)


def sample_windows(data: dict[str, torch.Tensor], rows_from: torch.Tensor, batch: int, seq_len: int,
                   gen: torch.Generator) -> dict[str, torch.Tensor]:
    """``batch`` random windows of ``seq_len`` positions from rows ``rows_from``: each entry of
    ``data`` cut to [batch, seq_len, ...] (windows past a row's end read its padding)."""
    lengths = data["mask"].sum(1)
    rows = rows_from[torch.randint(len(rows_from), (batch,), generator=gen)]
    starts = [int(torch.randint(max(1, int(lengths[r]) - seq_len + 1), (1,), generator=gen)) for r in rows]
    window = torch.stack([torch.arange(s, s + seq_len) for s in starts]).clamp(max=data["tokens"].shape[1] - 1)
    pick = rows.unsqueeze(1)
    return {k: v[pick, window] for k, v in data.items()}


def head_loss(head: EagleHead, emb_w: torch.Tensor, draft_w: torch.Tensor,  # [V, H], [Vd, H]
              tokens: torch.Tensor, mask: torch.Tensor, hidden: torch.Tensor,  # [B, T], [B, T], [B, T, H]
              depth: int, noise: float, cls_weight: float,
              reply: torch.Tensor | None = None,  # [B, T] bool: positions also scored as ``reply_acc``
              reply_only: bool = False,
              ) -> tuple[torch.Tensor, dict]:
    """Loss of one batch and its per-pass top-1 agreement with the target (over
    every position, and with ``reply`` over the reply's positions only). With
    ``reply_only`` the loss too counts only the reply's positions (never drafted:
    the system prompt and the user's turn)."""
    h_in = hidden[:, :-1].float()
    if noise:
        h_in = h_in + torch.randn_like(h_in) * noise * h_in.std()
    emb = F.embedding(tokens[:, 1:], emb_w)
    target = hidden[:, 1:].float()
    valid = (mask[:, 1:] & mask[:, :-1]).float()  # [B, T-1]
    scored = valid * reply[:, 1:].float() if reply is not None else valid  # entry j scored at position j + 1
    weight = scored if reply_only else valid
    with torch.no_grad():
        target_logits = target @ draft_w.T
        target_p = target_logits.softmax(-1)
        target_top = target_logits.argmax(-1)
    total, stats = torch.zeros(()), {}
    for d, feats in enumerate(unrolled_features(head, emb, h_in, depth), start=1):
        norm = weight.sum().clamp(min=1)  # a window may hold no reply position
        reg = (F.smooth_l1_loss(feats, target, reduction="none").mean(-1) * weight).sum() / norm
        logq = (feats @ draft_w.T).log_softmax(-1)
        cls = (-(target_p * logq).sum(-1) * weight).sum() / norm
        total = total + (reg + cls_weight * cls) * (1.0 if d == 1 else 0.5)
        hit = (logq.argmax(-1) == target_top).float()
        stats[f"acc{d}"] = float((hit * valid).sum() / valid.sum())
        if reply is not None:
            stats[f"reply_acc{d}"] = float((hit * scored).sum() / scored.sum().clamp(min=1))
        stats[f"reg{d}"] = float(reg.detach())
    return total, stats


def train_head(head: EagleHead, cache: Path, emb_w: torch.Tensor, lm_w: torch.Tensor, *,
               minutes: float, batch: int, seq_len: int, lr: float, depth: int, noise: float,
               cls_weight: float, val_rows: int, bf16: bool = False, reload_minutes: float = 5.0,
               log_every: int = 5, seed: int = 0, marker: list[int] | None = None,
               reply_only: bool = False) -> dict:
    """AdamW with warmup + cosine decay over the time budget; random windows of
    ``seq_len`` tokens from the training rows; the first ``val_rows`` rows
    (of ``chat_0``) are held out and report agreement (``reply_acc``: on the
    reply after the chat template's ``marker`` only, what drafting meets; with
    ``reply_only`` the loss counts only those positions too). Shards that appear in
    ``cache`` while training (data generation still running) are loaded every
    ``reload_minutes``."""
    gen = torch.Generator().manual_seed(seed)
    data, loaded, last_load = load_shards(cache), len(list(cache.glob("*.pt"))), time.time()
    data["reply"] = reply_mask(data["tokens"], data["mask"], marker)
    draft_w = lm_w[head.draft_ids] if head.draft_ids.numel() else lm_w
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=lr, weight_decay=0.0,
                            betas=(0.9, 0.95))
    budget, t0, step, history = minutes * 60, time.time(), 0, []
    while time.time() - t0 < budget:
        if time.time() - last_load > reload_minutes * 60 and len(list(cache.glob("*.pt"))) > loaded:
            data, loaded = load_shards(cache), len(list(cache.glob("*.pt")))
            data["reply"] = reply_mask(data["tokens"], data["mask"], marker)
            print(f"reloaded: {loaded} shards, {int(data['mask'].sum())} tokens", flush=True)
        if time.time() - last_load > reload_minutes * 60:
            last_load = time.time()
        val_idx, train_idx = torch.arange(val_rows), torch.arange(val_rows, data["tokens"].shape[0])
        set_lr(opt, lr, step, (time.time() - t0) / budget, warmup=50)
        w = sample_windows(data, train_idx, batch, seq_len, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, stats = head_loss(head, emb_w, draft_w, w["tokens"], w["mask"], w["hidden"], depth, noise,
                                    cls_weight, reply=w["reply"], reply_only=reply_only)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        step += 1
        if step % log_every == 0:
            history.append({"step": step, "minutes": round((time.time() - t0) / 60, 1),
                            "loss": round(float(loss), 4), **{k: round(v, 3) for k, v in stats.items()}})
            print(history[-1], flush=True)
    head.eval()
    with torch.no_grad():
        tokens, mask = data["tokens"][val_idx], data["mask"][val_idx]
        _, val = head_loss(head, emb_w, draft_w, tokens, mask, data["hidden"][val_idx], depth, 0.0, cls_weight,
                           reply=data["reply"][val_idx])
    return {"steps": step, "shards": loaded, "train_tokens": int(data["mask"][val_rows:].sum()),
            "train_minutes": round((time.time() - t0) / 60, 1), "val": val, "history": history[-5:]}
