"""Row buckets for packed oneDNN GEMMs: a bounded set of shapes, so memory stays flat.

oneDNN builds (JIT-compiles) a primitive for every input shape it sees. An
engine step feeds ``T`` rows, and ``T`` takes almost every value from 1 to
``max_num_batched_tokens`` over a long run (decodes times ``1 + k``, plus
prefill chunks). Each new row count allocated and freed primitive memory, and
the process RSS grew round after round: 200-request rounds of the demo pair with
a draft model went from 811 to 1114 MB over 12 rounds, and a micro benchmark of
12 packed layers fed random row counts in 1..2000 grew by 1 GB (the default
``F.linear`` path stayed flat; ``ONEDNN_PRIMITIVE_CACHE_CAPACITY=0`` did not
help, ``malloc_trim`` only partly).

So a packed GEMM runs on a bucketed row count: exact up to ``EXACT_ROWS`` (decode
and verify sizes, where padding would cost most), then 8 buckets per octave,
i.e. at most 1/8 extra rows (zeros, sliced off). Up to 512 rows that is 56
shapes per weight shape, well inside oneDNN's primitive cache (1024 entries),
and memory levels off once they have all been seen (``benchmarks/soak_memory.py``;
its figures, with CPU and date, are in ``benchmarks/README.md``).
"""

from __future__ import annotations

import torch

EXACT_ROWS = 16
BUCKETS_PER_OCTAVE = 8


def bucket_rows(rows: int) -> int:
    """The row count a GEMM over ``rows`` rows runs with (>= rows)."""
    if rows <= EXACT_ROWS:
        return rows
    octave = (rows - 1).bit_length()  # 2**(octave - 1) < rows <= 2**octave
    step = max(1, (1 << (octave - 1)) // BUCKETS_PER_OCTAVE)
    return -(-rows // step) * step


def pad_rows(x: torch.Tensor, in_features: int) -> tuple[torch.Tensor, int]:
    """``x`` ([..., in]) as ``[bucket_rows(rows), in]`` with zero rows appended,
    and the real row count; ``x`` itself when no padding is needed."""
    rows = x.numel() // in_features
    padded = bucket_rows(rows)
    if padded == rows:
        return x, rows
    buf = x.new_zeros(padded, in_features)
    buf[:rows] = x.reshape(rows, in_features)
    return buf, rows
