"""Tree attention in every backend against a dense reference.

Hypothesis draws token trees (parent indices, node 0 the root = the decode's
last token) over a cached prefix, next to causal spans in the same forward (a
decode, a verify chain, and a prefill long enough to be cut into kernel
pieces). Each tree node sits in slot ``start + i`` at position ``start +
depth``; the reference computes, in float64 from the stored K/V, each node's
attention over the prefix and its own ancestors only, and each causal row
over its positions 0..p. The backends: the torch reference, the C kernel on
each instruction path this CPU runs (float32 and bfloat16), and the Triton
kernel under its interpreter (``test_triton_tree_mask``).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_marks import require_kernel

from speculant.interfaces.span_tensors import PagedSpan, SpanTensors
from speculant.model.attention.cpu_kernel import MAX_KERNEL_QUERY, CpuKernelAttentionBackend
from speculant.model.attention.torch_ref import TorchAttentionBackend
from speculant.model.kernels.abi import runnable_isas
from speculant.model.kernels.build import load_kernel, set_kernel_isa

pytestmark = pytest.mark.usefixtures("one_thread")
HEAD_DIM = 16
NUM_HEADS = 4
SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=False, max_examples=25,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def ancestor_mask(parents: list[int]) -> list[list[bool]]:
    """Row i: node i and its ancestors (``parents[i] < i``, -1 for a root), from ancestor sets."""
    ancestors: list[set[int]] = []
    for i, p in enumerate(parents):
        ancestors.append({i} | (ancestors[p] if p >= 0 else set()))
    return [[j in ancestors[i] for j in range(len(parents))] for i in range(len(parents))]


def depths(parents: list[int]) -> list[int]:
    out: list[int] = []
    for p in parents:
        out.append(0 if p < 0 else out[p] + 1)
    return out


@st.composite
def trees(draw, max_nodes: int = 24) -> list[int]:
    """Parent indices of a tree rooted at node 0 (every later node has an earlier parent)."""
    n = draw(st.integers(1, max_nodes))
    return [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]


@st.composite
def batches(draw) -> dict:
    num_trees = draw(st.integers(1, 3))
    return {
        "trees": [(draw(st.integers(1, 20)), draw(trees())) for _ in range(num_trees)],  # (prefix, parents)
        "block_size": draw(st.sampled_from([1, 4, 16])),
        "num_kv_heads": draw(st.sampled_from([4, 2, 1])),
        "causal": draw(st.booleans()),  # add a decode, a verify chain and a long prefill chunk
        "seed": draw(st.integers(0, 2 ** 16)),
    }


class Case:
    """One forward's spans over a garbage-filled pool, with the stored K/V each span sees."""

    def __init__(self, spec: dict, dtype: torch.dtype) -> None:
        gen = torch.Generator().manual_seed(spec["seed"])
        self.block_size, self.num_kv_heads = spec["block_size"], spec["num_kv_heads"]
        seqs: list[tuple[int, list[int] | None, int]] = [(prefix, parents, len(parents))
                                                          for prefix, parents in spec["trees"]]
        if spec["causal"]:
            seqs += [(9, None, 1), (5, None, 4), (3, None, MAX_KERNEL_QUERY + 7)]
        blocks = [-(-(prefix + n) // self.block_size) for prefix, _, n in seqs]
        order = torch.randperm(sum(blocks) + 2, generator=gen).tolist()
        shape = (len(order), self.block_size, self.num_kv_heads, HEAD_DIM)
        self.key_cache = torch.randn(shape, generator=gen).to(dtype)
        self.value_cache = torch.randn(shape, generator=gen).to(dtype)
        self.spans: list[PagedSpan] = []
        self.visible: list[list[list[int]]] = []  # per span, per row: the slots (sequence positions) it sees
        at = 0
        for (prefix, parents, n), count in zip(seqs, blocks):
            table, at = order[at: at + count], at + count
            ids = list(range(n))
            if parents is None:
                self.spans.append(PagedSpan(table, prefix, ids, ids))
                self.visible.append([list(range(prefix + i + 1)) for i in range(n)])
            else:
                mask = ancestor_mask(parents)
                self.spans.append(PagedSpan(table, prefix, ids, ids, [prefix + d for d in depths(parents)], mask))
                self.visible.append([list(range(prefix)) + [prefix + j for j in range(n) if mask[i][j]]
                                     for i in range(n)])
        total = sum(s.num_tokens for s in self.spans)
        self.query = torch.randn(total, NUM_HEADS, HEAD_DIM, generator=gen).to(dtype)
        self.key = torch.randn(total, self.num_kv_heads, HEAD_DIM, generator=gen).to(dtype)
        self.value = torch.randn(total, self.num_kv_heads, HEAD_DIM, generator=gen).to(dtype)
        self.tensors = SpanTensors.build(self.spans, self.block_size, torch.device("cpu"))

    def run(self, backend) -> torch.Tensor:  # -> [T, H, D]
        return backend.forward(self.query, self.key, self.value, self.key_cache, self.value_cache,
                               backend.build_metadata(self.tensors), HEAD_DIM ** -0.5)

    def reference(self) -> torch.Tensor:  # -> [T, H, D] float64, after a forward wrote the K/V
        group = NUM_HEADS // self.num_kv_heads
        out = torch.empty(self.query.shape, dtype=torch.float64)
        row = 0
        for span, rows in zip(self.spans, self.visible):
            for i, seen in enumerate(rows):
                slots = torch.tensor([span.block_table[p // self.block_size] * self.block_size + p % self.block_size
                                      for p in seen])
                k = self.key_cache.flatten(0, 1)[slots].double().repeat_interleave(group, dim=1)  # [L, H, D]
                v = self.value_cache.flatten(0, 1)[slots].double().repeat_interleave(group, dim=1)
                q = self.query[row + i].double()  # [H, D]
                probs = (torch.einsum("hd,lhd->hl", q, k) * HEAD_DIM ** -0.5).softmax(-1)
                out[row + i] = torch.einsum("hl,lhd->hd", probs, v)
            row += span.num_tokens
        return out


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    if dtype == torch.float32:
        err = (got.double() - want).abs().max().item()
        assert err <= 2e-5, f"{what}: error {err:.3e}"
        return
    eps = torch.finfo(dtype).eps  # one rounding of the float32 result: half an ulp (plus float32 noise)
    over = ((got.double() - want).abs() - (0.5 * eps * want.abs() + 1e-5)).max().item()
    assert over <= 0, f"{what}: error {over:.3e} over half an ulp"


@settings(**SETTINGS)
@given(spec=batches())
def test_torch_reference_tree_mask(spec):
    case = Case(spec, torch.float64)
    got = case.run(TorchAttentionBackend())
    err = (got - case.reference()).abs().max().item()
    assert err <= 1e-12, err


@pytest.fixture(scope="module")
def kernel_paths():
    require_kernel()
    lib = load_kernel()
    paths = [p for p in ("scalar", "avx2", "avx512_bf16") if p in runnable_isas(lib)]
    yield lambda name: set_kernel_isa(lib, name)
    set_kernel_isa(lib, None)
    assert paths


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("path", ["scalar", "avx2", "avx512_bf16"])
@settings(**SETTINGS)
@given(spec=batches())
def test_cpu_kernel_tree_mask(kernel_paths, path, dtype, spec):
    if path not in runnable_isas(load_kernel()):
        pytest.skip(f"this CPU does not run the {path} path")
    assert kernel_paths(path) == path
    case = Case(spec, dtype)
    backend = CpuKernelAttentionBackend()
    got = case.run(backend)
    assert_close(got, case.reference(), dtype, f"{path} {dtype}")


def test_tree_spans_are_never_cut_into_pieces(kernel_paths):
    """A tree longer than a kernel piece stays one piece; a causal chunk beside it is cut."""
    spec = {"trees": [(4, [-1] + list(range(MAX_KERNEL_QUERY + 3)))], "block_size": 4, "num_kv_heads": 2,
            "causal": True, "seed": 1}
    case = Case(spec, torch.float32)
    metadata = CpuKernelAttentionBackend().build_metadata(case.tensors)
    lens = metadata.pieces.cu_query_lens.diff().tolist()
    assert lens[0] == MAX_KERNEL_QUERY + 4 and metadata.pieces.mask_offsets.tolist()[0] == 0
    assert max(lens[1:]) == MAX_KERNEL_QUERY and set(metadata.pieces.mask_offsets.tolist()[1:]) == {-1}


def test_a_chain_as_a_tree_gives_the_causal_bits(kernel_paths):
    """A tree of one child per node is the causal span: the kernel gives the same bits either way."""
    for path in ("scalar", "avx2", "avx512_bf16"):
        if path not in runnable_isas(load_kernel()):
            continue
        kernel_paths(path)
        chain = Case({"trees": [(7, [-1, 0, 1, 2, 3])], "block_size": 4, "num_kv_heads": 2, "causal": True,
                      "seed": 3}, torch.bfloat16)
        tree_out = chain.run(CpuKernelAttentionBackend())
        causal = chain.spans[0]
        chain.spans[0] = PagedSpan(causal.block_table, causal.start, causal.token_ids, causal.logits_at)
        chain.tensors = SpanTensors.build(chain.spans, chain.block_size, torch.device("cpu"))
        assert chain.tensors.mask_offsets is None
        assert torch.equal(chain.run(CpuKernelAttentionBackend()), tree_out), path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("path", ["scalar", "avx2", "avx512_bf16"])
@settings(**{**SETTINGS, "max_examples": 400})
@given(prefix=st.integers(1, 70), parents=trees(), block_size=st.sampled_from([1, 4, 16]),
       num_kv_heads=st.sampled_from([4, 2, 1]), seed=st.integers(0, 2 ** 16))
def test_a_tree_node_gives_the_bits_of_the_decode_of_its_path(kernel_paths, path, dtype, prefix, parents,
                                                                block_size, num_kv_heads, seed):
    """Greedy speculation is exact only if each tree node's attention is the decode's at that position:
    the node's keys (prefix, ancestors, itself) laid out contiguously as a plain decode sees them, and
    the kernel gives the same bits, whatever siblings sat between them in the tree's slots."""
    if path not in runnable_isas(load_kernel()):
        pytest.skip(f"this CPU does not run the {path} path")
    kernel_paths(path)
    assert_nodes_give_their_paths_decode(CpuKernelAttentionBackend, f"{path} {dtype}", dtype, prefix, parents,
                                         block_size, num_kv_heads, seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@settings(**{**SETTINGS, "max_examples": 60})
@given(prefix=st.integers(1, 70), parents=trees(), block_size=st.sampled_from([1, 4, 16]),
       num_kv_heads=st.sampled_from([4, 2, 1]), seed=st.integers(0, 2 ** 16))
def test_a_torch_reference_tree_node_gives_the_bits_of_the_decode_of_its_path(dtype, prefix, parents, block_size,
                                                                              num_kv_heads, seed):
    """The same exactness for the torch reference backend (the CPU's fallback and the GPU's without flash-attn)."""
    assert_nodes_give_their_paths_decode(TorchAttentionBackend, f"torch_ref {dtype}", dtype, prefix, parents,
                                         block_size, num_kv_heads, seed)


def assert_nodes_give_their_paths_decode(backend_class, what: str, dtype: torch.dtype, prefix: int,
                                         parents: list[int], block_size: int, num_kv_heads: int, seed: int) -> None:
    """Every node of a one-tree batch run by ``backend_class`` equals, bit for bit, a
    decode by the same backend over the node's path laid out contiguously."""
    case = Case({"trees": [(prefix, parents)], "block_size": block_size, "num_kv_heads": num_kv_heads,
                 "causal": False, "seed": seed}, dtype)
    tree_out = case.run(backend_class())  # writes the tree's K/V into its slots
    span, bs = case.spans[0], block_size
    tree_keys, tree_values = case.key_cache.flatten(0, 1), case.value_cache.flatten(0, 1)
    for i, seen in enumerate(case.visible[0]):  # seen: the slots node i sees, itself last
        blocks = -(-len(seen) // bs)
        key_cache = torch.zeros((blocks, bs, num_kv_heads, HEAD_DIM), dtype=dtype)
        value_cache = torch.zeros_like(key_cache)
        for pos, p in enumerate(seen[:-1]):  # the path's keys at consecutive positions
            slot = span.block_table[p // bs] * bs + p % bs
            key_cache.flatten(0, 1)[pos] = tree_keys[slot]
            value_cache.flatten(0, 1)[pos] = tree_values[slot]
        backend = backend_class()
        decode = SpanTensors.build([PagedSpan(list(range(blocks)), len(seen) - 1, [0], [0])], bs,
                                   torch.device("cpu"))
        got = backend.forward(case.query[i: i + 1], case.key[i: i + 1], case.value[i: i + 1], key_cache,
                              value_cache, backend.build_metadata(decode), HEAD_DIM ** -0.5)
        assert torch.equal(got[0], tree_out[i]), f"{what}: node {i} of {parents} differs from its decode"


@pytest.mark.parametrize("span, message", [
    (PagedSpan([0, 1], 2, [5, 6], [1], positions=[2, 4]), r"positions\[1\] = 4 lies outside 2..3"),
    (PagedSpan([0, 1], 2, [5, 6], [1], positions=[2]), "positions has 1 entries for 2 tokens"),
    (PagedSpan([0, 1], 2, [5, 6], [1], ancestor_mask=[[True, True], [True, True]]),
     r"ancestor_mask\[0\] sees a later token: lay the tree out parents first"),
    (PagedSpan([0, 1], 2, [5, 6], [1], ancestor_mask=[[True, False], [True, False]]),
     r"ancestor_mask\[1\]\[1\] is false: every token sees itself"),
    (PagedSpan([0, 1], 2, [5, 6], [1], ancestor_mask=[[True]]), "ancestor_mask must be 2 x 2 for 2 tokens"),
])
def test_malformed_tree_spans_are_refused_with_the_reason(span, message):
    with pytest.raises(ValueError, match="query span 0 cannot run: PagedSpan." + message):
        SpanTensors.build([span], 4, torch.device("cpu"))


@pytest.fixture(scope="module")
def triton_interpreted():
    from triton_interpreter import use_interpreted_kernels

    with use_interpreted_kernels():
        yield


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@settings(**{**SETTINGS, "max_examples": 10})
@given(spec=batches())
def test_triton_tree_mask(triton_interpreted, dtype, spec):
    """The Triton kernel under the interpreter (which truncates float32 to bfloat16: one ulp there)."""
    from speculant.model.attention.triton_backend import TritonAttentionBackend

    case = Case(spec, dtype)
    got = case.run(TritonAttentionBackend())
    want = case.reference()
    if dtype == torch.float32:
        assert_close(got, want, dtype, "triton")
    else:
        over = ((got.double() - want).abs() - (torch.finfo(dtype).eps * want.abs() + 1e-5)).max().item()
        assert over <= 0, f"triton bf16: error {over:.3e} over one ulp"
