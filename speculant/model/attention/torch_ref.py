"""Pure-torch reference backend for paged, mixed prefill/decode batches.

One call per layer covers the whole batch: every token's K/V is written into
the paged cache first (so batch-expansion siblings see each other), then each
span attends over exactly its own visible blocks. Decodes (one query token)
need no mask; a multi-token span over a cached prefix gets a bottom-right
aligned causal mask. A tree span (``SpanTensors.tree_masks``: the prefix plus
its ancestor mask) attends row by row, each node over its visible keys
gathered in order, so every node gets the bits of the plain decode of its
path (as the C kernel does); a masked row over the whole span sums its
softmax and products over a different length, which changes the float bits.
Attending span by span avoids padding every sequence to the longest one,
which dominated batched decode time; grouped-query heads are handled by
folding the group into the query rows of a batched matmul over H_kv, without
repeating K/V (faster on CPU than SDPA's GQA path for short query runs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speculant.interfaces import AttentionBackend, AttentionBackendCapabilities
from speculant.interfaces.span_tensors import SpanTensors


@dataclass(slots=True)
class SpanView:
    rows: slice  # this span's query rows in the flattened batch
    blocks: torch.Tensor  # [num_blocks] long: the blocks holding positions < seq_len
    first_block: int | None  # set when those blocks are consecutive: read them as a view, no copy
    seq_len: int  # visible keys: positions 0 .. seq_len - 1
    mask: torch.Tensor | None  # [q, seq_len] bool, None for a single query token
    tree: bool = False  # ``mask`` is a token tree's: each row attends alone over its visible keys


@dataclass(slots=True)
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor  # [T] long
    spans: list[SpanView]


class TorchAttentionBackend(AttentionBackend):
    name = "torch"
    api_version = "3.0"
    capabilities = AttentionBackendCapabilities(multi_token_queries=True, devices=("cpu", "cuda"),
                                                tree_attention=True)

    def build_metadata(self, spans: SpanTensors) -> TorchAttentionMetadata:
        return TorchAttentionMetadata(slot_mapping=spans.slot_mapping,
                                      spans=self.span_views(spans, range(spans.num_seqs)))

    @staticmethod
    def span_views(spans: SpanTensors, which) -> list[SpanView]:
        """Views of the spans with the given indices (in that order)."""
        bs = spans.block_size
        cu = spans.cu_query_lens.tolist()
        starts, seq_lens = spans.starts.tolist(), spans.seq_lens.tolist()
        mask_offsets = spans.mask_offsets.tolist() if spans.mask_offsets is not None else None
        views = []
        for b in which:
            start, seq_len = starts[b], seq_lens[b]
            q = cu[b + 1] - cu[b]
            if q == 0:  # an empty span (graph padding): no rows
                continue
            if seq_len == 0:  # graph padding tokens: they see no key, their rows are zeros
                views.append(SpanView(slice(cu[b], cu[b + 1]), spans.block_tables[b, :0], None, 0, None))
                continue
            mask, tree = None, False
            if q > 1 and mask_offsets is not None and mask_offsets[b] >= 0:
                assert spans.tree_masks is not None
                ancestors = spans.tree_masks[mask_offsets[b]: mask_offsets[b] + q * q].view(q, q).bool()  # [q, q]
                prefix = torch.ones(q, start, dtype=torch.bool, device=ancestors.device)
                mask, tree = torch.cat([prefix, ancestors], dim=1), True  # [q, seq_len]
            elif q > 1:
                key_pos = torch.arange(seq_len, device=spans.positions.device)
                q_pos = torch.arange(start, seq_len, device=spans.positions.device)
                mask = key_pos.unsqueeze(0) <= q_pos.unsqueeze(1)  # [q, seq_len]
            blocks = spans.block_tables[b, : -(-seq_len // bs)]
            ids = blocks.tolist()
            consecutive = ids == list(range(ids[0], ids[0] + len(ids)))
            views.append(SpanView(slice(cu[b], cu[b + 1]), blocks, ids[0] if consecutive else None, seq_len, mask,
                                  tree))
        return views

    def forward(self, query, key, value, key_cache, value_cache, metadata: TorchAttentionMetadata,
                scaling: float) -> torch.Tensor:
        self.write_kv(key, value, key_cache, value_cache, metadata.slot_mapping)
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)  # [T, H, D] row-major
        self.attend_spans(query, key_cache, value_cache, metadata.spans, scaling, out)
        return out

    def write_kv(self, key: torch.Tensor,  # [T, H_kv, D]
                 value: torch.Tensor,  # [T, H_kv, D]
                 key_cache: torch.Tensor,  # [num_blocks, block_size, H_kv, D]
                 value_cache: torch.Tensor,  # [num_blocks, block_size, H_kv, D]
                 slot_mapping: torch.Tensor) -> None:  # [T] long
        num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
        # index_copy_: the same copy as an indexed assignment, at about half its fixed cost
        key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(key_cache.dtype))
        value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value.to(value_cache.dtype))

    def attend_spans(self, query: torch.Tensor,  # [T, H, D]
                     key_cache: torch.Tensor, value_cache: torch.Tensor,  # [num_blocks, block_size, H_kv, D]
                     views: list[SpanView], scaling: float,
                     out: torch.Tensor) -> None:  # [T, H, D], the rows of `views` are written
        for span in views:
            if span.seq_len == 0:
                out[span.rows] = 0
                continue
            k, v = (self._span_keys(cache, span).to(query.dtype) for cache in (key_cache, value_cache))
            if span.tree:  # each node as the decode of its path: its visible keys, contiguous, in order
                assert span.mask is not None
                for i, row in enumerate(range(span.rows.start, span.rows.stop)):
                    seen = span.mask[i].nonzero().squeeze(1)  # [L_i]
                    out[row: row + 1] = self._attend(query[row: row + 1], k[seen], v[seen], None, scaling)
            else:
                out[span.rows] = self._attend(query[span.rows], k, v, span.mask, scaling)

    @staticmethod
    def _attend(query: torch.Tensor,  # [q, H, D]
                k: torch.Tensor, v: torch.Tensor,  # [L, H_kv, D]
                mask: torch.Tensor | None,  # [q, L] bool
                scaling: float) -> torch.Tensor:  # [q, H, D]
        n, num_heads, head_dim = query.shape
        num_kv_heads = k.shape[1]
        group = num_heads // num_kv_heads
        q = query.view(n, num_kv_heads, group, head_dim)
        q = q.permute(1, 2, 0, 3).reshape(num_kv_heads, group * n, head_dim)  # [H_kv, G*q, D]
        scores = torch.matmul(q, k.permute(1, 2, 0)) * scaling  # [H_kv, G*q, L]
        if mask is not None:
            scores = scores.view(num_kv_heads, group, n, -1).masked_fill(~mask, float("-inf"))
            scores = scores.view(num_kv_heads, group * n, -1)
        wide = scores.dtype in (torch.float32, torch.float64)
        probs = scores.softmax(dim=-1) if wide else scores.float().softmax(dim=-1).to(v.dtype)
        o = torch.matmul(probs, v.transpose(0, 1))  # [H_kv, G*q, D]
        return o.view(num_kv_heads, group, n, head_dim).permute(2, 0, 1, 3).reshape(n, num_heads, head_dim)

    @staticmethod
    def _span_keys(cache: torch.Tensor,  # [num_blocks, block_size, H_kv, D]
                   span: SpanView) -> torch.Tensor:  # [seq_len, H_kv, D]
        if span.first_block is not None:
            blocks = cache.narrow(0, span.first_block, span.blocks.shape[0])
        else:
            blocks = cache.index_select(0, span.blocks)
        return blocks.flatten(0, 1)[: span.seq_len]
