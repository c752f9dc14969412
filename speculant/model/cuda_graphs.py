"""CUDA graphs for the runner's base-model forward, whatever the batch mix.

The triton backend reads no host metadata, so one graph per key ``(Tb,
qcap)`` serves any mix of prefill chunks, decodes and verify runs: ``Tb`` is
the padded token count (a power of two up to the largest bucket), ``qcap``
the host int the backend picks its attention tile by (the longest query run
rounded up to a power of two while it is at most 16, else ``Tb``). The graph
runs the base model (hidden states ``[Tb, H]``) on ``StaticSpans``; the
runner applies the LM head eagerly to the rows it keeps.

A forward runs eagerly (``run`` returns None) when it has more tokens than the
largest bucket or leaves no span slot for the padding span, and when its
key's capture failed (logged once per key; never a wrong output). Graphs are
built lazily on a key's first use: warm-up runs on a side stream, then one
capture into a memory pool shared by the runner's graphs.

``Graph`` is the seam tests replace: ``StubGraph`` re-runs the captured
callable at each replay, which exercises bucketing, padding and dispatch on
the CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from speculant.interfaces import AttentionBackend
from speculant.interfaces.span_tensors import PagedSpan
from speculant.model.attention.context import ForwardContext, forward_context
from speculant.model.graph_buffers import StaticSpans, host_refill

logger = logging.getLogger(__name__)

MAX_BUCKET = 512
"""Largest padded token count captured; longer forwards run eagerly."""
SHORT_QUERY = 16
"""Longest query run that gets its own power-of-two ``qcap`` (the kernel's short-span tiles)."""


@dataclass(frozen=True)
class GraphLimits:
    """What the runner's forwards can reach: sizes the static buffers and buckets."""

    max_tokens: int = MAX_BUCKET  # scheduler.max_num_batched_tokens (+ speculative rows)
    max_spans: int = 64  # scheduler.max_num_seqs


def buckets(max_tokens: int) -> list[int]:
    """Powers of two from 1 up to the first >= ``max_tokens``, at most ``MAX_BUCKET``."""
    out = [1]
    while out[-1] < min(max_tokens, MAX_BUCKET):
        out.append(out[-1] * 2)
    return out


def query_cap(max_query_len: int, bucket: int) -> int:
    if max_query_len > SHORT_QUERY:
        return bucket
    return min(bucket, 1 << (max_query_len - 1).bit_length())


class GraphedRunner(Protocol):
    """What the graphs read of their ``ModelRunner`` (a Protocol: the runner imports this module)."""

    device: torch.device
    backend: AttentionBackend
    block_size: int
    max_model_len: int
    trash_block: int  # a KV block outside the BlockManager: padding tokens write there
    key_caches: list[torch.Tensor]  # per layer [num_blocks + 1, block_size, H_kv, D]
    value_caches: list[torch.Tensor]
    hidden_source: torch.nn.Module  # the module whose output is the final hidden states


class Graph(Protocol):
    def capture(self, fn: Callable[[], torch.Tensor]) -> None: ...

    def replay(self) -> torch.Tensor: ...


class CudaGraph:
    """``torch.cuda.CUDAGraph`` around ``fn``: two warm-up runs on a side stream, then capture."""

    def __init__(self, pool) -> None:
        self._pool = pool
        self._graph: torch.cuda.CUDAGraph | None = None
        self._out: torch.Tensor | None = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = fn()
        self._graph, self._out = graph, out

    def replay(self) -> torch.Tensor:
        assert self._graph is not None and self._out is not None, "replay before capture"
        self._graph.replay()
        return self._out


class StubGraph:
    """For tests: ``capture`` runs ``fn`` once, ``replay`` runs it again on the refilled buffers."""

    def __init__(self, pool=None) -> None:
        self._fn: Callable[[], torch.Tensor] | None = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> None:
        fn()
        self._fn = fn

    def replay(self) -> torch.Tensor:
        assert self._fn is not None, "replay before capture"
        return self._fn()


GraphFactory = Callable[[object], Graph]


def cuda_graph_factory() -> tuple[GraphFactory, object]:
    return CudaGraph, torch.cuda.graph_pool_handle()


def resolve(setting: str, device: torch.device, backend) -> tuple[GraphFactory, object] | str:
    """The graph factory and pool for ``model.cuda_graphs = setting``, or why forwards run eagerly."""
    if setting == "off":
        return "model.cuda_graphs = 'off'"
    if device.type != "cuda":
        return f"model.cuda_graphs = 'auto' captures on CUDA only; the model runs on {device.type}"
    if not backend.capabilities.graph_capturable:
        return (f"attention backend {backend.name!r} is not graph-capturable (its metadata is read on the host); "
                "model.attention_backend = 'triton' is")
    return cuda_graph_factory()


class GraphedForward:
    """Per-runner graph dispatch: refill the static buffers, replay (capturing on
    first use) the graph of the forward's key, return the hidden states."""

    def __init__(self, runner: GraphedRunner, limits: GraphLimits, factory: GraphFactory, pool: object) -> None:
        self.runner = runner
        self.buckets = buckets(limits.max_tokens)
        self.num_span_slots = limits.max_spans + 1  # + the padding span
        max_blocks = -(-runner.max_model_len // runner.block_size)
        self.static = StaticSpans(self.buckets[-1], self.num_span_slots, max_blocks, runner.block_size,
                                  runner.device)
        self._factory, self._pool = factory, pool
        self.graphs: dict[tuple[int, int], Graph] = {}
        self.failed: dict[tuple[int, int], str] = {}
        self.replays = 0
        self.eager_runs = 0

    def key(self, spans: list[PagedSpan]) -> tuple[int, int] | None:
        """The graph key of a forward over ``spans``, None where it runs eagerly (also a
        token tree: the static buffers hold neither explicit positions nor tree masks)."""
        total = sum(s.num_tokens for s in spans)
        if total > self.buckets[-1] or len(spans) >= self.num_span_slots \
                or any(s.positions is not None or s.ancestor_mask is not None for s in spans):
            return None
        bucket = next(b for b in self.buckets if b >= total)
        key = (bucket, query_cap(max(s.num_tokens for s in spans), bucket))
        return None if key in self.failed else key

    def run(self, spans: list[PagedSpan]) -> torch.Tensor | None:  # -> [Tb, H] hidden states, or None: run eagerly
        key = self.key(spans)
        if key is None:
            self.eager_runs += 1
            return None
        runner = self.runner
        self.static.fill(host_refill(spans, runner.block_size, key[0], self.num_span_slots,
                                     runner.trash_block * runner.block_size))
        graph = self.graphs.get(key)
        if graph is None:
            graph = self._capture(key)
            if graph is None:
                self.eager_runs += 1
                return None
        self.replays += 1
        return graph.replay()

    def _capture(self, key: tuple[int, int]) -> Graph | None:
        st = self.static.span_tensors(*key)
        runner = self.runner
        base = runner.hidden_source

        def forward() -> torch.Tensor:  # [Tb, H]
            ctx = ForwardContext(runner.backend, runner.backend.build_metadata(st), runner.key_caches,
                                 runner.value_caches)
            with forward_context(ctx):
                out = base(input_ids=st.token_ids.unsqueeze(0), position_ids=st.positions.unsqueeze(0),
                           use_cache=False)
            hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
            return hidden[0]

        graph = self._factory(self._pool)
        try:
            graph.capture(forward)
        except Exception as exc:  # noqa: BLE001 - any failure: this key runs eagerly, never a wrong output
            reason = f"{type(exc).__name__}: {exc}"
            self.failed[key] = reason
            logger.warning("CUDA graph capture failed for %d tokens (query cap %d), running those forwards "
                           "eagerly: %s", key[0], key[1], reason)
            return None
        self.graphs[key] = graph
        return graph
