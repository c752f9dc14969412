"""Static forward inputs for CUDA graph replay: one set of device buffers per
runner, sized for the largest token bucket and span count, refilled in place
before each replay (``cuda_graphs`` captures forwards that read them).

A forward of ``T`` real tokens in ``n`` spans replays the graph of bucket
``Tb >= T`` with ``S`` span slots (``S > n``, the same for every bucket):

* span ``n`` is the padding span: tokens ``T .. Tb - 1``, position 0, their
  K/V written to the runner's trash block (a KV block outside the
  ``BlockManager``, so no real span ever reads it), ``seq_len = 0`` so they
  attend to no key (the triton kernel gives them zeros, ``torch_ref`` too);
* spans ``n + 1 .. S - 1`` are empty (query length 0, ``seq_len`` 0);
* block-table rows past ``n`` and columns past a span's blocks are left as
  they are: no backend reads past ``ceil(seq_len / block_size)`` columns.

Three host-to-device copies per refill: the token fields ``[4, Tb]``, the
span fields ``[5, S + 1]`` and the used corner of the block tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speculant.interfaces.span_tensors import PagedSpan, SpanTensors

TOKEN_ROWS = ("token_ids", "positions", "slot_mapping", "seq_index")
SPAN_ROWS = ("query_lens", "cu_query_lens", "starts", "seq_lens")


@dataclass(frozen=True)
class Refill:
    """The host side of one forward's static inputs (what ``StaticSpans.fill`` copies)."""

    tokens: torch.Tensor  # [4, Tb] long (CPU): TOKEN_ROWS, padding included
    spans: torch.Tensor  # [4, S + 1] long (CPU): SPAN_ROWS (cu_query_lens uses all S + 1)
    tables: torch.Tensor  # [n, w] long (CPU): the real spans' block tables
    num_tokens: int  # T: real tokens
    bucket: int  # Tb


def host_refill(spans: list[PagedSpan], block_size: int, bucket: int, num_span_slots: int,
                trash_slot: int) -> Refill:
    """The padded static layout of ``spans`` (module docstring) as CPU tensors."""
    n = len(spans)
    if n >= num_span_slots:  # a real check: these buffers are written in place
        raise ValueError(f"{n} spans do not fit the graph's {num_span_slots} span slots (one is kept for padding)")
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    seq_index: list[int] = []
    qlens, cu, starts, seq_lens = [], [0], [], []
    width = max(len(s.block_table) for s in spans)
    tables: list[list[int]] = []
    for b, s in enumerate(spans):
        table = s.block_table
        q = len(s.token_ids)
        ids.extend(s.token_ids)
        span_positions = range(s.start, s.start + q)
        positions.extend(span_positions)
        slots.extend(table[p // block_size] * block_size + p % block_size for p in span_positions)
        seq_index.extend([b] * q)
        qlens.append(q)
        cu.append(cu[-1] + q)
        starts.append(s.start)
        seq_lens.append(s.start + q)
        tables.append(table + [0] * (width - len(table)))
    total = cu[-1]
    if total > bucket:
        raise ValueError(f"{total} tokens do not fit the graph bucket of {bucket}")
    pad = bucket - total
    ids.extend([0] * pad)
    positions.extend([0] * pad)
    slots.extend([trash_slot] * pad)
    seq_index.extend([n] * pad)
    empty = num_span_slots - n - 1
    qlens += [pad] + [0] * empty + [0]  # the last entry pads the row to S + 1
    cu += [bucket] * (empty + 1)
    starts += [0] * (empty + 2)
    seq_lens += [0] * (empty + 2)
    return Refill(tokens=torch.tensor([ids, positions, slots, seq_index], dtype=torch.long),
                  spans=torch.tensor([qlens, cu, starts, seq_lens], dtype=torch.long),
                  tables=torch.tensor(tables, dtype=torch.long), num_tokens=total, bucket=bucket)


class StaticSpans:
    """The device buffers every captured forward reads (module docstring)."""

    def __init__(self, max_tokens: int, num_span_slots: int, max_blocks: int, block_size: int,
                 device: torch.device) -> None:
        self.max_tokens = max_tokens
        self.num_span_slots = num_span_slots
        self.block_size = block_size
        self.tokens = torch.zeros(len(TOKEN_ROWS), max_tokens, dtype=torch.long, device=device)
        self.spans = torch.zeros(len(SPAN_ROWS), num_span_slots + 1, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(num_span_slots, max_blocks, dtype=torch.long, device=device)

    def fill(self, refill: Refill) -> None:
        """Copy one forward's inputs in place (the captured graphs keep these addresses)."""
        self.tokens[:, : refill.bucket].copy_(refill.tokens, non_blocking=True)
        self.spans.copy_(refill.spans, non_blocking=True)
        n, w = refill.tables.shape
        self.block_tables[:n, :w].copy_(refill.tables, non_blocking=True)

    def span_tensors(self, bucket: int, max_query_len: int) -> SpanTensors:
        """Views of the buffers as a forward of ``bucket`` tokens; ``max_query_len``
        is the host int the backend picks its tiles by, fixed per captured graph."""
        tok = self.tokens[:, :bucket]
        s = self.num_span_slots
        return SpanTensors(
            token_ids=tok[0], positions=tok[1], slot_mapping=tok[2], seq_index=tok[3],
            query_lens=self.spans[0, :s], cu_query_lens=self.spans[1], starts=self.spans[2, :s],
            seq_lens=self.spans[3, :s], block_tables=self.block_tables, block_size=self.block_size,
            max_query_len=max_query_len, max_seq_len=self.block_tables.shape[1] * self.block_size)
