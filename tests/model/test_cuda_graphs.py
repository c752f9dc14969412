"""CUDA-graph bucketing, padding and dispatch (speculant/model/cuda_graphs.py),
on the CPU with capture stubbed out: a ``StubGraph`` replay re-runs the
captured forward on the refilled static buffers, so everything but the
CUDA graph itself runs as on a GPU (padding span, empty spans, trash block,
per-bucket tile host ints, the eager LM head on kept rows).

A graphed runner and an eager one get the same forwards; their logits,
hidden states and the real KV blocks must agree.
"""

from __future__ import annotations

import logging

import pytest
import torch

from speculant.config.models import CacheConfig, ModelConfig
from speculant.interfaces.span_tensors import PagedSpan
from speculant.model import cuda_graphs
from speculant.model.attention.torch_ref import TorchAttentionBackend
from speculant.model.attention.triton_backend import TritonAttentionBackend
from speculant.model.cuda_graphs import GraphLimits, StubGraph, buckets, query_cap
from speculant.model.graph_buffers import host_refill
from speculant.model.runner import ModelRunner

BS = 4


def stub_resolve(setting, device, backend):
    return "model.cuda_graphs = 'off'" if setting == "off" else (StubGraph, None)


class FailingGraph(StubGraph):
    def capture(self, fn):
        raise RuntimeError("operation not permitted when stream is capturing")


LIMITS = GraphLimits(max_tokens=16, max_spans=3)  # buckets 1 .. 16, 4 span slots


def make_runner(path, setting: str, limits=LIMITS) -> ModelRunner:
    return ModelRunner(ModelConfig(path=str(path), cuda_graphs=setting), CacheConfig(num_blocks=64, block_size=BS),
                       TorchAttentionBackend(), graph_limits=limits)


@pytest.fixture(scope="module")
def runners(llama_dir):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cuda_graphs, "resolve", stub_resolve)
        graphed, eager = make_runner(llama_dir, "auto"), make_runner(llama_dir, "off")
    assert graphed.graphs is not None and eager.graphs is None
    return graphed, eager


def test_buckets_and_query_caps():
    assert buckets(1) == [1]
    assert buckets(24) == [1, 2, 4, 8, 16, 32]
    assert buckets(10_000)[-1] == cuda_graphs.MAX_BUCKET
    assert [query_cap(q, 32) for q in (1, 2, 3, 5, 16, 17)] == [1, 2, 4, 8, 16, 32]
    assert query_cap(3, 2) == 2  # never above the bucket


def test_host_refill_pads_with_a_trash_span_and_empty_spans():
    spans = [PagedSpan([3, 4], 5, [7, 8], [1]), PagedSpan([9], 0, [1, 2, 3], [2])]
    r = host_refill(spans, BS, bucket=8, num_span_slots=4, trash_slot=40)
    ids, pos, slots, seq_index = r.tokens.tolist()
    assert ids == [7, 8, 1, 2, 3, 0, 0, 0] and pos == [5, 6, 0, 1, 2, 0, 0, 0]
    assert slots == [17, 18, 36, 37, 38, 40, 40, 40]  # positions 5, 6 in block 4; padding: the trash block's slot
    assert seq_index == [0, 0, 1, 1, 1, 2, 2, 2]
    qlens, cu, starts, seq_lens = r.spans.tolist()
    assert qlens[:4] == [2, 3, 3, 0] and cu == [0, 2, 5, 8, 8]  # padding span of 3, one empty span
    assert starts[:4] == [5, 0, 0, 0] and seq_lens[:4] == [7, 3, 0, 0]  # padding sees no key
    assert r.tables.tolist() == [[3, 4], [9, 0]]


def span(blocks, start, ids, every=False):
    return PagedSpan(blocks, start, ids, list(range(len(ids))) if every else [len(ids) - 1])


def check_same(graphed, eager, spans, want_hidden=True):
    a, b = graphed.forward(spans, want_hidden), eager.forward(spans, want_hidden)
    torch.testing.assert_close(a.logits, b.logits, rtol=1e-5, atol=1e-5)
    if want_hidden:
        torch.testing.assert_close(a.hidden_states, b.hidden_states, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.token_hidden, b.token_hidden, rtol=1e-5, atol=1e-5)
        assert a.token_hidden.shape[0] == sum(s.num_tokens for s in spans)
    for ka, kb in zip(graphed.key_caches, eager.key_caches):  # the real blocks agree; the trash one may not
        torch.testing.assert_close(ka[: graphed.num_blocks], kb[: eager.num_blocks], rtol=1e-5, atol=1e-5)


def test_graphed_forwards_equal_eager_ones_at_below_and_above_buckets(runners):
    graphed, eager = runners
    g = graphed.graphs
    assert g is not None and g.buckets == [1, 2, 4, 8, 16] and g.num_span_slots == 4
    a, b, c, d = [0, 1, 10, 11], [2, 12], [3, 4], [5, 6, 7, 8, 9]  # four sequences' block tables
    check_same(graphed, eager, [span(a, 0, list(range(10, 15)))])  # 5 tokens: bucket 8
    check_same(graphed, eager, [span(b, 0, list(range(20, 24)))])  # 4: exactly bucket 4
    check_same(graphed, eager, [span(a, 5, [30])], want_hidden=False)  # a decode: bucket 1
    # a mix: a decode, a 3-token verify run, a 4-token prefill chunk: 8 tokens, exactly bucket 8
    check_same(graphed, eager, [span(a, 6, [31]), span(b, 4, [32, 33, 34], every=True),
                                span(c, 0, [40, 41, 42, 43])])
    # below a bucket: 3 tokens in 2 spans -> bucket 4
    check_same(graphed, eager, [span(a, 7, [35]), span(c, 4, [44, 45], every=True)])
    assert g.replays == 5 and g.eager_runs == 0
    assert set(g.graphs) == {(8, 8), (4, 4), (1, 1), (8, 4), (4, 2)}
    # above the largest bucket (17 tokens) and more spans than slots: eager
    check_same(graphed, eager, [span(d, 0, list(range(50, 67)))])
    check_same(graphed, eager, [span(a, 8, [36]), span(b, 7, [37]), span(c, 6, [46]), span(d, 17, [60])])
    assert g.replays == 5 and g.eager_runs == 2
    check_same(graphed, eager, [span(a, 9, [38])])  # a replay of a captured key
    assert g.replays == 6 and len(g.graphs) == 5


def test_a_failed_capture_runs_that_key_eagerly_and_says_why(llama_dir, monkeypatch, caplog):
    monkeypatch.setattr(cuda_graphs, "resolve", lambda *a: (FailingGraph, None))
    graphed = make_runner(llama_dir, "auto")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cuda_graphs, "resolve", stub_resolve)
        eager = make_runner(llama_dir, "off")
    with caplog.at_level(logging.WARNING, logger="speculant.model.cuda_graphs"):
        check_same(graphed, eager, [span([0], 0, [1, 2, 3])])
        check_same(graphed, eager, [span([0], 3, [4])])
        check_same(graphed, eager, [span([0, 1], 4, [5, 6])])
    g = graphed.graphs
    assert g is not None and g.replays == 0 and g.eager_runs == 3 and set(g.failed) == {(4, 4), (1, 1), (2, 2)}
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3 and all("running those forwards eagerly" in w and "stream is capturing" in w
                                      for w in warnings)
    check_same(graphed, eager, [span([0, 1], 6, [7])])  # a failed key is not captured again
    assert len([r for r in caplog.records]) == 3 and g.eager_runs == 4


def test_auto_resolution_says_why_forwards_run_eagerly(monkeypatch):
    cuda = torch.device("cuda")
    assert "'off'" in cuda_graphs.resolve("off", cuda, TritonAttentionBackend)
    assert "CUDA only" in cuda_graphs.resolve("auto", torch.device("cpu"), TritonAttentionBackend)
    reason = cuda_graphs.resolve("auto", cuda, TorchAttentionBackend)
    assert "'torch' is not graph-capturable" in reason and "'triton'" in reason
    monkeypatch.setattr(cuda_graphs, "cuda_graph_factory", lambda: "factory")
    assert cuda_graphs.resolve("auto", cuda, TritonAttentionBackend) == "factory"
    assert TritonAttentionBackend.capabilities.graph_capturable
    assert not TorchAttentionBackend.capabilities.graph_capturable


def test_an_eager_runner_logs_its_reason_once(llama_dir, caplog):
    with caplog.at_level(logging.INFO, logger="speculant.model.runner"):
        runner = make_runner(llama_dir, "auto")
    assert runner.graphs is None and "CUDA only" in (runner.graphs_off_reason or "")
    lines = [r.getMessage() for r in caplog.records if "without CUDA graphs" in r.getMessage()]
    assert len(lines) == 1 and "model.path" in lines[0], lines


def test_a_scaled_lm_head_is_refused_for_graphs(runners):
    graphed, _ = runners
    head = graphed.model.get_output_embeddings()
    scaled = torch.nn.Linear(head.in_features, head.out_features, bias=False)
    with torch.no_grad():
        scaled.weight.copy_(head.weight * 2)
    real = graphed.model.get_output_embeddings
    try:
        graphed.model.get_output_embeddings = lambda: scaled
        assert "not its output embedding" in (graphed._plain_head_problem() or "")
    finally:
        graphed.model.get_output_embeddings = real
    assert graphed._plain_head_problem() is None
