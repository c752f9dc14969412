"""Pure-torch reference backend: one SDPA call per layer for a mixed batch.

Each span's query run is scattered into a padded [B, Q_max] grid and its
visible K/V are gathered from the paged cache into [B, L_max]; a boolean mask
encodes "cached prefix + causal inside the span" and hides padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from speculant.core.attention.base import AttentionBackend, QuerySpan
from speculant.core.capabilities import AttentionBackendCapabilities


@dataclass(slots=True)
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor  # [T] long
    q_index: torch.Tensor  # [T] long: flat index of each query token in the [B * Q_max] grid
    kv_slots: torch.Tensor  # [B, L_max] long: cache slot of each visible key (0 for padding)
    mask: torch.Tensor  # [B, 1, Q_max, L_max] bool: True where a query may attend
    num_seqs: int
    max_query_len: int


class TorchAttentionBackend(AttentionBackend):
    name = "torch"
    capabilities = AttentionBackendCapabilities(multi_token_queries=True, devices=("cpu", "cuda"))

    def build_metadata(self, spans: list[QuerySpan], slot_mapping: torch.Tensor, block_size: int,
                       device: torch.device) -> TorchAttentionMetadata:
        num_seqs = len(spans)
        max_q = max(s.num_tokens for s in spans)
        max_l = max(s.end for s in spans)
        q_index, kv_rows = [], []
        mask = torch.zeros(num_seqs, 1, max_q, max_l, dtype=torch.bool)
        for b, span in enumerate(spans):
            q_index.extend(range(b * max_q, b * max_q + span.num_tokens))
            table = torch.tensor(span.block_table, dtype=torch.long)
            pos = torch.arange(span.end, dtype=torch.long)
            slots = table[pos // block_size] * block_size + pos % block_size
            kv_rows.append(F.pad(slots, (0, max_l - span.end)))
            q_pos = torch.arange(span.start, span.end).unsqueeze(1)  # [q, 1]
            mask[b, 0, : span.num_tokens, :] = torch.arange(max_l).unsqueeze(0) <= q_pos
            mask[b, 0, span.num_tokens:, 0] = True  # padded queries see one key: no NaN rows
        return TorchAttentionMetadata(
            slot_mapping=slot_mapping,
            q_index=torch.tensor(q_index, dtype=torch.long, device=device),
            kv_slots=torch.stack(kv_rows).to(device),
            mask=mask.to(device),
            num_seqs=num_seqs,
            max_query_len=max_q,
        )

    def forward(self, query, key, value, key_cache, value_cache, metadata: TorchAttentionMetadata,
                scaling: float) -> torch.Tensor:
        num_tokens, num_heads, head_dim = query.shape
        flat_k = key_cache.view(-1, *key_cache.shape[2:])  # [num_slots, H_kv, D]
        flat_v = value_cache.view(-1, *value_cache.shape[2:])
        flat_k[metadata.slot_mapping] = key.to(flat_k.dtype)
        flat_v[metadata.slot_mapping] = value.to(flat_v.dtype)
        b, q_max = metadata.num_seqs, metadata.max_query_len
        if b == 1 and num_tokens == q_max:
            q = query.unsqueeze(0)  # single span: no scatter needed
        else:
            q = query.new_zeros(b * q_max, num_heads, head_dim)
            q[metadata.q_index] = query
            q = q.view(b, q_max, num_heads, head_dim)
        k = flat_k[metadata.kv_slots].to(query.dtype)  # [B, L_max, H_kv, D]
        v = flat_v[metadata.kv_slots].to(query.dtype)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            attn_mask=metadata.mask, scale=scaling, enable_gqa=k.shape[2] != num_heads,
        )  # [B, H, Q_max, D]
        out = out.transpose(1, 2).reshape(b * q_max, num_heads, head_dim)
        return out if b == 1 and num_tokens == q_max else out[metadata.q_index]
