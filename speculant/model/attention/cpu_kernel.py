"""CPU attention backend: short query spans in one compiled call per layer.

The reference backend attends span by span with about a dozen torch operators
each, so a decode step of B requests costs B x layers x ~60 us of operator
overhead before any arithmetic; at 32 requests that is most of the step. This
backend hands every span of at most ``max_kernel_query`` tokens (decodes,
verify runs of k + 1, batch-expansion rows) to the C kernel in
``csrc/paged_attention.c`` in a single call per layer, parallel over
(span, K/V head) on torch's threads. Longer spans (prefill chunks) keep the
reference path, whose batched matmuls are faster there. The kernel computes
float32, bfloat16 and float16 caches (float32 arithmetic, one rounding of the
output); other dtypes (float64), or a machine where the kernel cannot be built
(see ``cpu_kernel_build.kernel_status()``), use the reference path.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from speculant.interfaces import AttentionBackendCapabilities
from speculant.interfaces.span_tensors import SpanTensors
from speculant.model.attention.cpu_kernel_build import KERNEL_DTYPE_CODES, kernel_dtypes, kernel_status, load_kernel
from speculant.model.attention.torch_ref import SpanView, TorchAttentionBackend

MAX_KERNEL_QUERY = 16
"""Spans longer than this go through the reference path's matmuls."""


@dataclass(slots=True)
class CpuKernelMetadata:
    slot_mapping: torch.Tensor  # [T] long
    spans: SpanTensors  # the whole batch (the kernel reads its tables)
    kernel_ids: torch.Tensor  # [n] long: spans the kernel computes
    other: list[SpanView]  # the rest, for the reference path
    kernel_views: list[SpanView] | None = None  # the kernel's spans as views, built once if a dtype needs them


class CpuKernelAttentionBackend(TorchAttentionBackend):
    name = "cpu_kernel"
    capabilities = AttentionBackendCapabilities(multi_token_queries=True, devices=("cpu",), priority=10)

    def __init__(self) -> None:
        self._lib = load_kernel()
        self._dtypes = kernel_dtypes(self._lib) if self._lib is not None else frozenset()
        if self._lib is None:
            warnings.warn(f"attention backend 'cpu_kernel': the C kernel is unavailable ({kernel_status()}); "
                          "every span uses the torch reference path (correct, slower)", RuntimeWarning,
                          stacklevel=2)

    def build_metadata(self, spans: SpanTensors):
        if self._lib is None or spans.block_tables.device.type != "cpu":
            return super().build_metadata(spans)
        qlens = spans.query_lens.tolist()
        short = [b for b, q in enumerate(qlens) if q <= MAX_KERNEL_QUERY]
        long = [b for b, q in enumerate(qlens) if q > MAX_KERNEL_QUERY]
        return CpuKernelMetadata(spans.slot_mapping, spans, torch.tensor(short, dtype=torch.long),
                                 self.span_views(spans, long))

    def forward(self, query, key, value, key_cache, value_cache, metadata, scaling: float) -> torch.Tensor:
        if not isinstance(metadata, CpuKernelMetadata):
            return super().forward(query, key, value, key_cache, value_cache, metadata, scaling)
        self.write_kv(key, value, key_cache, value_cache, metadata.slot_mapping)
        # row-major [T, H, D] whatever the query's strides: the kernel writes `out` as a
        # dense array, and a query sliced from a fused projection is not one
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        ids = metadata.kernel_ids
        if ids.numel():
            if query.dtype == key_cache.dtype == value_cache.dtype and query.dtype in self._dtypes \
                    and key_cache.is_contiguous() and value_cache.is_contiguous():
                self._run_kernel(query.contiguous(), key_cache, value_cache, metadata.spans, ids, scaling, out)
            else:
                if metadata.kernel_views is None:  # once per forward, not per layer
                    metadata.kernel_views = self.span_views(metadata.spans, ids.tolist())
                self.attend_spans(query, key_cache, value_cache, metadata.kernel_views, scaling, out)
        if metadata.other:
            self.attend_spans(query, key_cache, value_cache, metadata.other, scaling, out)
        return out

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
                    spans: SpanTensors, ids: torch.Tensor,  # [n] long
                    scaling: float, out: torch.Tensor) -> None:  # [T, H, D]
        assert self._lib is not None, "kernel spans are only built with the library loaded"
        _, block_size, num_kv_heads, head_dim = key_cache.shape
        status = self._lib.speculant_paged_attention(
            KERNEL_DTYPE_CODES[query.dtype], query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
            out.data_ptr(),
            spans.cu_query_lens.data_ptr(), spans.starts.data_ptr(), spans.block_tables.data_ptr(),
            spans.block_tables.shape[1], ids.data_ptr(), ids.numel(), query.shape[1], num_kv_heads, head_dim,
            block_size, scaling, torch.get_num_threads())
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
