"""A forward's query spans as the model runner and attention backends see
them: ``PagedSpan`` (a span with its sequence's block table, which the
engine's ``RunnerView`` resolves from a plugin's ``QuerySpan`` handle after
checking it), and their tensor form, computed once per forward and shared by
the model runner (positions, slot mapping) and attention backends
(per-sequence lengths, block tables, tree masks).

A tree span (``PagedSpan.ancestor_mask``) writes node i's K/V to slot
``start + i`` like any span, at its own position (start + depth) for rotary;
its mask travels as ``tree_masks`` (every tree span's n x n mask, row-major,
back to back) with ``mask_offsets[b]`` the offset of span b's mask there, -1
for a causal span. Backends read a mask only for keys at or after the span's
start: the cached prefix is visible to every node.

Only attention backends and the engine see block tables; proposers and
scorers name sequences by handle (``views.SequenceHandle``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speculant.interfaces.data import SpanRun


@dataclass(slots=True)
class PagedSpan(SpanRun):
    """A run of query tokens of one sequence, with the sequence's KV block ids
    (position p lives in block ``block_table[p // block_size]``); otherwise as
    ``QuerySpan``."""

    block_table: list[int]
    start: int
    token_ids: list[int]
    logits_at: list[int]  # offsets inside the span whose logits are needed
    positions: list[int] | None = None  # [num_tokens]; None: start + offset
    ancestor_mask: list[list[bool]] | None = None  # [num_tokens][num_tokens]; None: causal


@dataclass(slots=True)
class SpanTensors:
    token_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    seq_index: torch.Tensor  # [T] long: which span each token belongs to
    slot_mapping: torch.Tensor  # [T] long: cache slot each token's K/V is written to
    query_lens: torch.Tensor  # [B] long
    cu_query_lens: torch.Tensor  # [B + 1] long, cumulative query lengths
    starts: torch.Tensor  # [B] long: position of each span's first query token
    seq_lens: torch.Tensor  # [B] long: visible context per span (start + query_len)
    block_tables: torch.Tensor  # [B, max_blocks] long, padded with 0
    block_size: int
    max_query_len: int
    max_seq_len: int
    mask_offsets: torch.Tensor | None = None  # [B] long: span b's mask in tree_masks, -1 causal; None: no tree
    tree_masks: torch.Tensor | None = None  # [sum of n_b * n_b over tree spans] uint8, 1 = visible

    @property
    def has_trees(self) -> bool:
        return self.mask_offsets is not None

    @property
    def num_seqs(self) -> int:
        return self.query_lens.shape[0]

    @classmethod
    def build(cls, spans: list[PagedSpan], block_size: int, device: torch.device) -> SpanTensors:
        # plain Python lists first, one tensor per field at the end: for the few
        # tokens of a decode step this is ~3x cheaper than a chain of small tensor ops
        qlens = [s.num_tokens for s in spans]
        max_blocks = max(len(s.block_table) for s in spans)
        ids: list[int] = []
        positions: list[int] = []
        seq_index: list[int] = []
        slots: list[int] = []
        tables: list[list[int]] = []
        mask_offsets: list[int] = []
        masks: list[bool] = []
        cu = [0]
        for b, s in enumerate(spans):
            if s.positions is not None or s.ancestor_mask is not None:
                problem = s.shape_problem()
                if problem is not None:
                    raise ValueError(f"query span {b} cannot run: {problem}")
            table = s.block_table
            ids.extend(s.token_ids)
            span_slots = range(s.start, s.start + len(s.token_ids))
            positions.extend(span_slots if s.positions is None else s.positions)
            seq_index.extend([b] * len(s.token_ids))
            slots.extend(table[p // block_size] * block_size + p % block_size for p in span_slots)
            mask_offsets.append(len(masks) if s.ancestor_mask is not None else -1)
            if s.ancestor_mask is not None:
                masks.extend(v for row in s.ancestor_mask for v in row)
            tables.append(table + [0] * (max_blocks - len(table)))
            cu.append(cu[-1] + len(s.token_ids))
        starts = [s.start for s in spans]
        seq_lens = [s.start + q for s, q in zip(spans, qlens)]

        def tensor(values) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        return cls(
            token_ids=tensor(ids), positions=tensor(positions), seq_index=tensor(seq_index),
            slot_mapping=tensor(slots), query_lens=tensor(qlens), cu_query_lens=tensor(cu),
            starts=tensor(starts), seq_lens=tensor(seq_lens), block_tables=tensor(tables),
            block_size=block_size, max_query_len=max(qlens), max_seq_len=max(seq_lens),
            mask_offsets=tensor(mask_offsets) if masks else None,
            tree_masks=torch.tensor(masks, dtype=torch.uint8, device=device) if masks else None,
        )
