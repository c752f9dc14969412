"""Triton device code of the ``triton`` attention backend: the paged K/V write
and paged attention over a mixed batch, one launch each per layer.

Layouts (as every backend): queries ``[T, H, D]`` of all spans back to back,
``cu_query_lens`` ``[B + 1]`` their boundaries, caches ``[num_blocks,
block_size, H_kv, D]``, ``block_tables`` ``[B, max_blocks]``, ``seq_lens``
``[B]`` (cached prefix + the span's own tokens). Nothing here reads a device
value on the host: grid sizes come from tensor shapes and host integers, and
each attention program finds its span by a binary search over
``cu_query_lens`` on the device.

Attention program ``(pid, kv_head)`` takes ``BLOCK_Q`` consecutive query
tokens of one span and the ``GROUP`` query heads sharing ``kv_head``, packed
into the ``BLOCK_M = BLOCK_Q * GROUP`` (padded to a power of two) rows of one
tile, so a K/V tile is loaded once for the whole group (GQA/MQA). It walks
the span's keys in ``BLOCK_N`` tiles through the block table (any block size)
with an online softmax in float32; the causal mask is aligned bottom-right:
key ``j`` is visible to query ``i`` of a span iff ``j <= seq_len - q_len + i``.

Every load is widened to float32 before ``tl.dot``: under ``TRITON_INTERPRET=1``
a bfloat16 ``tl.dot`` multiplies raw bit patterns, and on the GPU float32
operands with ``DOT_PRECISION = "tf32"`` still multiply bfloat16/float16
inputs exactly (their mantissas fit in tf32's); only the probabilities lose
bits (to tf32's 10) in the product with V. A float32 query or cache uses "ieee".

Whether the kernels run compiled or on the interpreter is fixed when this
module is imported (``TRITON_INTERPRET=1`` then: ``INTERPRETED``). Tests load
an interpreted copy of it next to the compiled one, so the kernels call no
``@triton.jit`` function of Triton's own library (``tl.max``, ``tl.sum``,
``tl.zeros``: compiled or interpreted as Triton itself was imported): reductions
go through ``tl.reduce`` with Triton's max/sum combiners, which the
interpreter recognises and runs in numpy without calling them.
"""

from __future__ import annotations

import triton
import triton.language as tl

INTERPRETED: bool = bool(triton.knobs.runtime.interpret)
"""The kernels were decorated under ``TRITON_INTERPRET=1``: they run on numpy,
taking CPU tensors (tests only; tens of milliseconds per program)."""


@triton.jit
def write_kv_kernel(
    key_ptr, value_ptr,  # [T, H_kv, D], any strides
    key_cache_ptr, value_cache_ptr,  # [num_blocks, block_size, H_kv, D], the same strides
    slot_ptr,  # [T] int64: cache slot (block * block_size + offset) of each token, < 0: skip
    num_tokens, num_kv_heads, head_dim,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_cb, stride_cs, stride_ch, stride_cd,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,  # tile: tokens x K/V heads x dims
):
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    t_ok = offs_t < num_tokens
    slot = tl.load(slot_ptr + offs_t, mask=t_ok, other=-1).to(tl.int64)
    t_ok = t_ok & (slot >= 0)
    dst_t = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs  # [BLOCK_T]
    hd_ok = (offs_h[:, None] < num_kv_heads) & (offs_d[None, :] < head_dim)  # [BLOCK_H, BLOCK_D]
    ok = t_ok[:, None, None] & hd_ok[None, :, :]  # [BLOCK_T, BLOCK_H, BLOCK_D]
    dst = dst_t[:, None, None] + offs_h[None, :, None] * stride_ch + offs_d[None, None, :] * stride_cd
    row = offs_t.to(tl.int64)[:, None, None]
    k = tl.load(key_ptr + row * stride_kt + offs_h[None, :, None] * stride_kh + offs_d[None, None, :] * stride_kd,
                mask=ok, other=0.0)
    tl.store(key_cache_ptr + dst, k.to(key_cache_ptr.dtype.element_ty), mask=ok)
    v = tl.load(value_ptr + row * stride_vt + offs_h[None, :, None] * stride_vh + offs_d[None, None, :] * stride_vd,
                mask=ok, other=0.0)
    tl.store(value_cache_ptr + dst, v.to(value_cache_ptr.dtype.element_ty), mask=ok)


@triton.jit
def paged_attention_kernel(
    out_ptr,  # [T, H, D]: stride 1 along D
    query_ptr,  # [T, H, D], any strides
    key_cache_ptr, value_cache_ptr,  # [num_blocks, block_size, H_kv, D], the same strides
    cu_query_lens_ptr,  # [B + 1] int64
    seq_lens_ptr,  # [B] int64: visible keys of each span (cached prefix + its query tokens)
    block_tables_ptr,  # [B, max_blocks] int64
    mask_offsets_ptr,  # [B] int64: span b's tree mask at masks_ptr + offset, -1 causal (read when HAS_TREE)
    masks_ptr,  # uint8: every tree span's [q_len, q_len] mask back to back, 1 = the row sees that token
    num_seqs, head_dim,
    scale_log2e,  # softmax scale * log2(e): the kernel exponentiates with exp2
    stride_qt, stride_qh, stride_qd,
    stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_cd,
    stride_bt,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    GROUP: tl.constexpr,  # query heads per K/V head
    BLOCK_Q: tl.constexpr,  # query tokens per program (BLOCK_Q * GROUP <= BLOCK_M)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,  # rows, keys, dims per tile
    DOT_PRECISION: tl.constexpr,  # "ieee" with a float32 query or cache, else "tf32"
    INTERPRETER_LOOP: tl.constexpr,  # walk the keys with a while loop (INTERPRETED)
    HAS_TREE: tl.constexpr,  # some span is a token tree: read the masks
):
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    # span s owns programs cu[s] // BLOCK_Q + s ... cu[s + 1] // BLOCK_Q + s (enough for
    # ceil(q_len / BLOCK_Q) blocks); find the last s whose first program is <= pid
    lo = 0
    hi = num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first = tl.load(cu_query_lens_ptr + mid).to(tl.int32) // BLOCK_Q + mid
        up = first <= pid
        lo = tl.where(up, mid, lo)
        hi = tl.where(up, hi, mid - 1)
    q_begin = tl.load(cu_query_lens_ptr + lo).to(tl.int32)
    q_len = tl.load(cu_query_lens_ptr + lo + 1).to(tl.int32) - q_begin
    context = tl.load(seq_lens_ptr + lo).to(tl.int32) - q_len  # keys cached before the span
    first_tok = (pid - (q_begin // BLOCK_Q + lo)) * BLOCK_Q  # this program's first token, within the span

    offs_m = tl.arange(0, BLOCK_M)
    tok = first_tok + offs_m // GROUP  # [BLOCK_M] token of each row, within the span
    head = kv_head * GROUP + offs_m % GROUP  # [BLOCK_M] query head of each row
    row_ok = (offs_m < BLOCK_Q * GROUP) & (tok < q_len)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    q_row = (q_begin + tok).to(tl.int64)
    q = tl.load(query_ptr + q_row[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_D]
    limit = context + tok  # [BLOCK_M]: row sees keys 0 .. limit
    # keys the block's last token sees; 0 for a program past its span's end (it stores nothing)
    kv_end = tl.where(first_tok < q_len, context + tl.minimum(first_tok + BLOCK_Q, q_len), 0)
    if HAS_TREE:  # each row's mask row, indexed by key position (keys from `context` on are the span's tokens)
        mask_off = tl.load(mask_offsets_ptr + lo)
        tree_rows = row_ok & ((mask_off + tok * 0) >= 0)  # [BLOCK_M] (compared as a row: the interpreter
        # widens a scalar comparison combined with a vector to int32, which a load mask cannot be)
        mask_rows = mask_off + tok.to(tl.int64) * q_len - context  # [BLOCK_M]
    else:
        tree_rows = row_ok & False
        mask_rows = tok.to(tl.int64)

    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)  # running max (finite: a fully masked tile adds 0)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)  # running sum of exp2
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    table = block_tables_ptr + lo * stride_bt  # lo is still a Python int when B = 1 (interpreter)
    cache_head = kv_head.to(tl.int64) * stride_ch
    if INTERPRETER_LOOP:  # the interpreter cannot take a tensor as a range() bound (numpy >= 2.4)
        start = 0
        while start < kv_end:
            m_i, l_i, acc = _attend_tile(start, q, m_i, l_i, acc, limit, kv_end, table, key_cache_ptr,
                                         value_cache_ptr, cache_head, stride_cb, stride_cs, stride_cd, offs_d,
                                         d_ok, scale_log2e, masks_ptr, mask_rows, tree_rows, context, BLOCK_SIZE,
                                         BLOCK_N, DOT_PRECISION, HAS_TREE)
            start += BLOCK_N
    else:  # a for loop, which the compiler software-pipelines
        for start in range(0, kv_end, BLOCK_N):
            m_i, l_i, acc = _attend_tile(start, q, m_i, l_i, acc, limit, kv_end, table, key_cache_ptr,
                                         value_cache_ptr, cache_head, stride_cb, stride_cs, stride_cd, offs_d,
                                         d_ok, scale_log2e, masks_ptr, mask_rows, tree_rows, context, BLOCK_SIZE,
                                         BLOCK_N, DOT_PRECISION, HAS_TREE)
    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + q_row[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _attend_tile(start, q, m_i, l_i, acc, limit, kv_end, table, key_cache_ptr, value_cache_ptr, cache_head,
                 stride_cb, stride_cs, stride_cd, offs_d, d_ok, scale_log2e, masks_ptr, mask_rows, tree_rows,
                 context, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 HAS_TREE: tl.constexpr):
    """One online-softmax step over keys ``start .. start + BLOCK_N`` of a span.
    ``q`` [BLOCK_M, BLOCK_D] float32, ``m_i``/``l_i`` [BLOCK_M], ``acc`` [BLOCK_M, BLOCK_D],
    ``limit`` [BLOCK_M] (last key each row sees), ``table``: the span's block-table row;
    with ``HAS_TREE``, rows in ``tree_rows`` [BLOCK_M] also need their mask byte at
    ``masks_ptr + mask_rows + key`` for the span's own keys (``key >= context``)."""
    offs_n = start + tl.arange(0, BLOCK_N)  # key positions
    n_ok = offs_n < kv_end
    block = tl.load(table + offs_n // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
    key_at = block * stride_cb + (offs_n % BLOCK_SIZE) * stride_cs + cache_head  # [BLOCK_N]
    k = tl.load(key_cache_ptr + key_at[None, :] + offs_d[:, None] * stride_cd,
                mask=n_ok[None, :] & d_ok[:, None], other=0.0).to(tl.float32)  # [BLOCK_D, BLOCK_N]
    scores = tl.dot(q, k, input_precision=DOT_PRECISION) * scale_log2e  # [BLOCK_M, BLOCK_N]
    visible = (offs_n[None, :] <= limit[:, None]) & n_ok[None, :]
    if HAS_TREE:
        in_tree = visible & tree_rows[:, None] & (offs_n[None, :] >= context)  # [BLOCK_M, BLOCK_N]
        bits = tl.load(masks_ptr + mask_rows[:, None] + offs_n[None, :], mask=in_tree, other=1)
        visible = visible & (bits != 0)
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.reduce(scores, 1, tl.standard._elementwise_max))
    p = tl.exp2(scores - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    v = tl.load(value_cache_ptr + key_at[:, None] + offs_d[None, :] * stride_cd,
                mask=n_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)  # [BLOCK_N, BLOCK_D]
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
    return m_new, l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine), acc
