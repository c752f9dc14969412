"""The attention backends (every one registered for the CPU, plus the C
kernel restricted to single-token spans) against dense causal SDPA.

Random q/k/v for several sequences, each with its own non-contiguous,
out-of-order block table in a pool full of garbage; one forward carries a
prefill chunk over a cached prefix, a fresh prefill, a plain decode, a
multi-token (MQA-style) decode and batch-expansion siblings (single-token
spans sharing one block table, deliberately out of order). Inputs arrive in
every memory layout a model hands the seam: contiguous, transposed from
transformers' ``[1, H, T, D]``, sliced from one fused q/k/v projection, and
partially rotated (rotary half concatenated onto a pass-through half). The
reference runs ``scaled_dot_product_attention(is_causal=True)`` over each
whole sequence with the K/V heads repeated (GQA) and keeps the rows the
spans query.
"""

from __future__ import annotations

import os
import shutil
import types

import pytest
import torch
import torch.nn.functional as F
from kernel_marks import cpu_flags, require_bf16_paths, require_kernel

from speculant.interfaces.span_tensors import PagedSpan, SpanTensors
from speculant.model.attention import cpu_kernel
from speculant.model.attention.cpu_kernel import CpuKernelAttentionBackend
from speculant.model.attention.torch_ref import TorchAttentionBackend
from speculant.model.kernels import build as cpu_kernel_build
from speculant.model.kernels.abi import CPU_FEATURE_NAMES, detected_isa, runnable_isas
from speculant.model.kernels.build import kernel_dtypes, kernel_isa, load_kernel, set_kernel_isa
from speculant.plugins.manager import get_registry

NUM_HEADS = 4
HEAD_DIM = 8
BLOCK_SIZE = 4  # the single-case tests at the end

SEQUENCE_LENGTHS = {"chunk": 11, "fresh": 3, "decode": 10, "mqa": 8, "siblings": 10}
# (sequence, start, end): the query tokens of one span
LAYOUTS = {
    "mixed": [("chunk", 5, 11), ("fresh", 0, 3), ("decode", 9, 10), ("mqa", 5, 8),
              ("siblings", 8, 9), ("siblings", 7, 8), ("siblings", 9, 10)],
    "one-chunk-over-prefix": [("chunk", 5, 11)],
    "one-fresh-prefill": [("chunk", 0, 11)],
    "decodes-only": [("decode", 9, 10), ("mqa", 7, 8), ("chunk", 10, 11)],
    "siblings-only": [("siblings", 9, 10), ("siblings", 7, 8), ("siblings", 8, 9)],
}
INPUT_LAYOUTS = ("contiguous", "transposed", "fused-slices", "partial-rotary")
pytestmark = pytest.mark.usefixtures("one_thread")
TOLERANCE = {torch.float32: 2e-6, torch.float64: 1e-12}


def block_tables(block_size: int, gen: torch.Generator) -> tuple[dict[str, list[int]], int]:
    """Non-contiguous, shuffled tables for every sequence, and the pool size
    (a few spare blocks left as garbage)."""
    needed = {name: -(-n // block_size) for name, n in SEQUENCE_LENGTHS.items()}
    num_blocks = sum(needed.values()) + 3
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables, at = {}, 0
    for name, n in needed.items():
        tables[name], at = order[at: at + n], at + n
    return tables, num_blocks


def as_layout(kind: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """``q`` [T, H, D], ``k``/``v`` [T, H_kv, D] with the same values, laid out
    in memory the way a model would hand them over."""
    if kind == "contiguous":
        return q, k, v
    if kind == "transposed":  # [1, H, T, D] from the model, transposed back by the seam
        return tuple(x.transpose(0, 1).contiguous().transpose(0, 1) for x in (q, k, v))
    t = q.shape[0]
    fused = torch.cat([x.reshape(t, -1) for x in (q, k, v)], dim=1)  # one q/k/v projection [T, F]
    hq, hk = q.shape[1] * q.shape[2], k.shape[1] * k.shape[2]
    views = (fused[:, :hq].view(q.shape), fused[:, hq: hq + hk].view(k.shape), fused[:, hq + hk:].view(v.shape))
    if kind == "fused-slices":
        return views
    assert kind == "partial-rotary"
    half = q.shape[2] // 2  # rotary part and pass-through part joined in [H, T, D], as models do
    q, k = (torch.cat([x.transpose(0, 1)[..., :half], x.transpose(0, 1)[..., half:]], -1).transpose(0, 1)
            for x in views[:2])
    return q, k, views[2]


def reference(q, k, v, scaling):  # q [L, H, D], k/v [L, H_kv, D] -> [L, H, D]
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         is_causal=True, scale=scaling)
    return out.transpose(0, 1)


def backend_variants():
    """Every attention backend registered for the CPU; the C kernel also with
    every span cut into one-row pieces and into pieces of four rows (an 11-row chunk: 4 + 4 + 3)."""
    registry = get_registry()
    for name in sorted(registry.names("attention_backend")):
        cls = registry.get("attention_backend", name)
        if "cpu" in cls.capabilities.devices:
            yield pytest.param(cls, None, id=name)
            if cls is CpuKernelAttentionBackend:
                yield pytest.param(cls, 1, id=f"{name}-one-row-pieces")
                yield pytest.param(cls, 4, id=f"{name}-four-row-pieces")


def run_backend(backend_cls, layout: str, input_layout: str, block_size: int, num_kv_heads: int, scale: float,
                dtype: torch.dtype, head_dim: int = HEAD_DIM):
    """One mixed batch through ``backend_cls`` over shuffled paged blocks with
    garbage around them; checks the K/V writes and returns (out [T, H, D],
    the spans, every sequence's full q/k/v)."""
    gen = torch.Generator().manual_seed(0)
    tables, num_blocks = block_tables(block_size, gen)
    full = {name: tuple(torch.randn(length, h, head_dim, generator=gen, dtype=torch.float64).to(dtype)
                        for h in (NUM_HEADS, num_kv_heads, num_kv_heads))
            for name, length in SEQUENCE_LENGTHS.items()}
    # a pool of garbage; then the cached prefix of every span (positions < its lowest start)
    key_cache = (100 * torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen,
                                   dtype=torch.float64)).to(dtype)
    value_cache = (100 * torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen,
                                     dtype=torch.float64)).to(dtype)
    flat_k, flat_v = key_cache.view(-1, num_kv_heads, head_dim), value_cache.view(-1, num_kv_heads, head_dim)

    def slot(name: str, pos: int) -> int:
        return tables[name][pos // block_size] * block_size + pos % block_size

    spans_def = LAYOUTS[layout]
    touched = set()
    for name in {s for s, _, _ in spans_def}:
        first_new = min(start for s, start, _ in spans_def if s == name)
        for pos in range(first_new):
            flat_k[slot(name, pos)], flat_v[slot(name, pos)] = full[name][1][pos], full[name][2][pos]
        touched |= {slot(name, p) for p in range(max(end for s, _, end in spans_def if s == name))}
    untouched = sorted(set(range(num_blocks * block_size)) - touched)
    garbage_k, garbage_v = flat_k[untouched].clone(), flat_v[untouched].clone()

    spans, qs, ks, vs = [], [], [], []
    for name, start, end in spans_def:
        q, k, v = full[name]
        spans.append(PagedSpan(list(tables[name]), start, [0] * (end - start), []))
        qs.append(q[start:end]), ks.append(k[start:end]), vs.append(v[start:end])
    query, key, value = as_layout(input_layout, torch.cat(qs), torch.cat(ks), torch.cat(vs))
    assert torch.equal(query, torch.cat(qs)) and torch.equal(value, torch.cat(vs))
    assert query.is_contiguous() == (input_layout == "contiguous")
    backend = backend_cls()
    metadata = backend.build_metadata(SpanTensors.build(spans, block_size, torch.device("cpu")))
    out = backend.forward(query, key, value, key_cache, value_cache, metadata, scale)
    assert out.shape == (sum(q.shape[0] for q in qs), NUM_HEADS, head_dim) and out.dtype == dtype
    # every span's K/V landed in its own slots; nothing else was written
    for name, _, end in spans_def:
        slots = [slot(name, pos) for pos in range(end)]
        assert torch.equal(flat_k[slots], full[name][1][:end]) and torch.equal(flat_v[slots], full[name][2][:end])
    assert torch.equal(flat_k[untouched], garbage_k) and torch.equal(flat_v[untouched], garbage_v)
    return out, spans_def, full


@pytest.mark.parametrize("scaling, dtype", [(None, torch.float32), (1.0, torch.float64)],
                         ids=["fp32-scale-default", "fp64-scale-1"])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["mha", "gqa2", "mqa1"])
@pytest.mark.parametrize("block_size", [1, 4, 16], ids=lambda b: f"block{b}")
@pytest.mark.parametrize("input_layout", INPUT_LAYOUTS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("backend_cls, kernel_max_query", list(backend_variants()))
def test_backend_matches_dense_causal_sdpa(backend_cls, kernel_max_query, layout, input_layout, block_size,
                                           num_kv_heads, scaling, dtype, monkeypatch):
    if kernel_max_query is not None:
        monkeypatch.setattr(cpu_kernel, "MAX_KERNEL_QUERY", kernel_max_query)
    scale = HEAD_DIM ** -0.5 if scaling is None else scaling
    out, spans_def, full = run_backend(backend_cls, layout, input_layout, block_size, num_kv_heads, scale, dtype)
    row = 0
    for name, start, end in spans_def:
        want = reference(*full[name], scale)[start:end]
        got = out[row: row + end - start]
        err = (got - want).abs().max().item()
        assert err <= TOLERANCE[dtype], f"span {name}[{start}:{end}]: max error {err:.3e}"
        row += end - start


# Reduced precision: the reference is float64 attention over the stored (rounded)
# inputs. The C kernel widens its inputs exactly, computes in float32 and rounds
# once, to nearest: every element is within half a unit in the last place of the
# exact value (eps / 2 * |want|; float32 round-off adds ~1e-6 of the values' scale). The torch
# reference path rounds its scores and probabilities to the dtype on the way, so
# it is only held to a bound that a layout or indexing bug (errors of order 1) breaks.
REDUCED = (torch.bfloat16, torch.float16)


@pytest.mark.parametrize("dtype", REDUCED, ids=["bf16", "fp16"])
@pytest.mark.parametrize("num_kv_heads", [4, 1], ids=["mha", "mqa1"])
@pytest.mark.parametrize("block_size", [1, 16], ids=lambda b: f"block{b}")
@pytest.mark.parametrize("input_layout", INPUT_LAYOUTS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("backend_cls, kernel_max_query", list(backend_variants()))
def test_backend_in_reduced_precision_matches_float64_attention(backend_cls, kernel_max_query, layout, input_layout,
                                                                 block_size, num_kv_heads, dtype, monkeypatch):
    if kernel_max_query is not None:
        monkeypatch.setattr(cpu_kernel, "MAX_KERNEL_QUERY", kernel_max_query)
    lib = load_kernel()
    on_kernel = backend_cls is CpuKernelAttentionBackend and lib is not None and dtype in kernel_dtypes(lib)
    scale = HEAD_DIM ** -0.5
    out, spans_def, full = run_backend(backend_cls, layout, input_layout, block_size, num_kv_heads, scale, dtype)
    eps = torch.finfo(dtype).eps
    row = 0
    for name, start, end in spans_def:
        want = reference(*(x.double() for x in full[name]), scale)[start:end]
        got = out[row: row + end - start].double()
        err = (got - want).abs()
        if on_kernel:
            bound = 0.5 * eps * want.abs() + 1e-5  # half an ulp: rounded once, to nearest
            over = (err - bound).max().item()
            assert over <= 0, f"span {name}[{start}:{end}]: error {over:.3e} over half an ulp"
        else:
            assert err.max().item() <= 8 * eps * max(1.0, want.abs().max().item()), f"span {name}[{start}:{end}]"
        row += end - start


def test_span_tensors_positions_and_slots():
    """The flattened layout the runner feeds the model: positions and the cache
    slot each token's K/V is written to, through non-contiguous tables."""
    spans = [PagedSpan([9, 3, 12], 3, [5, 6, 7], [2]), PagedSpan([1], 2, [8], [0]),
             PagedSpan([4, 0], 4, [9], [0])]
    st = SpanTensors.build(spans, BLOCK_SIZE, torch.device("cpu"))
    assert st.token_ids.tolist() == [5, 6, 7, 8, 9]
    assert st.positions.tolist() == [3, 4, 5, 2, 4]
    assert st.slot_mapping.tolist() == [9 * 4 + 3, 3 * 4 + 0, 3 * 4 + 1, 1 * 4 + 2, 0 * 4 + 0]
    assert st.query_lens.tolist() == [3, 1, 1] and st.seq_lens.tolist() == [6, 3, 5]
    assert st.max_query_len == 3 and st.max_seq_len == 6


def test_capabilities():
    caps = TorchAttentionBackend.capabilities
    assert caps.multi_token_queries and "cpu" in caps.devices


@pytest.mark.skipif(shutil.which(os.environ.get("CC") or "cc") is None, reason="no C compiler")
def test_cpu_kernel_is_built_where_a_compiler_exists():
    assert cpu_kernel_build.load_kernel() is not None, cpu_kernel_build.kernel_status()
    assert CpuKernelAttentionBackend()._lib is not None


def test_cpu_kernel_falls_back_with_a_warning_when_disabled(monkeypatch):
    monkeypatch.setenv("SPECULANT_CPU_KERNEL", "0")
    cpu_kernel_build.load_kernel.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="SPECULANT_CPU_KERNEL=0"):
            backend = CpuKernelAttentionBackend()
        spans = [PagedSpan([0], 0, [1, 2], [1])]
        meta = backend.build_metadata(SpanTensors.build(spans, BLOCK_SIZE, torch.device("cpu")))
        cache = torch.zeros(2, BLOCK_SIZE, 1, HEAD_DIM)
        q, k, v = torch.randn(2, 2, HEAD_DIM), torch.randn(2, 1, HEAD_DIM), torch.randn(2, 1, HEAD_DIM)
        out = backend.forward(q, k, v, cache, cache.clone(), meta, 0.5)
        assert torch.allclose(out, reference(q, k, v, 0.5), atol=1e-6)
    finally:
        cpu_kernel_build.load_kernel.cache_clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "fused-slice"])
def test_cpu_kernel_kv_write_is_the_index_assignment_bit_for_bit(dtype, strided, monkeypatch):
    require_kernel()
    backend = CpuKernelAttentionBackend()
    calls = []
    lib_write = backend._lib.speculant_write_kv
    monkeypatch.setattr(backend, "_lib", types.SimpleNamespace(
        speculant_write_kv=lambda *args: calls.append(1) or lib_write(*args)))
    gen = torch.Generator().manual_seed(3)
    t, kv_heads = 7, 2
    fused = torch.randn(t, 3 * kv_heads * HEAD_DIM, generator=gen).to(dtype)
    key = fused[:, :kv_heads * HEAD_DIM].view(t, kv_heads, HEAD_DIM) if strided else \
        fused[:, :kv_heads * HEAD_DIM].contiguous().view(t, kv_heads, HEAD_DIM)
    value = fused[:, kv_heads * HEAD_DIM: 2 * kv_heads * HEAD_DIM].view(t, kv_heads, HEAD_DIM)
    slots = torch.randperm(6 * BLOCK_SIZE, generator=gen)[:t]
    caches = [torch.randn(6, BLOCK_SIZE, kv_heads, HEAD_DIM, generator=gen).to(dtype) for _ in range(2)]
    expected = [c.clone() for c in caches]
    TorchAttentionBackend().write_kv(key, value, *expected, slots)
    backend.write_kv(key, value, *caches, slots)
    assert calls == [1], "the C copy should have run for these layouts"
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(caches, expected))


def test_cpu_kernel_kv_write_rejects_a_slot_outside_the_cache_and_writes_nothing():
    require_kernel()
    backend = CpuKernelAttentionBackend()
    caches = [torch.zeros(2, BLOCK_SIZE, 1, HEAD_DIM) for _ in range(2)]
    key = torch.ones(2, 1, HEAD_DIM)
    with pytest.raises(IndexError, match=r"slot_mapping lies outside the cache's 8 slots"):
        backend.write_kv(key, key, *caches, torch.tensor([3, 2 * BLOCK_SIZE]))
    assert not any(c.any() for c in caches)


def _cpu_has_avx512_bf16() -> bool:
    """Every feature the bfloat16 paths need, as /proc/cpuinfo lists them (not our own cpuid check)."""
    return set(CPU_FEATURE_NAMES) <= cpu_flags()  # the AVX512-BF16 path's features


@pytest.fixture
def kernel_path():
    """Force the C kernel's bfloat16 score path for one test, then restore cpuid detection."""
    require_kernel()
    lib = load_kernel()
    yield lambda name: set_kernel_isa(lib, name)
    set_kernel_isa(lib, None)


def test_the_kernel_picks_the_bf16_dot_path_where_the_cpu_has_it(kernel_path):
    lib = load_kernel()
    assert kernel_isa(lib) == detected_isa(lib)
    if _cpu_has_avx512_bf16():
        assert kernel_isa(lib) == "avx512_bf16"
    assert kernel_path("scalar") == "scalar"
    if not _cpu_has_avx512_bf16():
        with pytest.raises(RuntimeError, match="'avx512_bf16': this CPU does not run it"):
            kernel_path("avx512_bf16")


@pytest.mark.parametrize("path", ["scalar", "avx2", "avx512_bf16"])
@pytest.mark.parametrize("head_dim", [8, 16, 40, 64, 128, 264], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["mha", "gqa2", "mqa1"])
@pytest.mark.parametrize("block_size", [1, 4, 16], ids=lambda b: f"block{b}")
@pytest.mark.parametrize("input_layout", INPUT_LAYOUTS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_both_bf16_kernel_paths_round_once_to_nearest(kernel_path, path, layout, input_layout, block_size,
                                                      num_kv_heads, head_dim):
    """Each instruction path of the kernel stays within half an ulp of float64
    attention over the stored bfloat16 inputs; head dims below, at a multiple
    of and between multiples of VDPBF16PS's 32 lanes (the masked tail), and past the vectorised
    task's 256 (the portable task then runs)."""
    if path == "avx512_bf16" and not _cpu_has_avx512_bf16():
        require_bf16_paths()
    if path not in runnable_isas(load_kernel()):
        pytest.skip(f"this CPU does not run the {path} path")
    assert kernel_path(path) == path
    scale = head_dim ** -0.5
    out, spans_def, full = run_backend(CpuKernelAttentionBackend, layout, input_layout, block_size, num_kv_heads,
                                       scale, torch.bfloat16, head_dim)
    eps = torch.finfo(torch.bfloat16).eps
    row = 0
    for name, start, end in spans_def:
        want = reference(*(x.double() for x in full[name]), scale)[start:end]
        got = out[row: row + end - start].double()
        over = ((got - want).abs() - (0.5 * eps * want.abs() + 1e-5)).max().item()
        assert over <= 0, f"{path}: span {name}[{start}:{end}]: error {over:.3e} over half an ulp"
        row += end - start
