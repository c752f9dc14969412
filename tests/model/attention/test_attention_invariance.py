"""The C attention kernel is batch-invariant: a decode row equals the same position inside a
verify span or a prefill chunk (cut into kernel pieces past MAX_KERNEL_QUERY rows), and a
span's rows do not depend on the other spans of the call, bit for bit, on
every bfloat16 instruction path this CPU runs (scalar, AVX2, the vectorised AVX512-BF16 task) and in
float32; hypothesis draws the head layout, head size, block size, context and span lengths."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_marks import needs_kernel

from speculant.interfaces.span_tensors import PagedSpan, SpanTensors
from speculant.model.attention.cpu_kernel import MAX_KERNEL_QUERY, CpuKernelAttentionBackend
from speculant.model.kernels.abi import runnable_isas
from speculant.model.kernels.build import load_kernel, set_kernel_isa

LIB = load_kernel()
pytestmark = needs_kernel
PATHS = [p for p in ("scalar", "avx2", "avx512_bf16") if LIB is not None and p in runnable_isas(LIB)] or ["scalar"]


def attend(backend, spans: list[PagedSpan], query, key_cache, value_cache, block_size, scale):
    """The backend's output for ``spans`` (their K/V already in the cache: rewritten unchanged)."""
    st_ = SpanTensors.build(spans, block_size, torch.device("cpu"))
    metadata = backend.build_metadata(st_)
    flat_k = key_cache.view(-1, *key_cache.shape[2:])
    flat_v = value_cache.view(-1, *value_cache.shape[2:])
    slots = metadata.slot_mapping
    return backend.forward(query, flat_k[slots].clone(), flat_v[slots].clone(), key_cache, value_cache, metadata,
                           scale)


@settings(max_examples=60, deadline=None)
@given(path=st.sampled_from(PATHS), dtype=st.sampled_from([torch.bfloat16, torch.float32]),
       kv_heads=st.sampled_from([1, 2, 4]), group=st.sampled_from([1, 2, 3]),
       head_dim=st.sampled_from([8, 16, 40, 64, 128, 264]), block_size=st.sampled_from([1, 4, 16]),
       start=st.integers(0, 70), q_len=st.integers(2, 3 * MAX_KERNEL_QUERY), seed=st.integers(0, 2**16))
def test_a_decode_row_equals_its_position_inside_a_verify_span(path, dtype, kv_heads, group, head_dim, block_size,
                                                                start, q_len, seed):
    set_kernel_isa(LIB, path)
    try:
        gen = torch.Generator().manual_seed(seed)
        heads, length = kv_heads * group, max(start + q_len, 4)  # the other span: positions 1..3
        num_blocks = (length + block_size - 1) // block_size + 3
        order = torch.randperm(num_blocks, generator=gen).tolist()  # scattered blocks
        table = order[:(length + block_size - 1) // block_size]
        key_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
        value_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
        query = torch.randn(q_len, heads, head_dim, generator=gen).to(dtype)
        other_query = torch.randn(3, heads, head_dim, generator=gen).to(dtype)
        backend = CpuKernelAttentionBackend()
        scale = head_dim ** -0.5
        verify = attend(backend, [PagedSpan(table, start, [0] * q_len, [])], query, key_cache, value_cache,
                        block_size, scale)
        # with another span of the same sequence in the call (batch expansion's layout)
        mixed = attend(backend, [PagedSpan(table, 1, [0] * 3, []), PagedSpan(table, start, [0] * q_len, [])],
                       torch.cat([other_query, query]), key_cache, value_cache, block_size, scale)[3:]
        for i in range(q_len):
            decode = attend(backend, [PagedSpan(table, start + i, [0], [])], query[i:i + 1], key_cache,
                            value_cache, block_size, scale)
            assert torch.equal(decode[0], verify[i]), f"row {i} of the verify span differs from its decode"
        assert torch.equal(mixed, verify)
    finally:
        set_kernel_isa(LIB, None)
