"""``GET /metrics``: Prometheus text from ``prometheus_client``.

Counted by the server: requests by finish reason, prompt and generated
tokens, step time (a histogram observed by the engine thread), requests
handed to the engine, API requests open (arrival to last byte, ``open_requests.py``). Read from the engine
at scrape time: queue length, running requests, KV blocks in use, and
the speculation counters vLLM users know (drafts, draft tokens, accepted
tokens, accepted tokens per draft position, mean acceptance length), plus
the proposer faults and failed requests the engine contained, and the prefix
cache (tokens and blocks looked up and hit, blocks cached, evictions). The process
collector adds ``process_resident_memory_bytes`` and friends.

Each server has its own registry, so several apps in one process (tests) do
not collide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from speculant.engine.llm_engine import LLMEngine
from speculant.engine.request import SpecStats
from speculant.server.admission import Admission
from speculant.server.open_requests import OpenRequestCount

disable_created_metrics()  # no *_created series: counters here start with the process

STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServerMetrics:
    def __init__(self, engine: Callable[[], LLMEngine | None], loop: Callable[[], Admission | None],
                 open_requests: OpenRequestCount | None = None) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.requests = Counter("speculant_requests", "Requests answered, by finish reason (stop, length, "
                                "error; abort: the client went away; rejected: queue full)",
                                ["finish_reason"], registry=self.registry)
        self.prompt_tokens = Counter("speculant_prompt_tokens", "Prompt tokens of finished requests",
                                     registry=self.registry)
        self.generation_tokens = Counter("speculant_generation_tokens", "Tokens generated for finished "
                                         "requests", registry=self.registry)
        self.step_seconds = Histogram("speculant_step_seconds", "Wall time of one engine step",
                                      buckets=STEP_BUCKETS, registry=self.registry)
        self.registry.register(_EngineCollector(engine, loop, open_requests or OpenRequestCount()))

    def finished(self, reason: str, num_prompt_tokens: int = 0, num_output_tokens: int = 0) -> None:
        self.requests.labels(finish_reason=reason).inc()
        self.prompt_tokens.inc(num_prompt_tokens)
        self.generation_tokens.inc(num_output_tokens)

    def text(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    """Engine state, read when scraped (nothing is copied in between)."""

    def __init__(self, engine: Callable[[], LLMEngine | None], loop: Callable[[], Admission | None],
                 open_requests: OpenRequestCount) -> None:
        self.engine = engine
        self.loop = loop
        self.open_requests = open_requests

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("speculant_requests_open", "API requests this server holds, from their arrival "
                                "to the last byte of their answer", value=self.open_requests.value)
        loop = self.loop()
        yield GaugeMetricFamily("speculant_requests_queued", "Requests admitted that have not had their first "
                                "step yet (bounded by --max-queued)", value=loop.num_queued if loop else 0)
        yield CounterMetricFamily("speculant_engine_submissions", "Requests handed to the engine (add_request "
                                  "calls; those it refuses as invalid included)",
                                  value=loop.num_submitted if loop else 0)
        engine = self.engine()
        if engine is None:  # still loading
            return
        occ = engine.occupancy()
        yield GaugeMetricFamily("speculant_requests_waiting", "Requests in the engine's waiting queue "
                                "(new or preempted)", value=occ["num_waiting"])
        yield GaugeMetricFamily("speculant_requests_running", "Requests holding KV blocks",
                                value=occ["num_running"])
        yield GaugeMetricFamily("speculant_kv_blocks_in_use", "Target KV cache blocks in use",
                                value=occ["num_kv_blocks_in_use"])
        yield GaugeMetricFamily("speculant_kv_blocks", "Target KV cache blocks in the pool",
                                value=occ["num_kv_blocks"])
        yield GaugeMetricFamily("speculant_kv_blocks_cached", "Target KV blocks no request holds, kept by the "
                                "prefix cache (evicted when the pool needs them)", value=occ["num_kv_blocks_cached"])
        stats = engine.spec_totals()
        yield CounterMetricFamily("speculant_spec_drafts", "Verify steps with proposals (one per request "
                                  "and step)", value=stats.num_steps)
        yield CounterMetricFamily("speculant_spec_draft_tokens", "Proposed tokens", value=stats.num_draft_tokens)
        yield CounterMetricFamily("speculant_spec_accepted_tokens", "Proposed tokens accepted",
                                  value=stats.num_accepted_tokens)
        per_pos = CounterMetricFamily("speculant_spec_accepted_tokens_per_position", "Proposed tokens accepted, "
                                      "by draft position (0 = first proposal)", labels=["position"])
        for i, n in enumerate(stats.accepted_per_position):
            per_pos.add_metric([str(i)], n)
        yield per_pos
        yield GaugeMetricFamily("speculant_spec_mean_acceptance_length", "Tokens emitted per verify step, "
                                "bonus token included (since start)", value=stats.mean_accepted_length)
        yield from _acceptance_histogram(stats, engine.config.speculative.proposer)
        metrics = engine.get_metrics()
        yield CounterMetricFamily("speculant_proposer_errors", "Proposer faults contained (they cost "
                                  "speculation, not requests)", value=metrics["proposer_errors"])
        yield CounterMetricFamily("speculant_failed_requests", "Requests the engine failed (finish_reason "
                                  "error)", value=metrics["failed_requests"])
        yield from _prefix_cache(metrics)


def _acceptance_histogram(stats: SpecStats, proposer: str | None) -> Iterator[Metric]:
    """Proposals accepted per verify step, as a histogram labelled by proposer,
    and the decode steps each request spent with speculation off."""
    hist = HistogramMetricFamily("speculant_spec_accepted_length", "Proposals accepted per verify step (one "
                                 "observation per request and step with proposals)", labels=["proposer"])
    cumulative, buckets = 0, []
    for a, n in enumerate(stats.accepted_histogram):
        cumulative += n
        buckets.append((str(a), cumulative))
    buckets.append(("+Inf", stats.num_steps))
    hist.add_metric([proposer or "none"], buckets, sum_value=stats.num_accepted_tokens)
    yield hist
    yield CounterMetricFamily("speculant_spec_off_steps", "Decode steps without proposals (the draft-length "
                              "policy, a request's own setting or the budget set k = 0)", value=stats.num_off_steps)
    yield CounterMetricFamily("speculant_spec_propose_seconds", "Seconds the proposer spent, summed over "
                              "requests", value=stats.propose_s)


def _prefix_cache(metrics: dict) -> Iterator[Metric]:
    """Prefix-cache series (absent when cache.enable_prefix_caching is off)."""
    if "prefix_cache_queried_tokens" not in metrics:
        return
    for name, key, what in (
            ("queried_tokens", "prefix_cache_queried_tokens", "Prompt tokens of admitted requests, cached or not"),
            ("hit_tokens", "prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache (prefill skipped)"),
            ("queried_blocks", "prefix_cache_queried_blocks", "Full prompt blocks looked up in the prefix cache"),
            ("hit_blocks", "prefix_cache_hit_blocks", "Full prompt blocks found in the prefix cache"),
            ("evictions", "prefix_cache_evictions", "Cached KV blocks evicted to make room")):
        yield CounterMetricFamily(f"speculant_prefix_cache_{name}", what, value=metrics[key])
    yield GaugeMetricFamily("speculant_prefix_cache_hit_rate", "Prompt tokens found cached / prompt tokens of "
                            "admitted requests (since start)", value=metrics["prefix_cache_hit_rate"])
