"""The ``triton`` attention backend: one kernel launch per layer for the whole
mixed batch (prefill chunks, decodes, multi-token verify runs) on CUDA.

``forward`` is two launches (``triton_launch``): the K/V write through the
slot mapping, then paged attention driven by ``cu_query_lens``, ``seq_lens``
and ``block_tables`` as ``SpanTensors`` built them, with no host reads.
Features beyond causal softmax attention with a scale and grouped K/V heads
(windows, soft-capping, sinks, ALiBi) never reach a backend: the load-time
probe refuses such models (``seam_probe``).

Where it runs: CUDA devices with the ``triton`` package importable, model
dtypes float32, bfloat16 and float16 (float32 arithmetic). The capability
flags say so, so the checker refuses the CPU, float64 or a missing package
with the reason and ``attention_backend = 'auto'`` picks this backend on CUDA
only where it can run. Triton itself is imported when the backend is built,
not when the plugin registers it. Tests run the kernels on the CPU under
``TRITON_INTERPRET=1`` (see ``tests/model/attention/test_triton_attention.py``), where
the flags are widened to the CPU by the test itself.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from speculant.interfaces import AttentionBackend, AttentionBackendCapabilities
from speculant.interfaces.span_tensors import SpanTensors

_MISSING = None if importlib.util.find_spec("triton") is not None else (
    "the `triton` package is not installed: `pip install triton` (PyTorch's CUDA wheels for Linux bring it) "
    "or choose another model.attention_backend")


@dataclass(slots=True)
class TritonAttentionMetadata:
    slot_mapping: torch.Tensor  # [T] long: cache slot of each token's K/V
    cu_query_lens: torch.Tensor  # [B + 1] long
    seq_lens: torch.Tensor  # [B] long: cached prefix + query tokens of each span
    block_tables: torch.Tensor  # [B, max_blocks] long
    max_query_len: int  # host copy: picks the kernel's tile
    mask_offsets: torch.Tensor | None = None  # [B] long: a tree span's mask in tree_masks, -1 causal
    tree_masks: torch.Tensor | None = None  # uint8: SpanTensors.tree_masks


class TritonAttentionBackend(AttentionBackend):
    name = "triton"
    api_version = "3.0"
    capabilities = AttentionBackendCapabilities(
        multi_token_queries=True, devices=("cuda",), priority=20, dtypes=("float32", "bfloat16", "float16"),
        unavailable=_MISSING, graph_capturable=True, tree_attention=True)

    def __init__(self) -> None:
        from speculant.model.attention import triton_launch  # imports triton: only once the backend is chosen

        self._launch = triton_launch

    def build_metadata(self, spans: SpanTensors) -> TritonAttentionMetadata:
        return TritonAttentionMetadata(spans.slot_mapping, spans.cu_query_lens, spans.seq_lens,
                                       spans.block_tables, spans.max_query_len, spans.mask_offsets, spans.tree_masks)

    def forward(self, query: torch.Tensor,  # [T, H, D]
                key: torch.Tensor, value: torch.Tensor,  # [T, H_kv, D]
                key_cache: torch.Tensor, value_cache: torch.Tensor,  # [num_blocks, block_size, H_kv, D]
                metadata: TritonAttentionMetadata, scaling: float) -> torch.Tensor:  # [T, H, D]
        self._launch.write_kv(key, value, key_cache, value_cache, metadata.slot_mapping)
        return self._launch.paged_attention(
            query, key_cache, value_cache, metadata.cu_query_lens, metadata.seq_lens, metadata.block_tables,
            max_query_len=metadata.max_query_len, scaling=scaling, mask_offsets=metadata.mask_offsets,
            tree_masks=metadata.tree_masks)
