"""``speculant.server.metrics_hub``: several replicas' families in one exposition, labelled by replica."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from speculant.server import metrics_hub
from speculant.server.metrics import ServerMetrics
from speculant.server.metrics_hub import STALE_S, MetricsHub, exposition


def replica_metrics(finished: list[tuple[str, int, int]], steps: list[float]) -> list:
    m = ServerMetrics(lambda: None, lambda: None)  # no engine: the server's own counters only
    for reason, prompt, generated in finished:
        m.finished(reason, prompt, generated)
    for s in steps:
        m.step_seconds.observe(s)
    return list(m.registry.collect())


def test_every_replica_labelled_and_counters_sum():
    hub = MetricsHub()
    hub.report("a", replica_metrics([("length", 5, 7), ("stop", 3, 2)], [0.01, 0.2]))
    hub.report("b", replica_metrics([("length", 4, 9)], [0.03]))
    hub.report("a", replica_metrics([("length", 5, 7), ("stop", 3, 2), ("abort", 1, 0)], [0.01, 0.2]))  # newer
    families = {f.name: f for f in text_string_to_metric_families(exposition(hub.snapshot()).decode())}
    requests = {(s.labels["replica"], s.labels["finish_reason"]): s.value
                for s in families["speculant_requests"].samples}
    assert requests == {("a", "length"): 1, ("a", "stop"): 1, ("a", "abort"): 1, ("b", "length"): 1}
    generated = {s.labels["replica"]: s.value for s in families["speculant_generation_tokens"].samples}
    assert generated == {"a": 9, "b": 9}
    counts = {s.labels["replica"]: s.value for s in families["speculant_step_seconds"].samples
              if s.name == "speculant_step_seconds_count"}
    assert counts == {"a": 2, "b": 1}
    assert all("replica" in s.labels for f in families.values() for s in f.samples)
    assert {s.labels["replica"] for s in families["process_resident_memory_bytes"].samples} == {"a", "b"}


def test_no_reports_is_an_empty_exposition():
    assert exposition({}) == b""


def test_a_replica_that_stopped_reporting_keeps_its_counters_and_loses_its_gauges(monkeypatch):
    """A dead replica's counts happened; what it held (gauges: open requests, memory) it holds no more."""
    clock = [100.0]
    monkeypatch.setattr(metrics_hub.time, "monotonic", lambda: clock[0])
    hub = MetricsHub()
    hub.report("dead", replica_metrics([("length", 5, 7)], [0.01]))
    clock[0] += STALE_S / 2
    hub.report("alive", replica_metrics([("stop", 3, 2)], [0.02]))
    clock[0] += STALE_S / 2 + 0.1  # "dead" last reported just over STALE_S ago, "alive" half of that

    families = {f.name: f for f in text_string_to_metric_families(exposition(hub.snapshot()).decode())}
    assert {s.labels["replica"] for s in families["speculant_requests"].samples} == {"dead", "alive"}
    for gauge in ("process_resident_memory_bytes", "speculant_requests_open"):
        assert {s.labels["replica"] for s in families[gauge].samples} == {"alive"}, gauge
