"""Pure-torch reference backend: one SDPA call per layer for a mixed batch.

Each span's query run is scattered into a padded [B, Q_max] grid and its
visible K/V are gathered from the paged cache into [B, L_max]; a boolean mask
encodes "cached prefix + causal inside the span" and hides padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from speculant.core.attention.base import AttentionBackend
from speculant.core.attention.span_tensors import SpanTensors
from speculant.core.capabilities import AttentionBackendCapabilities


@dataclass(slots=True)
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor  # [T] long
    q_index: torch.Tensor  # [T] long: flat index of each query token in the [B * Q_max] grid
    kv_slots: torch.Tensor  # [B, L_max] long: cache slot of each visible key (0 for padding)
    mask: torch.Tensor  # [B, 1, Q_max, L_max] bool: True where a query may attend
    num_seqs: int
    max_query_len: int
    dense: bool  # one span covering all tokens: no scatter/gather of queries needed


class TorchAttentionBackend(AttentionBackend):
    name = "torch"
    capabilities = AttentionBackendCapabilities(multi_token_queries=True, devices=("cpu", "cuda"))

    def build_metadata(self, spans: SpanTensors) -> TorchAttentionMetadata:
        b, q_max, l_max = spans.num_seqs, spans.max_query_len, spans.max_seq_len
        bs = spans.block_size
        dev = spans.positions.device
        offsets = torch.arange(spans.positions.shape[0], device=dev) - spans.cu_query_lens[:-1][spans.seq_index]
        q_index = spans.seq_index * q_max + offsets
        key_pos = torch.arange(l_max, device=dev)  # [L]
        kv_slots = spans.block_tables[:, key_pos // bs] * bs + key_pos % bs  # [B, L]
        kv_slots = kv_slots.masked_fill(key_pos.unsqueeze(0) >= spans.seq_lens.unsqueeze(1), 0)
        q_row = torch.arange(q_max, device=dev)  # [Q]
        q_pos = spans.starts.unsqueeze(1) + q_row.unsqueeze(0)  # [B, Q]
        mask = key_pos.view(1, 1, -1) <= q_pos.unsqueeze(2)  # [B, Q, L]
        padded = q_row.unsqueeze(0) >= spans.query_lens.unsqueeze(1)  # [B, Q]
        # padded query rows see key 0 only, so no row is fully masked (no NaN)
        mask = torch.where(padded.unsqueeze(2), key_pos.view(1, 1, -1) == 0, mask)
        return TorchAttentionMetadata(
            slot_mapping=spans.slot_mapping, q_index=q_index, kv_slots=kv_slots, mask=mask.unsqueeze(1),
            num_seqs=b, max_query_len=q_max, dense=b == 1,
        )

    def forward(self, query, key, value, key_cache, value_cache, metadata: TorchAttentionMetadata,
                scaling: float) -> torch.Tensor:
        num_tokens, num_heads, head_dim = query.shape
        flat_k = key_cache.view(-1, *key_cache.shape[2:])  # [num_slots, H_kv, D]
        flat_v = value_cache.view(-1, *value_cache.shape[2:])
        flat_k[metadata.slot_mapping] = key.to(flat_k.dtype)
        flat_v[metadata.slot_mapping] = value.to(flat_v.dtype)
        b, q_max = metadata.num_seqs, metadata.max_query_len
        if metadata.dense:
            q = query.unsqueeze(0)
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
        return out if metadata.dense else out[metadata.q_index]
