"""Per share group metrics, read from the share-partitions' counters at each scrape (no double counting)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .service import Shares

_COUNTERS = ("acquired", "lock_timeouts", "redeliveries", "acknowledged", "archived")


class ShareCollector(Collector):
    def __init__(self, shares: Shares) -> None:
        self._shares = shares

    def collect(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily("memq_share_in_flight_records", "Records in share-partition windows led here",
                                      labels=["group"])
        acquired_now = GaugeMetricFamily("memq_share_acquired_records", "Records acquired (locked) right now",
                                         labels=["group"])
        counters = {c: CounterMetricFamily(f"memq_share_{c}", f"Share-group records {c.replace('_', ' ')} here",
                                           labels=["group"]) for c in _COUNTERS}
        dead = CounterMetricFamily("memq_share_dead_letters", "Records appended to a group's dead-letter topic",
                                   labels=["group"])
        writes = CounterMetricFamily("memq_share_state_writes", "Share-partition state writes to the store")
        per: dict[str, list[int]] = {}
        for (group, _, _), sp in list(self._shares.partitions.items()):
            row = per.setdefault(group, [0] * (2 + len(_COUNTERS)))
            row[0] += sp.in_flight()
            row[1] += sp.acquired()
            for i, c in enumerate(_COUNTERS):
                row[2 + i] += getattr(sp.counters, c)
        for group, row in per.items():
            in_flight.add_metric([group], row[0])
            acquired_now.add_metric([group], row[1])
            for i, c in enumerate(_COUNTERS):
                counters[c].add_metric([group], row[2 + i])
        for group, n in self._shares.dead_letters.items():
            dead.add_metric([group], n)
        writes.add_metric([], self._shares.writes)
        yield in_flight
        yield acquired_now
        yield from counters.values()
        yield dead
        yield writes


def register(shares: Shares, registry: CollectorRegistry) -> None:
    registry.register(ShareCollector(shares))
