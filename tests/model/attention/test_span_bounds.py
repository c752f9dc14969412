"""A span never reads or writes outside the KV pool.

Before these checks the C attention indexed the cache by ``table[j / block_size]``
without knowing the pool's size: a prefix block 9 of a 9-block pool returned
garbage, block 100000 killed the process with SIGSEGV. Now every block id and
position a span uses is checked, in Python before any forward (every backend)
and in C before the kernels touch memory, and a bad span is an ``IndexError``
naming the block and the pool's size, with nothing read or written.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from kernel_marks import needs_kernel

from speculant.config.models import CacheConfig, ModelConfig
from speculant.interfaces.span_tensors import PagedSpan, SpanTensors
from speculant.model.attention.cpu_kernel import CpuKernelAttentionBackend
from speculant.model.attention.span_bounds import check_spans
from speculant.model.attention.torch_ref import TorchAttentionBackend
from speculant.model.kernels.abi import KERNEL_DTYPE_CODES, SPAN_BAD_FIELDS
from speculant.model.kernels.build import load_kernel
from speculant.model.runner import ModelRunner

BS, POOL, D = 4, 9, 8


def bad_spans(block: int) -> list[PagedSpan]:
    """A good span, then one whose prefix block is ``block`` (its own query lands in block 8)."""
    return [PagedSpan([0, 1], 0, [1, 2, 3], [2]), PagedSpan([block, 8], BS, [5], [0])]


@needs_kernel
@pytest.mark.parametrize("block", [POOL, 100000, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_c_attention_refuses_a_block_outside_the_pool_and_touches_nothing(block, dtype):
    backend = CpuKernelAttentionBackend()
    meta = backend.build_metadata(SpanTensors.build(bad_spans(block), BS, torch.device("cpu")))
    caches = [torch.zeros(POOL, BS, 1, D, dtype=dtype) for _ in range(2)]
    q, k = torch.randn(4, 2, D, dtype=dtype), torch.randn(4, 1, D, dtype=dtype)
    with pytest.raises(IndexError, match=rf"span 1 of the forward: block-table entry 0 is block {block}, "
                                         rf"outside the KV pool of {POOL} blocks \(ids 0..{POOL - 1}\)"):
        backend.forward(q, k, k, *caches, meta, 0.5)
    assert not any(c.any() for c in caches), "a refused forward wrote K/V"


@needs_kernel
def test_the_kernel_itself_refuses_before_reading():
    """The kernel entry point checks on its own (a caller that skips the Python checks is still safe)."""
    lib = load_kernel()
    st = SpanTensors.build(bad_spans(100000), BS, torch.device("cpu"))
    caches = [torch.zeros(POOL, BS, 1, D) for _ in range(2)]
    q, out = torch.randn(4, 2, D), torch.full((4, 2, D), 7.0)
    ids, bad = torch.arange(2), torch.zeros(SPAN_BAD_FIELDS, dtype=torch.int64)
    status = lib.speculant_paged_attention(
        KERNEL_DTYPE_CODES[torch.float32], q.data_ptr(), caches[0].data_ptr(), caches[1].data_ptr(), out.data_ptr(),
        st.cu_query_lens.data_ptr(), st.starts.data_ptr(), st.block_tables.data_ptr(), 2, st.block_tables.shape[1],
        ids.data_ptr(), 2, 4, POOL, 2, 1, D, BS, 0.5, None, None, 1, bad.data_ptr())
    assert status == -3 and bad.tolist() == [0, 1, 0, 100000, BS, BS + 1]
    assert (out == 7.0).all(), "the kernel wrote output for a refused batch"


@needs_kernel
@pytest.mark.parametrize("case,kind", [
    ("rows past the forward", 2), ("negative start", 2), ("span id outside the batch", 3), ("short table", 1)])
def test_check_spans_in_c_names_each_kind_of_fault(case, kind):
    lib = load_kernel()
    cu, starts, tables, ids = [0, 3, 4], [0, BS], [[0, 1], [2, 8]], [0, 1]
    num_tokens, max_blocks = 4, 2
    if case == "rows past the forward":
        num_tokens = 3
    elif case == "negative start":
        starts[1] = -1
    elif case == "span id outside the batch":
        ids = [0, 2]
    else:
        max_blocks, tables = 1, [[0], [2]]
    t = {name: torch.tensor(v, dtype=torch.long) for name, v in
         dict(cu=cu, starts=starts, tables=tables, ids=ids).items()}
    bad = torch.zeros(SPAN_BAD_FIELDS, dtype=torch.int64)
    status = lib.speculant_check_spans(t["cu"].data_ptr(), t["starts"].data_ptr(), t["tables"].data_ptr(), 2,
                                       max_blocks, t["ids"].data_ptr(), 2, num_tokens, POOL, BS, bad.data_ptr())
    assert status == -3 and bad[0] == kind


@pytest.mark.parametrize("spans,error,match", [
    ([], ValueError, "at least one span"),
    ([PagedSpan([0], 62, [1, 2, 3], [0])], ValueError, r"positions 62..64, outside 0..63 \(model.max_model_len"),
    ([PagedSpan([0], -1, [1], [0])], ValueError, "must start at a position >= 0"),
    ([PagedSpan([0], 0, [1], [1])], ValueError, "logits_at"),
    ([PagedSpan([0], 3, [1, 2], [0])], IndexError, "need 2 block-table entries of 4 positions, but its table has 1"),
    ([PagedSpan([0, 1], 0, [1], [0]), PagedSpan([3, 9], 4, [1], [0])], IndexError,
     r"span 1 of the forward: block-table entry 1 is block 9, outside the KV pool of 9 blocks"),
])
def test_check_spans_names_the_problem(spans, error, match):
    with pytest.raises(error, match=match):
        check_spans(spans, BS, POOL, 64)


@pytest.mark.parametrize("backend", [TorchAttentionBackend, CpuKernelAttentionBackend])
def test_every_backend_refuses_through_the_runner(backend, llama_dir):
    runner = ModelRunner(ModelConfig(path=str(llama_dir)), CacheConfig(num_blocks=8, block_size=BS), backend())
    pool = runner.num_blocks + 1  # the trash block is a real block of the cache
    before = [c.clone() for c in runner.key_caches]
    for block in (pool, 100000, -5):
        span = PagedSpan([block, runner.trash_block], BS, [5], [0])
        with pytest.raises(IndexError, match=f"is block {block}, outside the KV pool of {pool} blocks"):
            runner.forward([span])
    assert all(torch.equal(a, b) for a, b in zip(before, runner.key_caches))
    good = runner.forward([PagedSpan([0], 0, [1, 2, 3], [2])])
    assert torch.isfinite(good.logits).all()


def test_max_model_len_is_a_real_check_under_python_O(llama_dir):
    """``python -O`` strips asserts; the runner's guard must survive it."""
    code = (
        "import sys; from speculant.config.models import CacheConfig, ModelConfig\n"
        "from speculant.interfaces.span_tensors import PagedSpan\n"
        "from speculant.model.attention.torch_ref import TorchAttentionBackend\n"
        "from speculant.model.runner import ModelRunner\n"
        f"r = ModelRunner(ModelConfig(path={str(llama_dir)!r}, max_model_len=16), CacheConfig(num_blocks=8, "
        "block_size=4), TorchAttentionBackend())\n"
        "try:\n    r.forward([PagedSpan([0, 1, 2, 3, 4], 15, [1, 2], [0])])\nexcept ValueError as e:\n"
        "    print('refused:', e); sys.exit(0)\nsys.exit(3)\n")
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "model.max_model_len = 16" in out.stdout


def test_the_graph_buffers_refuse_what_does_not_fit():
    """The static graph buffers are written in place: their guards are real checks, not asserts."""
    from speculant.model.graph_buffers import host_refill

    spans = [PagedSpan([0], 0, [1, 2], [1]), PagedSpan([1], 0, [3], [0])]
    with pytest.raises(ValueError, match="2 spans do not fit the graph's 2 span slots"):
        host_refill(spans, BS, 8, 2, trash_slot=POOL * BS)
    with pytest.raises(ValueError, match="3 tokens do not fit the graph bucket of 2"):
        host_refill(spans, BS, 2, 4, trash_slot=POOL * BS)
    assert host_refill(spans, BS, 4, 3, trash_slot=POOL * BS).num_tokens == 3
