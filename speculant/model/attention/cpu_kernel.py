"""CPU attention backend: every query span of a forward in one compiled call per layer.

The reference backend attends span by span with about a dozen torch operators
each, so a decode step of B requests costs B x layers x ~60 us of operator
overhead before any arithmetic; at 32 requests that is most of the step. This
backend hands the whole batch (decodes, verify runs of k + 1, batch-expansion
rows and prefill chunks) to the C kernel in ``csrc/paged_attention.c`` in a
single call per layer, parallel over (piece, K/V head) on torch's threads.

Pieces: a span longer than ``MAX_KERNEL_QUERY`` query rows (a prefill chunk) is
cut into pieces of at most that many rows (``KernelPieces``). A piece of span
b covering its rows [i, j) is itself a span: its first query sits at position
``start_b + i`` and it sees the keys up to its own rows, causally, through b's
block table. Each row's output depends only on the row and the keys it sees
(the kernel walks them in the same tiles from key 0), so the cut changes no
bit; it gives the threads many small tasks instead of a few long ones. A tree
span (a token tree under verification, ``SpanTensors.tree_masks``) is never
cut: its mask is laid out over the whole span, and trees are short. (Long
spans used to take the reference path's batched matmuls: on SmolLM2 bfloat16 a
fused kernel prefill is 1.3x faster at 100 tokens and 4.5x at 1600.)

The kernel computes float32, bfloat16 and float16 caches (float32 arithmetic,
one rounding of the output); other dtypes (float64), or a machine where the
kernel cannot be built (see ``kernels.build.kernel_status()``), use the
reference path.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from speculant.interfaces import AttentionBackendCapabilities
from speculant.interfaces.span_tensors import SpanTensors
from speculant.model.attention.span_bounds import span_fault_message
from speculant.model.attention.torch_ref import SpanView, TorchAttentionBackend
from speculant.model.kernels.abi import (
    KERNEL_DTYPE_CODES,
    SPAN_BAD_FIELDS,
    kernel_dtypes,
)
from speculant.model.kernels.build import kernel_report, load_kernel

MAX_KERNEL_QUERY = 16
"""The most query rows of one kernel piece: longer spans are cut (module docstring)."""


@dataclass(slots=True)
class KernelPieces:
    """The batch's spans as the kernel takes them: each span, or its pieces, in row order."""

    cu_query_lens: torch.Tensor  # [P + 1] long: piece p's rows are cu[p]:cu[p + 1]
    starts: torch.Tensor  # [P] long: position of each piece's first query row
    block_tables: torch.Tensor  # [P, max_blocks] long: its span's table
    ids: torch.Tensor  # [P] long: 0..P-1, the pieces the kernel computes
    mask_offsets: torch.Tensor | None = None  # [P] long: a tree piece's mask in tree_masks, -1 causal; None: no tree
    tree_masks: torch.Tensor | None = None  # SpanTensors.tree_masks

    def mask_pointers(self) -> tuple[int | None, int | None]:
        """The two tree-mask arguments of the C entry points (NULL, NULL without a tree)."""
        if self.mask_offsets is None or self.tree_masks is None:
            return None, None
        return self.mask_offsets.data_ptr(), self.tree_masks.data_ptr()

    @classmethod
    def of(cls, spans: SpanTensors, qlens: list[int], limit: int) -> KernelPieces:
        """``spans`` themselves when none is longer than ``limit`` rows (decode and verify
        steps), else every causal span cut into pieces of at most ``limit`` rows."""
        n = len(qlens)
        if not qlens or max(qlens) <= limit:
            return cls(spans.cu_query_lens, spans.starts, spans.block_tables, torch.arange(n),
                       spans.mask_offsets, spans.tree_masks)
        cu, starts = spans.cu_query_lens.tolist(), spans.starts.tolist()
        offsets = spans.mask_offsets.tolist() if spans.mask_offsets is not None else [-1] * n
        owner: list[int] = []
        piece_cu: list[int] = []
        piece_starts: list[int] = []
        piece_masks: list[int] = []
        for b, q in enumerate(qlens):
            step = limit if offsets[b] < 0 else max(q, 1)  # a tree span stays whole
            for i in range(0, q, step):  # a span of no rows has no piece
                owner.append(b)
                piece_cu.append(cu[b] + i)
                piece_starts.append(starts[b] + i)
                piece_masks.append(offsets[b])
        piece_cu.append(cu[-1])
        device = spans.block_tables.device

        def tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        return cls(tensor(piece_cu), tensor(piece_starts), spans.block_tables.index_select(0, tensor(owner)),
                   torch.arange(len(owner), device=device),
                   tensor(piece_masks) if spans.mask_offsets is not None else None, spans.tree_masks)


@dataclass(slots=True)
class CpuKernelMetadata:
    slot_mapping: torch.Tensor  # [T] long
    spans: SpanTensors  # the whole batch
    pieces: KernelPieces  # what the kernel reads
    kernel_views: list[SpanView] | None = None  # the spans as views, built once if a dtype needs the reference path
    checked_pool: int = -1  # the pool size (blocks) the pieces were last checked against, once per forward


class CpuKernelAttentionBackend(TorchAttentionBackend):
    name = "cpu_kernel"
    api_version = "3.0"
    capabilities = AttentionBackendCapabilities(multi_token_queries=True, devices=("cpu",), priority=10,
                                                tree_attention=True)

    def __init__(self) -> None:
        self._lib = load_kernel()
        self._dtypes = kernel_dtypes(self._lib) if self._lib is not None else frozenset()
        if self._lib is None:
            warnings.warn(f"attention backend 'cpu_kernel': {kernel_report()}", RuntimeWarning, stacklevel=2)

    def build_metadata(self, spans: SpanTensors):
        if self._lib is None or spans.block_tables.device.type != "cpu":
            return super().build_metadata(spans)
        qlens = spans.query_lens.tolist()
        return CpuKernelMetadata(spans.slot_mapping, spans, KernelPieces.of(spans, qlens, MAX_KERNEL_QUERY))

    def forward(self, query, key, value, key_cache, value_cache, metadata, scaling: float) -> torch.Tensor:
        if not isinstance(metadata, CpuKernelMetadata):
            return super().forward(query, key, value, key_cache, value_cache, metadata, scaling)
        if metadata.checked_pool != key_cache.shape[0]:  # before anything is written
            self.check_pieces(metadata.pieces, key_cache.shape[0], key_cache.shape[1], query.shape[0])
            metadata.checked_pool = key_cache.shape[0]
        self.write_kv(key, value, key_cache, value_cache, metadata.slot_mapping)
        # row-major [T, H, D] whatever the query's strides: the kernel writes `out` as a
        # dense array, and a query sliced from a fused projection is not one
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        if query.dtype == key_cache.dtype == value_cache.dtype and query.dtype in self._dtypes \
                and key_cache.is_contiguous() and value_cache.is_contiguous():
            self._run_kernel(query.contiguous(), key_cache, value_cache, metadata.pieces, scaling, out)
        else:
            if metadata.kernel_views is None:  # once per forward, not per layer
                metadata.kernel_views = self.span_views(metadata.spans, list(range(metadata.spans.num_seqs)))
            self.attend_spans(query, key_cache, value_cache, metadata.kernel_views, scaling, out)
        return out

    def check_pieces(self, pieces: KernelPieces, num_blocks: int, block_size: int, num_tokens: int) -> None:
        """Raise ``IndexError`` where a piece would read or write outside the pool's ``num_blocks``
        blocks or the forward's ``num_tokens`` rows (csrc: ``speculant_check_spans``)."""
        if self._lib is None:
            raise RuntimeError("attention backend 'cpu_kernel': kernel pieces reached a backend without the library")
        bad = torch.zeros(SPAN_BAD_FIELDS, dtype=torch.int64)
        tables = pieces.block_tables
        if self._lib.speculant_check_spans(
                pieces.cu_query_lens.data_ptr(), pieces.starts.data_ptr(), tables.data_ptr(), tables.shape[0],
                tables.shape[1], pieces.ids.data_ptr(), pieces.ids.numel(), num_tokens, num_blocks, block_size,
                bad.data_ptr()) != 0:
            raise IndexError("attention backend 'cpu_kernel': " + span_fault_message(
                bad.tolist(), num_blocks, block_size, num_tokens, tables.shape[0]))

    def write_kv(self, key: torch.Tensor,  # [T, H_kv, D]
                 value: torch.Tensor,  # [T, H_kv, D]
                 key_cache: torch.Tensor,  # [num_blocks, block_size, H_kv, D]
                 value_cache: torch.Tensor,  # [num_blocks, block_size, H_kv, D]
                 slot_mapping: torch.Tensor) -> None:  # [T] long
        """The C copy (``csrc/kv_write.c``) where layouts allow: rows in the cache's dtype with
        their [H_kv, D] contiguous, contiguous caches on the CPU; else the index assignment."""
        if self._lib is None or not _copyable(key, value, key_cache, value_cache, slot_mapping):
            return super().write_kv(key, value, key_cache, value_cache, slot_mapping)
        row = key_cache.shape[2] * key_cache.shape[3]
        status = self._lib.speculant_write_kv(
            key.data_ptr(), key.stride(0), value.data_ptr(), value.stride(0), key_cache.data_ptr(),
            value_cache.data_ptr(), slot_mapping.data_ptr(), slot_mapping.numel(), row, key.element_size(),
            key_cache.numel() // row)
        if status != 0:
            raise IndexError(f"attention backend 'cpu_kernel': a slot in slot_mapping lies outside the cache's "
                             f"{key_cache.numel() // row} slots; the block tables and the cache disagree")

    def _run_kernel(self, query: torch.Tensor,  # [T, H, D] float32 / bfloat16 / float16, contiguous
                    key_cache: torch.Tensor, value_cache: torch.Tensor,  # [num_blocks, block_size, H_kv, D]
                    pieces: KernelPieces, scaling: float,
                    out: torch.Tensor) -> None:  # [T, H, D]
        if self._lib is None:
            raise RuntimeError("attention backend 'cpu_kernel': kernel pieces reached a backend without the library")
        num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
        bad = torch.zeros(SPAN_BAD_FIELDS, dtype=torch.int64)
        tables = pieces.block_tables
        status = self._lib.speculant_paged_attention(
            KERNEL_DTYPE_CODES[query.dtype], query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
            out.data_ptr(), pieces.cu_query_lens.data_ptr(), pieces.starts.data_ptr(), tables.data_ptr(),
            tables.shape[0], tables.shape[1], pieces.ids.data_ptr(), pieces.ids.numel(), query.shape[0], num_blocks,
            query.shape[1], num_kv_heads, head_dim, block_size, scaling, *pieces.mask_pointers(),
            torch.get_num_threads(), bad.data_ptr())
        if status == -3:
            raise IndexError("attention backend 'cpu_kernel': " + span_fault_message(
                bad.tolist(), num_blocks, block_size, query.shape[0], tables.shape[0]))
        if status == -2:
            raise RuntimeError(f"attention backend 'cpu_kernel': this kernel build does not compute {query.dtype}")
        if status != 0:
            raise MemoryError("attention backend 'cpu_kernel': the kernel could not allocate its scratch buffer")


def _copyable(key: torch.Tensor, value: torch.Tensor,  # [T, H_kv, D]
              key_cache: torch.Tensor, value_cache: torch.Tensor,  # [num_blocks, block_size, H_kv, D]
              slot_mapping: torch.Tensor) -> bool:  # [T]
    inner = (key_cache.shape[3], 1)
    return (key.dtype == value.dtype == key_cache.dtype == value_cache.dtype
            and key.device.type == value.device.type == key_cache.device.type == "cpu"
            and key_cache.is_contiguous() and value_cache.is_contiguous()
            and key.shape[0] == value.shape[0] == slot_mapping.numel() and key.shape[1:] == key_cache.shape[2:]
            and value.shape[1:] == value_cache.shape[2:]
            and key.stride()[1:] == inner and value.stride()[1:] == inner
            and slot_mapping.dtype == torch.long and slot_mapping.is_contiguous())
