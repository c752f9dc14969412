"""What a forward's spans may read and write: the one statement of the bounds,
checked in Python before any forward (``check_spans``, whatever the backend)
and again by the C kernels before they touch memory (``speculant_check_spans``,
whose refusals ``span_fault_message`` words the same way).

A span reads and writes the cache through its block table: position p lives in
block ``block_table[p // block_size]``. So every entry up to the span's end
must exist and be a block of the pool; a plugin calling ``RunnerView.forward``
with a made-up table gets an ``IndexError`` naming the block and the pool's
size, and nothing is read or written.
"""

from __future__ import annotations

from speculant.interfaces.span_tensors import PagedSpan

FAULTS = {
    0: "block-table entry {entry} is block {block}, outside the KV pool of {pool} blocks (ids 0..{last})",
    1: "its positions {start}..{end_1} need {need} block-table entries of {block_size} positions, "
       "but its table has {entry}",
    2: "its query rows or positions are invalid (first position {start}, end {end}, {tokens} query rows "
       "in the forward)",
    3: "it is not one of the batch's {seqs} spans",
}
BLOCK_ID, TABLE_SHORT, ROWS, SPAN_ID = range(4)


def span_fault_message(bad: list[int], pool: int, block_size: int, tokens: int = 0, seqs: int = 0) -> str:
    """What a refused span got wrong; ``bad`` = [kind, span, entry, block, start, end] (csrc/kernels.h)."""
    kind, span, entry, block, start, end = bad
    detail = FAULTS[kind].format(entry=entry, block=block, pool=pool, last=pool - 1, start=start, end=end,
                                 end_1=end - 1, need=-(-end // block_size), block_size=block_size,
                                 tokens=tokens, seqs=seqs)
    return (f"span {span} of the forward: {detail}. A span's block table must list blocks the runner's "
            f"block manager allocated for that sequence, one per {block_size} positions up to its end; "
            "nothing was read or written")


def check_spans(spans: list[PagedSpan], block_size: int, pool: int, max_model_len: int) -> None:
    """Raise ``ValueError`` (an empty forward, positions past ``max_model_len``, bad ``logits_at``)
    or ``IndexError`` (a block table that reaches outside the ``pool`` blocks) before a forward."""
    if not spans:
        raise ValueError("a forward needs at least one span: pass a non-empty list of PagedSpan")
    for i, s in enumerate(spans):
        n = len(s.token_ids)
        end = s.start + n
        if s.start < 0 or end > max_model_len:
            raise ValueError(f"span {i} of the forward covers positions {s.start}..{end - 1}, outside "
                             f"0..{max_model_len - 1} (model.max_model_len = {max_model_len}); a span must start "
                             "at a position >= 0 and end within max_model_len")
        if any(not 0 <= j < n for j in s.logits_at):
            raise ValueError(f"span {i} of the forward: logits_at {s.logits_at} must be offsets into its {n} "
                             "query tokens")
        need = -(-end // block_size)
        table = s.block_table
        if len(table) < need:
            raise IndexError(span_fault_message([TABLE_SHORT, i, len(table), -1, s.start, end], pool, block_size))
        used = table[:need]
        if used and (min(used) < 0 or max(used) >= pool):
            entry = next(j for j, b in enumerate(used) if not 0 <= b < pool)
            raise IndexError(span_fault_message([BLOCK_ID, i, entry, used[entry], s.start, end], pool, block_size))
