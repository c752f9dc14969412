"""Training-time drafting for the EAGLE head: pass d sees what draft step d sees.

Pass 1 is teacher-forced: entry j reads the target's hidden state h_j. At
draft step d > 1 the head's newest d - 1 entries were made from its own
predicted features, while older entries hold real ones. Pass d reproduces
that for every position at once: entry j reads the feature pass d - 1
predicted for position j, and attends to keys of pass d - i at position
j - i for i < d, and to pass-1 (real) keys further back. Gradients flow
through every pass (the head learns to correct its own drift).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from speculant.proposers.eagle.model import EagleHead


def _shift(x: torch.Tensor, i: int) -> torch.Tensor:  # [B, heads, T, D] -> position j holds x[j - i]
    return x if i == 0 else F.pad(x, (0, 0, i, 0))[:, :, :x.shape[2]]


def unrolled_features(head: EagleHead, token_emb: torch.Tensor,  # [B, T, H] embedding of t_{j+1}
                      hidden: torch.Tensor,  # [B, T, H] target hidden h_j
                      depth: int) -> list[torch.Tensor]:  # per pass: predicted features [B, T, H]
    b, t, _ = token_emb.shape
    positions = torch.arange(t, device=token_emb.device).expand(b, -1)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    outs: list[torch.Tensor] = []
    feed = hidden
    for d in range(1, depth + 1):
        x = head.fuse(token_emb, feed)
        q, k, v = (z.transpose(1, 2) for z in head._qkv(head.input_norm(x), positions))  # [B, heads, T, D]
        rep = head.heads // head.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        keys.append(k)
        values.append(v)
        scale = 1.0 / math.sqrt(head.head_dim)
        # real keys at positions <= j - d (pass 1), then the last d positions from passes d .. 1
        far = (q @ keys[0].transpose(-1, -2)) * scale  # [B, heads, T, T]
        band = torch.ones(t, t, dtype=torch.bool, device=q.device).tril(-d)
        far = far.masked_fill(~band, float("-inf"))
        near = [(q * _shift(keys[d - 1 - i], i)).sum(-1, keepdim=True) * scale for i in range(d)]  # [B, h, T, 1]
        near_valid = torch.stack([torch.arange(t, device=q.device) >= i for i in range(d)], dim=-1)  # [T, d]
        near_t = torch.cat(near, dim=-1).masked_fill(~near_valid, float("-inf"))
        probs = torch.cat([far, near_t], dim=-1).softmax(-1)
        attn = probs[..., :t] @ values[0]
        for i in range(d):
            attn = attn + probs[..., t + i: t + i + 1] * _shift(values[d - 1 - i], i)
        feats = head._finish(x, attn.transpose(1, 2).flatten(-2))
        outs.append(feats)
        # pass d + 1 reads, at position j, the feature this pass predicted for j (output of entry j - 1)
        feed = F.pad(feats, (0, 0, 1, 0))[:, :t]
        feed = torch.where(torch.arange(t, device=q.device).view(1, t, 1) == 0, hidden, feed)
    return outs
