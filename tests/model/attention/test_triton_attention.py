"""The ``triton`` attention backend's kernels, run on the CPU by Triton's
interpreter (``triton_interpreter``), against the torch reference backend.

Each hypothesis case draws one mixed batch the way the C kernel's test lays
them out, and wider: fresh prefills, prefill chunks over a cached prefix,
decodes, multi-token verify runs and batch-expansion siblings (single-token
spans sharing one block table, out of order), 1-4 sequences in a garbage-filled
pool with shuffled block tables; block sizes 1-16 (3 too: any size works),
MHA/GQA/MQA with groups of 1-4 (3: not a power of two), head sizes 8-32 (8
and 24: padded tiles), float32/float16/bfloat16, queries contiguous,
transposed or sliced from one fused projection. The reference is the torch
backend in float64 over the same stored values; the kernel computes float32
and rounds once, so 16-bit outputs must be within half an ulp (plus float32
noise; bfloat16: one ulp, see ``ULPS``) and float32 outputs within float32 noise. The caches must hold exactly
the new tokens' K/V, and the garbage around them untouched.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from speculant.interfaces.span_tensors import PagedSpan, SpanTensors
from speculant.model.attention.torch_ref import TorchAttentionBackend
from triton_interpreter import interpreted_kernels, use_interpreted_kernels

interpreted_kernels()  # skips this module without triton

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FP32_TOLERANCE = 2e-5
ULPS = {torch.float16: 0.5, torch.bfloat16: 1.0}
"""Output rounding allowed: half an ulp (rounded to nearest), but the interpreter
truncates float32 to bfloat16 (the GPU rounds to nearest), so one ulp there."""


@pytest.fixture(scope="module", autouse=True)
def launch():
    with use_interpreted_kernels() as launch:
        yield launch


COMMON = dict(deadline=None, derandomize=True, database=None, print_blob=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def sequence(draw) -> tuple[int, list[tuple[int, int]]]:
    """One sequence: (length, its spans as (start, end) query positions)."""
    kind = draw(st.sampled_from(["fresh", "chunk", "decode", "verify", "siblings"]))
    if kind == "fresh":
        n = draw(st.integers(1, 20))
        return n, [(0, n)]
    if kind == "siblings":  # batch expansion: single-token spans over one table, shuffled
        n, k = draw(st.integers(3, 20)), draw(st.integers(2, 3))
        return n, draw(st.permutations([(p, p + 1) for p in range(n - k, n)]))
    context = draw(st.integers(1 if kind != "decode" else 0, 20))
    q = {"chunk": draw(st.integers(3, 20)), "decode": 1, "verify": draw(st.integers(2, 5))}[kind]
    return context + q, [(context, context + q)]


@st.composite
def batches(draw) -> dict:
    return dict(
        seqs=draw(st.lists(sequence(), min_size=1, max_size=4)),
        block_size=draw(st.sampled_from([1, 2, 3, 4, 8, 16])),
        num_kv_heads=draw(st.sampled_from([1, 2])),
        group=draw(st.sampled_from([1, 2, 3, 4])),
        head_dim=draw(st.sampled_from([8, 16, 24, 32])),
        dtype=draw(st.sampled_from(DTYPES)),
        layout=draw(st.sampled_from(["contiguous", "transposed", "fused"])),
        scale=draw(st.sampled_from([None, 1.0, 0.3])),
        seed=draw(st.integers(0, 2**16)),
    )


def in_layout(layout: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """q [T, H, D], k/v [T, H_kv, D] with the same values in the memory layout a model hands over."""
    if layout == "transposed":  # [1, H, T, D] from the model, transposed back by the seam
        return tuple(x.transpose(0, 1).contiguous().transpose(0, 1) for x in (q, k, v))
    if layout == "fused":  # slices of one q/k/v projection [T, F]
        t, hq, hk = q.shape[0], q[0].numel(), k[0].numel()
        fused = torch.cat([x.reshape(t, -1) for x in (q, k, v)], dim=1)
        return fused[:, :hq].view(q.shape), fused[:, hq: hq + hk].view(k.shape), fused[:, hq + hk:].view(v.shape)
    return q, k, v


def build_case(case: dict):
    """(spans, query, key, value, key_cache, value_cache, scale) for one drawn batch;
    the caches hold garbage and every sequence's prefix before its first span."""
    gen = torch.Generator().manual_seed(case["seed"])
    bs, dtype, h_kv, d = case["block_size"], case["dtype"], case["num_kv_heads"], case["head_dim"]
    seqs = case["seqs"]
    needed = [-(-n // bs) for n, _ in seqs]
    num_blocks = sum(needed) + 2
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [order[sum(needed[:i]): sum(needed[: i + 1])] for i in range(len(seqs))]

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (scale * torch.randn(*shape, generator=gen, dtype=torch.float64)).to(dtype)

    key_cache, value_cache = randn(num_blocks, bs, h_kv, d, scale=100), randn(num_blocks, bs, h_kv, d, scale=100)
    spans, qs, ks, vs = [], [], [], []
    for (length, seq_spans), table in zip(seqs, tables):
        q, k, v = randn(length, h_kv * case["group"], d), randn(length, h_kv, d), randn(length, h_kv, d)
        for pos in range(min(start for start, _ in seq_spans)):  # the cached prefix
            slot = (table[pos // bs], pos % bs)
            key_cache[slot], value_cache[slot] = k[pos], v[pos]
        for start, end in seq_spans:
            spans.append(PagedSpan(list(table), start, [0] * (end - start), []))
            qs.append(q[start:end]), ks.append(k[start:end]), vs.append(v[start:end])
    query, key, value = in_layout(case["layout"], torch.cat(qs), torch.cat(ks), torch.cat(vs))
    scale = d ** -0.5 if case["scale"] is None else case["scale"]
    return spans, query, key, value, key_cache, value_cache, scale


def check_against_reference(case: dict, backend) -> None:
    spans, query, key, value, key_cache, value_cache, scale = build_case(case)
    ref_caches = key_cache.double(), value_cache.double()
    st_ = SpanTensors.build(spans, case["block_size"], torch.device("cpu"))
    out = backend.forward(query, key, value, key_cache, value_cache, backend.build_metadata(st_), scale)
    ref = TorchAttentionBackend()
    want = ref.forward(query.double(), key.double(), value.double(), *ref_caches, ref.build_metadata(st_), scale)
    assert out.shape == query.shape and out.dtype == query.dtype
    # the new K/V landed in their slots, the garbage around them is untouched
    assert torch.equal(key_cache, ref_caches[0].to(case["dtype"]))
    assert torch.equal(value_cache, ref_caches[1].to(case["dtype"]))
    err = (out.double() - want).abs()
    if case["dtype"] == torch.float32:
        assert err.max().item() <= FP32_TOLERANCE, f"max error {err.max().item():.3e}"
    else:  # float32 arithmetic rounded once: within half an ulp of the exact value (+ float32 noise)
        over = err - (ULPS[case["dtype"]] * torch.finfo(case["dtype"]).eps * want.abs() + 1e-5)
        assert over.max().item() <= 0, f"error {over.max().item():.3e} over {ULPS[case['dtype']]} ulp"


@settings(max_examples=100, **COMMON)
@given(case=batches())
def test_kernel_matches_the_torch_reference(case):
    from speculant.model.attention.triton_backend import TritonAttentionBackend

    for key in ("block_size", "num_kv_heads", "group", "head_dim", "dtype", "layout"):
        event(f"{key}={case[key]}")
    kinds = {"decode" if s == [(n - 1, n)] else "fresh" if s == [(0, n)] else "siblings" if len(s) > 1
             else "verify" if s[0][1] - s[0][0] <= 5 else "chunk" for n, s in case["seqs"]}
    event(f"spans: {len(case['seqs'])} sequences, {'+'.join(sorted(kinds))}")
    check_against_reference(case, TritonAttentionBackend())


MIXED = [(17, [(9, 17)]), (6, [(0, 6)]), (10, [(9, 10)]), (12, [(8, 12)]), (11, [(10, 11), (8, 9), (9, 10)])]
"""A prefill chunk over a cached prefix, a fresh prefill, a decode, a verify run of 4 and three siblings."""


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group", [1, 3, 4], ids=lambda g: f"group{g}")
@pytest.mark.parametrize("block_size", [1, 3, 4, 16], ids=lambda b: f"block{b}")
def test_every_span_kind_in_one_batch(block_size, group, dtype):
    """The grid hypothesis may leave thin: every span kind at once, per block size, group and dtype."""
    from speculant.model.attention.triton_backend import TritonAttentionBackend

    layout = ["contiguous", "transposed", "fused"][(block_size + group) % 3]
    case = dict(seqs=MIXED, block_size=block_size, num_kv_heads=2, group=group, head_dim=24 if group == 3 else 32,
                dtype=dtype, layout=layout, scale=None, seed=block_size * group)
    check_against_reference(case, TritonAttentionBackend())


@pytest.mark.parametrize("group", [1, 4])
def test_bfloat16_matches_float32_reference_within_bfloat16_tolerance(group):
    """bfloat16 storage through the kernel against float32 attention: a
    bfloat16 ``tl.dot`` under the interpreter multiplies raw bit patterns
    (errors of order 1e4), which this would catch."""
    from speculant.model.attention.triton_backend import TritonAttentionBackend

    case = dict(seqs=[(13, [(5, 13)]), (9, [(8, 9)]), (7, [(0, 7)]), (12, [(9, 12)])], block_size=4,
                num_kv_heads=2, group=group, head_dim=32, dtype=torch.bfloat16, layout="contiguous", scale=None,
                seed=7)
    spans, query, key, value, key_cache, value_cache, scale = build_case(case)
    st_ = SpanTensors.build(spans, 4, torch.device("cpu"))
    ref = TorchAttentionBackend()
    want = ref.forward(query.float(), key.float(), value.float(), key_cache.float(), value_cache.float(),
                       ref.build_metadata(st_), scale)
    backend = TritonAttentionBackend()
    out = backend.forward(query, key, value, key_cache, value_cache, backend.build_metadata(st_), scale)
    assert out.dtype == torch.bfloat16
    err = (out.float() - want).abs().max().item()
    assert 0 < err <= torch.finfo(torch.bfloat16).eps * max(1.0, want.abs().max().item()), err


def test_tile_sizes_respect_the_compiler(launch):
    """Powers of two, at least 16 (tl.dot), one token's grouped heads per tile at least."""
    for group, max_q, d, interpreted in itertools.product((1, 2, 3, 7, 8, 32, 64), (1, 4, 17, 512),
                                                          (8, 24, 64, 80, 128, 256), (False, True)):
        t = launch.tile_sizes(group, max_q, d, interpreted)
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_D"):
            assert t[name] >= 16 and t[name] & (t[name] - 1) == 0, (group, max_q, d, t)
        assert t["BLOCK_Q"] >= 1 and t["BLOCK_Q"] * group <= t["BLOCK_M"] and t["BLOCK_D"] >= d


def test_tree_mask_arguments_go_together(launch):
    cache = torch.zeros(2, 4, 1, 16)
    one = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="mask_offsets and tree_masks go together"):
        launch.paged_attention(torch.zeros(1, 1, 16), cache, cache, one, one[1:], one[None, :1], max_query_len=1,
                               scaling=1.0, mask_offsets=torch.tensor([0]))


def test_float64_is_refused_with_the_fix(launch):
    cache = torch.zeros(2, 4, 1, 16, dtype=torch.float64)
    one = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="float64, which the kernels do not compute.*set model.dtype"):
        launch.paged_attention(torch.zeros(1, 1, 16, dtype=torch.float64), cache, cache, one, one[1:],
                               one[None, :1], max_query_len=1, scaling=1.0)
