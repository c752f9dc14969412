"""The EAGLE head: one Llama-style decoder layer over [token embedding ; target feature].

Entry j of a sequence reads the embedding of token j+1 and the target's final
(normed) hidden state at position j, fuses them (``fc``), runs one decoder
layer with its own KV cache and predicts the target's feature at position
j+1 (``norm`` brings it to the target's normed scale); the target's LM head,
or its rows for a reduced draft vocabulary (``draft_ids``, FR-Spec style),
turns that feature into logits for token j+2. Drafting feeds each predicted
feature back in as the next entry's hidden state.

The token embedding and LM head are the target's own modules (passed in,
never stored), so a saved head holds only ``fc``, the layer, ``norm`` and the
draft vocabulary's ids.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MODEL_TYPE = "speculant_eagle"


def eagle_config(target_cfg: dict, draft_vocab_size: int | None = None) -> dict:
    """A head config sized like one layer of the target (a transformers
    config dict of a Llama-style model)."""
    heads = target_cfg["num_attention_heads"]
    return {
        "model_type": MODEL_TYPE, "hidden_size": target_cfg["hidden_size"], "vocab_size": target_cfg["vocab_size"],
        "num_attention_heads": heads, "num_key_value_heads": target_cfg.get("num_key_value_heads", heads),
        "head_dim": target_cfg.get("head_dim") or target_cfg["hidden_size"] // heads,
        "intermediate_size": target_cfg["intermediate_size"],
        "rope_theta": float((target_cfg.get("rope_parameters") or {}).get("rope_theta")
                            or target_cfg.get("rope_theta", 10000.0)),
        "rms_norm_eps": float(target_cfg.get("rms_norm_eps", 1e-6)),
        "draft_vocab_size": draft_vocab_size,
    }


def rotate(x: torch.Tensor,  # [T, heads, D]
           cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # [T, 1, D]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class SeqKV:
    """One sequence's K/V in the head's single layer, grown by doubling.
    ``length`` entries are valid; ``truncate`` rolls back (later writes overwrite)."""

    def __init__(self, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.k = torch.empty(64, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor  # [m, kv_heads, D]
               ) -> tuple[torch.Tensor, torch.Tensor]:  # all valid K, V [length, kv_heads, D]
        end = self.length + k.shape[0]
        if end > self.k.shape[0]:
            cap = max(end, 2 * self.k.shape[0])
            grown_k = self.k.new_empty(cap, *self.k.shape[1:])
            grown_v = torch.empty_like(grown_k)
            grown_k[:self.length], grown_v[:self.length] = self.k[:self.length], self.v[:self.length]
            self.k, self.v = grown_k, grown_v
        self.k[self.length:end], self.v[self.length:end] = k, v
        self.length = end
        return self.k[:end], self.v[:end]

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class EagleHead(nn.Module):
    draft_ids: torch.Tensor  # [Vd] long buffer: target ids of the draft vocabulary (empty: the whole vocabulary)

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        hidden, self.heads, self.kv_heads = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim, inter, eps = cfg["head_dim"], cfg["intermediate_size"], cfg["rms_norm_eps"]
        self.fc = nn.Linear(2 * hidden, hidden)
        self.input_norm = RMSNorm(hidden, eps)
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)
        self.post_norm = RMSNorm(hidden, eps)
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.norm = RMSNorm(hidden, eps)
        draft = cfg.get("draft_vocab_size")
        self.register_buffer("draft_ids", torch.arange(draft or 0, dtype=torch.long))  # [Vd] target ids
        self.rope_theta = float(cfg["rope_theta"])

    # --- pieces shared by training and drafting --------------------------------
    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # frequencies in float32 whatever the head's dtype (a bfloat16 angle drifts by radians at long positions)
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=positions.device) / self.head_dim
        angles = positions.float().unsqueeze(-1) / self.rope_theta ** exponents  # [..., D/2]
        angles = torch.cat([angles, angles], dim=-1).unsqueeze(-2)  # [..., 1, D]
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def _qkv(self, x: torch.Tensor, positions: torch.Tensor  # [..., T, H], [..., T]
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # [..., T, heads, D] each
        cos, sin = self._rope(positions, x.dtype)
        q = self.q_proj(x).unflatten(-1, (self.heads, self.head_dim))
        k = self.k_proj(x).unflatten(-1, (self.kv_heads, self.head_dim))
        v = self.v_proj(x).unflatten(-1, (self.kv_heads, self.head_dim))
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def _finish(self, residual: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:  # [..., T, H] -> features
        x = residual + self.o_proj(attn)
        h = self.post_norm(x)
        x = x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return self.norm(x)

    def fuse(self, token_emb: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:  # [..., H] x2 -> [..., H]
        return self.fc(torch.cat([token_emb, hidden.to(token_emb.dtype)], dim=-1))

    def draft_logits(self, features: torch.Tensor,  # [..., H]
                     lm_head: nn.Module) -> torch.Tensor:  # [..., Vd] (or [..., V] without a draft vocabulary)
        if self.draft_ids.numel() == 0:
            return lm_head(features)
        weight = lm_head.weight  # [V, H]
        assert isinstance(weight, torch.Tensor)
        return F.linear(features, weight[self.draft_ids])

    # --- training: whole sequences, causal ---------------------------------------
    def forward(self, token_emb: torch.Tensor, hidden: torch.Tensor  # [B, T, H] each
                ) -> torch.Tensor:  # predicted features [B, T, H]
        x = self.fuse(token_emb, hidden)
        positions = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        q, k, v = self._qkv(self.input_norm(x), positions)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=True, enable_gqa=True)
        return self._finish(x, attn.transpose(1, 2).flatten(-2))

    # --- drafting: new entries appended to per-sequence caches ------------------
    def _attend(self, q: torch.Tensor,  # [m, heads, D], the last m of the sequence's entries
                keys: torch.Tensor, values: torch.Tensor,  # [L, kv_heads, D]
                visible: torch.Tensor | None = None,  # [m, L] bool: which keys each query sees; None: causal
                ) -> torch.Tensor:  # [m, heads, D]
        """Attention of the newest m entries over the cache (causal, or the
        ``visible`` mask of a token tree), the query heads of each K/V head as
        one batched matmul (small, so no SDPA dispatch)."""
        m, total, rep = q.shape[0], keys.shape[0], self.heads // self.kv_heads
        grouped = q.permute(1, 0, 2).reshape(self.kv_heads, rep * m, self.head_dim)  # head h -> kv head h // rep
        scores = grouped @ keys.permute(1, 2, 0) * self.head_dim ** -0.5  # [kv_heads, rep * m, L]
        if visible is None and m > 1:  # query i (entry total - m + i) sees keys up to its own entry
            visible = torch.ones(m, total, dtype=torch.bool, device=q.device).tril(total - m)
        if visible is not None:
            scores = scores.masked_fill(~visible.repeat(rep, 1), float("-inf"))
        out = scores.softmax(-1) @ values.transpose(0, 1)  # [kv_heads, rep * m, D]
        return out.reshape(self.heads, m, self.head_dim).transpose(0, 1)

    def extend(self, token_emb: torch.Tensor, hidden: torch.Tensor,  # [T, H] each, sequences back to back
               positions: torch.Tensor,  # [T] long
               segments: list[tuple[SeqKV, int]],  # (cache, rows) per sequence, in row order
               visible: list[torch.Tensor | None] | None = None,  # per segment [m, L after the append] bool
               ) -> torch.Tensor:  # predicted features [T, H]
        """Append each segment's m new entries to its cache and run them; entry
        i of a segment sees the cache up to itself (causal) unless ``visible``
        gives the segment a mask (token trees: the request's entries and the
        node's ancestors, ``proposers.eagle.tree_draft``)."""
        x = self.fuse(token_emb, hidden)
        q, k, v = self._qkv(self.input_norm(x), positions)
        outs, row = [], 0
        for s, (cache, m) in enumerate(segments):
            keys, values = cache.append(k[row: row + m], v[row: row + m])
            outs.append(self._attend(q[row: row + m], keys, values, visible[s] if visible is not None else None))
            row += m
        return self._finish(x, torch.cat(outs).flatten(-2))
