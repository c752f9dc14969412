"""``/metrics`` across Ray Serve replicas: every replica's series in one scrape, labelled by replica.

Serve's proxy sends a scrape of ``/metrics`` to any one replica, which knows
only its own engine. So each replica reports its metric families (the
``prometheus_client`` objects its registry collects: the server's counters,
the engine's speculation counters, process memory) to one ``MetricsHub``, a
small named Ray actor, every ``REPORT_INTERVAL_S`` seconds and again just
before it answers a scrape; the answer is every replica's last report, each
sample with a ``replica`` label added.

Counters (requests, tokens, drafts, accepted tokens, accepted tokens per
draft position) are per replica and sum across replicas:
``sum by (position) (speculant_spec_accepted_tokens_per_position_total)`` is
the cluster's count. Gauges and ratios (``speculant_spec_mean_acceptance_length``,
the prefix-cache hit rate) are per replica and must not be summed; divide the
summed counters instead. A replica that died keeps its last report's counters
(its counts happened), under its own label, while its gauges (requests open
and running, KV blocks, memory) leave the exposition once its report is older
than ``STALE_S``: it holds nothing now, and a sum of gauges over replicas must
not count it. Its replacement starts from zero under a new label.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

REPORT_INTERVAL_S = 1.0
STALE_S = 5 * REPORT_INTERVAL_S
"""A report this old is a dead replica's: its gauges are dropped."""
HUB_NAMESPACE = "speculant"


class MetricsHub:
    """The last report of each replica (a Ray actor: ``ray.remote(MetricsHub)``)."""

    def __init__(self) -> None:
        self.reports: dict[str, list[Metric]] = {}
        self.times: dict[str, float] = {}  # replica -> time.monotonic() of its last report

    def report(self, replica: str, families: list[Metric]) -> None:
        self.reports[replica] = families
        self.times[replica] = time.monotonic()

    def snapshot(self) -> dict[str, list[Metric]]:
        """Every replica's last report, less the gauges of those that stopped reporting."""
        now = time.monotonic()
        return {r: families if now - self.times[r] <= STALE_S else [f for f in families if f.type != "gauge"]
                for r, families in self.reports.items()}


def exposition(reports: dict[str, list[Metric]]) -> bytes:
    """Prometheus text of every replica's families, each sample labelled ``replica``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Labelled(reports))
    return generate_latest(registry)


class _Labelled(Collector):
    def __init__(self, reports: dict[str, list[Metric]]) -> None:
        self.reports = reports

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for replica in sorted(self.reports):
            for family in self.reports[replica]:
                out = merged.get(family.name)
                if out is None:
                    out = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                for s in family.samples:
                    out.add_sample(s.name, {**s.labels, "replica": replica}, s.value, s.timestamp, s.exemplar)
        yield from merged.values()
