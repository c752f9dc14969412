"""Tensor form of a forward's query spans, computed once per forward and
shared by the model runner (positions, slot mapping) and attention backends
(per-sequence lengths, block tables)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speculant.core.attention.base import QuerySpan


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

    @property
    def num_seqs(self) -> int:
        return self.query_lens.shape[0]

    @classmethod
    def build(cls, spans: list[QuerySpan], block_size: int, device: torch.device) -> "SpanTensors":
        qlens = [s.num_tokens for s in spans]
        max_blocks = max(len(s.block_table) for s in spans)
        ids: list[int] = []
        tables: list[list[int]] = []
        for s in spans:
            ids.extend(s.token_ids)
            tables.append(s.block_table + [0] * (max_blocks - len(s.block_table)))
        query_lens = torch.tensor(qlens, dtype=torch.long)
        starts = torch.tensor([s.start for s in spans], dtype=torch.long)
        cu = torch.zeros(len(spans) + 1, dtype=torch.long)
        torch.cumsum(query_lens, 0, out=cu[1:])
        seq_index = torch.repeat_interleave(torch.arange(len(spans)), query_lens)
        offsets = torch.arange(int(cu[-1])) - cu[:-1][seq_index]
        positions = starts[seq_index] + offsets
        block_tables = torch.tensor(tables, dtype=torch.long)
        slots = block_tables[seq_index, positions // block_size] * block_size + positions % block_size
        seq_lens = starts + query_lens
        return cls(
            token_ids=torch.tensor(ids, dtype=torch.long, device=device),
            positions=positions.to(device), seq_index=seq_index.to(device), slot_mapping=slots.to(device),
            query_lens=query_lens.to(device), cu_query_lens=cu.to(device), starts=starts.to(device),
            seq_lens=seq_lens.to(device), block_tables=block_tables.to(device), block_size=block_size,
            max_query_len=max(qlens), max_seq_len=int(seq_lens.max()),
        )
