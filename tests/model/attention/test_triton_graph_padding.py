"""The triton kernels on a CUDA-graph padded layout (``graph_buffers``), run
on the CPU by Triton's interpreter: a padding span that sees no key (its
K/V written to the trash block) and empty span slots, with the tile host int
(``max_query_len``) fixed per bucket, give the real rows exactly what the
unpadded batch gives, zeros on the padding rows, and leave every real block
as the unpadded batch leaves it.
"""

from __future__ import annotations

import pytest
import torch

from speculant.interfaces.span_tensors import PagedSpan, SpanTensors
from speculant.model.attention.triton_backend import TritonAttentionBackend
from speculant.model.graph_buffers import StaticSpans, host_refill
from triton_interpreter import interpreted_kernels, use_interpreted_kernels

interpreted_kernels()  # skips this module without triton

BS, KV_HEADS, GROUP, D = 4, 2, 2, 16
NUM_BLOCKS = 12  # + the trash block: index 12


@pytest.fixture(scope="module", autouse=True)
def launch():
    with use_interpreted_kernels() as launch:
        yield launch


def spans() -> list[PagedSpan]:
    """A decode over 6 cached tokens, a 3-token verify run over 5, a fresh 4-token prefill chunk."""
    return [PagedSpan([3, 7], 6, [1], [0]), PagedSpan([0, 5], 5, [2, 3, 4], [0, 1, 2]),
            PagedSpan([9], 0, [5, 6, 7, 8], [3])]


@pytest.mark.parametrize("bucket,qcap,slots", [(8, 8, 4), (8, 4, 4), (16, 16, 6), (16, 4, 6)])
def test_padded_layout_gives_the_unpadded_results(bucket, qcap, slots):
    gen = torch.Generator().manual_seed(bucket + qcap)
    shape = (NUM_BLOCKS + 1, BS, KV_HEADS, D)
    key_cache, value_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    real = spans()
    t = sum(s.num_tokens for s in real)
    q = torch.randn(bucket, KV_HEADS * GROUP, D, generator=gen)
    k, v = torch.randn(bucket, KV_HEADS, D, generator=gen), torch.randn(bucket, KV_HEADS, D, generator=gen)
    backend = TritonAttentionBackend()

    eager_k, eager_v = key_cache.clone(), value_cache.clone()
    st = SpanTensors.build(real, BS, torch.device("cpu"))
    want = backend.forward(q[:t], k[:t], v[:t], eager_k, eager_v, backend.build_metadata(st), 0.25)

    static = StaticSpans(16, slots, 4, BS, torch.device("cpu"))
    static.block_tables.fill_(11)  # stale rows and columns: never read
    static.fill(host_refill(real, BS, bucket, slots, trash_slot=NUM_BLOCKS * BS))
    padded = static.span_tensors(bucket, qcap)
    graph_k, graph_v = key_cache.clone(), value_cache.clone()
    got = backend.forward(q, k, v, graph_k, graph_v, backend.build_metadata(padded), 0.25)

    torch.testing.assert_close(got[:t], want, rtol=1e-6, atol=1e-6)
    assert torch.equal(got[t:], torch.zeros_like(got[t:])), "padding rows attend to no key: zeros"
    assert torch.equal(graph_k[:NUM_BLOCKS], eager_k[:NUM_BLOCKS]) and torch.equal(graph_v[:NUM_BLOCKS],
                                                                                     eager_v[:NUM_BLOCKS])
    written = not torch.equal(graph_k[NUM_BLOCKS], key_cache[NUM_BLOCKS])
    assert written == (bucket > t), "padding K/V goes to the trash block, and only there"
