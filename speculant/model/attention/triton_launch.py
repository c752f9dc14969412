"""Host side of the ``triton`` attention backend: argument checks, tile sizes
and grids for the kernels in ``triton_kernels`` (importing this module
imports triton).

Everything here reads tensor shapes, strides and dtypes and host integers
(``max_query_len``), never a device value, so a forward's launches queue
without a synchronisation. The kernels are looked up in ``kernels`` at each
call: tests point it at an interpreted copy of ``triton_kernels``.
"""

from __future__ import annotations

import math
from types import ModuleType

import torch
import triton

from speculant.model.attention import triton_kernels

kernels: ModuleType = triton_kernels
"""The module whose kernels are launched (``INTERPRETED`` says how they run)."""
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""Storage dtypes the kernels compute (float32 arithmetic for all three)."""
_WRITE_TILE = 1 << 12
"""Elements per K/V write program on the GPU (the interpreter: 16x, it pays per program)."""
_ROWS_PER_TILE = 64
"""Query rows (tokens x grouped heads) per attention program once a span has more than 16."""


def _check(tensors: dict[str, torch.Tensor]) -> None:
    """Refuse devices the kernels were not built for and dtypes they do not compute."""
    for name, t in tensors.items():
        if t.device.type != "cuda" and not kernels.INTERPRETED:
            raise ValueError(
                f"attention backend 'triton': `{name}` is on {t.device}, but the Triton kernels run on CUDA "
                "devices only: set model.device = 'cuda' or choose another model.attention_backend (on the CPU "
                "the kernels run only under TRITON_INTERPRET=1 set before they are imported, for tests)")
        if t.is_floating_point() and t.dtype not in KERNEL_DTYPES:
            raise ValueError(
                f"attention backend 'triton': `{name}` is {t.dtype}, which the kernels do not compute "
                f"(float32, bfloat16 and float16 only): set model.dtype to one of those or choose another "
                "model.attention_backend")


def _check_caches(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    if key_cache.shape != value_cache.shape or key_cache.stride() != value_cache.stride():
        raise ValueError(
            f"attention backend 'triton': the key cache {tuple(key_cache.shape)} / strides {key_cache.stride()} "
            f"and the value cache {tuple(value_cache.shape)} / strides {value_cache.stride()} differ, but the "
            "kernels index both with one set of strides: allocate them alike")
    if key_cache.stride(3) != 1:
        raise ValueError(f"attention backend 'triton': the caches must be contiguous along the head dimension "
                         f"(strides {key_cache.stride()}): allocate them with torch.zeros/empty")


def write_kv(key: torch.Tensor,  # [T, H_kv, D], any strides
             value: torch.Tensor,  # [T, H_kv, D], any strides
             key_cache: torch.Tensor,  # [num_blocks, block_size, H_kv, D]
             value_cache: torch.Tensor,  # [num_blocks, block_size, H_kv, D]
             slot_mapping: torch.Tensor) -> None:  # [T] int64: slot of each token; < 0 skips it
    """Store every token's K/V in its cache slot (converted to the cache dtype), one launch."""
    _check({"key": key, "value": value, "key_cache": key_cache, "value_cache": value_cache})
    _check_caches(key_cache, value_cache)
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    consts = write_constants(num_tokens, num_kv_heads, head_dim, key_cache.shape[1], kernels.INTERPRETED)
    grid = (triton.cdiv(num_tokens, consts["BLOCK_T"]),)
    kernels.write_kv_kernel[grid](
        key, value, key_cache, value_cache, slot_mapping, num_tokens, num_kv_heads, head_dim,
        *key.stride(), *value.stride(), *key_cache.stride(), **consts)


def write_constants(num_tokens: int, num_kv_heads: int, head_dim: int, block_size: int,
                    interpreted: bool) -> dict[str, int]:
    """The constexprs of ``write_kv_kernel``: a tile of whole tokens' [H_kv, D] rows."""
    block_h, block_d = triton.next_power_of_2(num_kv_heads), triton.next_power_of_2(head_dim)
    tile = _WRITE_TILE * (16 if interpreted else 1)
    block_t = min(max(1, tile // (block_h * block_d)), triton.next_power_of_2(num_tokens))
    return {"BLOCK_SIZE": block_size, "BLOCK_T": block_t, "BLOCK_H": block_h, "BLOCK_D": block_d}


def tile_sizes(group: int, max_query_len: int, head_dim: int, interpreted: bool = False) -> dict[str, int]:
    """The attention kernel's constexpr tile: ``BLOCK_M`` rows pack ``BLOCK_Q``
    tokens x ``group`` heads; a span of at most 16 rows (a decode, a verify
    run) gets a 16-row tile, longer spans 64 (``interpreted``: up to 64 either way)."""
    rows = group * max_query_len
    if interpreted:
        block_m = min(triton.next_power_of_2(rows), _ROWS_PER_TILE)
    else:
        block_m = 16 if rows <= 16 else _ROWS_PER_TILE
    block_m = max(16, block_m, triton.next_power_of_2(group))  # tl.dot needs 16; one token's heads must fit
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_n = 64 if interpreted or block_d <= 64 else 32
    return {"BLOCK_Q": block_m // group, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_D": block_d}


def attention_constants(query_dtype: torch.dtype, cache_dtype: torch.dtype, block_size: int, group: int,
                        max_query_len: int, head_dim: int, interpreted: bool) -> dict:
    """Every constexpr of ``paged_attention_kernel`` and its ``num_warps``: 8 once a
    K/V tile has 4096 elements (ptxas for sm_90 then needs ~155-240 registers per
    thread at 8 warps, and the float32 path spills at 4; not yet tuned on a GPU)."""
    tiles = tile_sizes(group, max_query_len, head_dim, interpreted)
    return {"BLOCK_SIZE": block_size, "GROUP": group, **tiles,
            "DOT_PRECISION": "ieee" if torch.float32 in (query_dtype, cache_dtype) else "tf32",
            "INTERPRETER_LOOP": interpreted, "num_warps": 8 if tiles["BLOCK_D"] * tiles["BLOCK_N"] >= 4096 else 4}


def paged_attention(query: torch.Tensor,  # [T, H, D], any strides
                    key_cache: torch.Tensor,  # [num_blocks, block_size, H_kv, D]
                    value_cache: torch.Tensor,  # [num_blocks, block_size, H_kv, D]
                    cu_query_lens: torch.Tensor,  # [B + 1] int64
                    seq_lens: torch.Tensor,  # [B] int64: cached prefix + query tokens of each span
                    block_tables: torch.Tensor,  # [B, max_blocks] int64
                    *, max_query_len: int, scaling: float,
                    mask_offsets: torch.Tensor | None = None,  # [B] int64: a tree span's mask offset, -1 causal
                    tree_masks: torch.Tensor | None = None,  # uint8, every tree span's [q, q] mask back to back
                    ) -> torch.Tensor:  # -> [T, H, D] like query
    """Attention of every span's queries over its cached keys, one launch: causal,
    or for a tree span (``SpanTensors.tree_masks``) the prefix plus its ancestor mask."""
    if (mask_offsets is None) != (tree_masks is None):
        raise ValueError("attention backend 'triton': mask_offsets and tree_masks go together (SpanTensors sets "
                         "both for a batch with a token tree, neither otherwise): pass both or neither")
    _check({"query": query, "key_cache": key_cache, "value_cache": value_cache})
    _check_caches(key_cache, value_cache)
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = key_cache.shape[2]
    if num_heads % num_kv_heads or key_cache.shape[3] != head_dim:
        raise ValueError(f"attention backend 'triton': queries [T, {num_heads}, {head_dim}] do not fit caches "
                         f"[.., .., {num_kv_heads}, {key_cache.shape[3]}]: the query heads must be a multiple of "
                         "the K/V heads, with the same head size")
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0:
        return out
    consts = attention_constants(query.dtype, key_cache.dtype, key_cache.shape[1], num_heads // num_kv_heads,
                                 max_query_len, head_dim, kernels.INTERPRETED)
    grid = (num_tokens // consts["BLOCK_Q"] + num_seqs, num_kv_heads)  # >= the sum of ceil(q_len / BLOCK_Q)
    has_tree = mask_offsets is not None
    kernels.paged_attention_kernel[grid](
        out, query, key_cache, value_cache, cu_query_lens, seq_lens, block_tables,
        mask_offsets if has_tree else cu_query_lens, tree_masks if has_tree else cu_query_lens, num_seqs, head_dim,
        scaling * math.log2(math.e), *query.stride(), out.stride(0), out.stride(1), *key_cache.stride(),
        block_tables.stride(0), HAS_TREE=has_tree, **consts)
    return out

