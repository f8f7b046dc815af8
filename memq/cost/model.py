"""The monthly cost of a topic on memq, next to the same workload on replicated Kafka. Pure.

memq (per topic, from the brokers' counters, rates extrapolated to a 730-hour month):
- S3 requests: the PUT, GET, LIST and DELETE requests counted on the brokers (their GETs include
  the read cache's misses for readers at the tail), plus, when consumers read storage themselves
  (`consumer_read_path = "s3"`: Spark, catch-up), one GET per batch object per consumer group
  (consumers are not scraped);
- S3 storage: batch bytes written per second x retention (the steady state once retention
  deletes as fast as producers write); for a compacted topic, what it keeps now instead (its
  compacted parts plus its plain tail, as the brokers' compactors report them, for the whole month),
  next to the plain figure it would keep without compaction (`Compaction`);
- producer -> broker transfer: `cross_az_fraction` of the bytes in cross a zone (consumers read
  from S3, which charges no transfer inside a region, and S3 replicates across zones itself);
- the notifications: their bytes on the Kafka model below.

Kafka (the same bytes in, as compressed record batches):
- EBS storage: bytes in x retention x `kafka_replicas` / `kafka_disk_utilization` (for a
  compacted topic, memq's kept bytes instead: Kafka compacts too);
- transfer: producers to leaders (`cross_az_fraction`), leader to each of `kafka_replicas - 1`
  followers in other zones, and every consumer group from leaders (`cross_az_fraction`, no
  fetch-from-follower); each crossing is charged `cross_az_gb` out and again in.

Not modelled, on either side: broker compute and instances, request-rate tiers and free tiers,
Kafka's own notification topic overhead beyond bytes. Defaults favour Kafka (no disk headroom).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from memq.config import CostConfig

from .counters import Compacted, Usage

GB = 1024 ** 3
MONTH_S = 730 * 3600.0


@dataclass(frozen=True)
class Line:
    """One billed item per month: `quantity` in `unit` (requests, GB, GB-month), costing `usd`;
    `item` is its label for people (callers pick a line by its field name, not by this)."""

    item: str
    quantity: float
    unit: str
    usd: float


@dataclass(frozen=True)
class _Bill:
    """A system's monthly lines as named fields, in display order."""

    @property
    def lines(self) -> tuple[Line, ...]:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def named(self) -> tuple[tuple[str, Line], ...]:
        return tuple((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))

    @property
    def usd(self) -> float:
        return sum(line.usd for line in self.lines)


@dataclass(frozen=True)
class MemqBill(_Bill):
    s3_put: Line
    s3_get_brokers: Line
    s3_get_consumers: Line        # one GET per object per consumer group, modelled
    s3_list: Line
    s3_delete: Line
    s3_storage: Line
    producer_transfer: Line       # producers -> brokers across zones
    notifications: Line           # their bytes priced on the Kafka model

    @property
    def requests_usd(self) -> float:
        """The S3 request lines together (PUT, GET, LIST, DELETE)."""
        return sum(x.usd for x in (self.s3_put, self.s3_get_brokers, self.s3_get_consumers, self.s3_list,
                                   self.s3_delete))


@dataclass(frozen=True)
class KafkaBill(_Bill):
    storage: Line                 # EBS, all replicas
    producer_transfer: Line       # producers -> leaders across zones
    replication: Line             # leader -> followers in other zones
    consumer_transfer: Line       # leaders -> consumer groups across zones


@dataclass(frozen=True)
class Compaction:
    """A compacted topic's S3 storage per month: what it keeps (`kept`) against what the same
    writes would keep without compaction (`uncompacted`: batch bytes/s x retention)."""

    kept: Compacted
    uncompacted_bytes: float
    kept_usd: float
    uncompacted_usd: float

    @property
    def saving_usd(self) -> float:
        """S3 storage saved per month (negative when compaction keeps keys longer than retention would)."""
        return self.uncompacted_usd - self.kept_usd

    def describe(self) -> str:
        """The comparison in words (`memq cost`)."""
        k, mib = self.kept, 2 ** 20
        return (f"compacted: keeps {k.kept_bytes / mib:,.1f} MiB (parts {k.parts_bytes / mib:,.1f} + plain tail "
                f"{k.tail_bytes / mib:,.1f}) where {self.uncompacted_bytes / mib:,.1f} MiB would be kept without "
                f"compaction: S3 storage {self.kept_usd:,.2f} instead of {self.uncompacted_usd:,.2f} USD/month, "
                f"{'saves' if self.saving_usd >= 0 else 'costs'} {abs(self.saving_usd):,.2f}")


@dataclass(frozen=True)
class Estimate:
    topic: str
    retention_s: float
    memq: MemqBill
    kafka: KafkaBill
    compaction: Compaction | None = None      # a compacted topic's storage with and without compaction

    @property
    def memq_usd(self) -> float:
        return self.memq.usd

    @property
    def kafka_usd(self) -> float:
        return self.kafka.usd

    @property
    def saving(self) -> float:
        """memq's saving as a fraction of the Kafka cost (0.9 = 90% cheaper); 0 when both are 0."""
        return 1 - self.memq_usd / self.kafka_usd if self.kafka_usd else 0.0


def _requests(item: str, per_s: float, price_per_1000: float) -> Line:
    n = per_s * MONTH_S
    return Line(item, n, "requests", n / 1000 * price_per_1000)


def kafka_lines(bytes_per_s: float, retention_s: float, p: CostConfig, what: str = "",
                kept_bytes: float | None = None) -> KafkaBill:
    """3-replica Kafka on block storage with cross-zone replication, for `bytes_per_s` in; each
    replica keeps `kept_bytes` (a compacted topic), else the bytes in within `retention_s`."""
    gb_month = bytes_per_s * MONTH_S / GB
    crossing = 2 * p.cross_az_gb
    kept = bytes_per_s * retention_s if kept_bytes is None else kept_bytes
    stored = kept * p.kafka_replicas / p.kafka_disk_utilization / GB
    produce = gb_month * p.cross_az_fraction
    replicate = gb_month * (p.kafka_replicas - 1)
    consume = gb_month * p.consumer_groups * p.cross_az_fraction
    return KafkaBill(
        storage=Line(f"{what}EBS gp3 storage ({p.kafka_replicas} replicas)", stored, "GB-month",
                     stored * p.ebs_gb_month),
        producer_transfer=Line(f"{what}cross-AZ producers -> leaders", produce, "GB", produce * crossing),
        replication=Line(f"{what}cross-AZ replication to {p.kafka_replicas - 1} followers", replicate, "GB",
                         replicate * crossing),
        consumer_transfer=Line(f"{what}cross-AZ leaders -> {p.consumer_groups} consumer group(s)", consume, "GB",
                               consume * crossing))


def estimate(u: Usage, retention_s: float, p: CostConfig) -> Estimate:
    """The monthly estimate of topic `u` at its measured rates, kept for `retention_s`."""
    r = u.rates
    plain = r.stored_bytes * retention_s
    stored = (u.compacted.kept_bytes if u.compacted else plain) / GB
    produce = r.bytes_in * MONTH_S / GB * p.cross_az_fraction
    notify = kafka_lines(r.notification_bytes, retention_s, p).usd
    notify_gb = r.notification_bytes * MONTH_S / GB
    memq = MemqBill(
        s3_put=_requests("S3 PUT requests", r.requests["put"], p.s3_put_per_1000),
        s3_get_brokers=_requests("S3 GET requests (brokers)", r.requests["get"], p.s3_get_per_1000),
        s3_get_consumers=(_requests(f"S3 GET requests ({p.consumer_groups} consumer group(s), 1 per object)",
                                    r.objects * p.consumer_groups, p.s3_get_per_1000)
                          if p.consumer_read_path == "s3" else
                          _requests(f"S3 GET requests ({p.consumer_groups} consumer group(s) through brokers: "
                                    "the brokers' GETs)", 0.0, p.s3_get_per_1000)),
        s3_list=_requests("S3 LIST requests", r.requests["list"], p.s3_list_per_1000),
        s3_delete=_requests("S3 DELETE requests", r.requests["delete"], p.s3_delete_per_1000),
        s3_storage=Line("S3 Standard storage" + (" (compacted parts + plain tail)" if u.compacted else ""), stored,
                        "GB-month", stored * p.s3_gb_month),
        producer_transfer=Line("cross-AZ producers -> brokers", produce, "GB", produce * 2 * p.cross_az_gb),
        notifications=Line("notifications on Kafka (the Kafka model below)", notify_gb, "GB", notify))
    kafka = kafka_lines(r.bytes_in, retention_s, p, kept_bytes=u.compacted.kept_bytes if u.compacted else None)
    compaction = None if u.compacted is None else Compaction(u.compacted, plain, memq.s3_storage.usd,
                                                             plain / GB * p.s3_gb_month)
    return Estimate(u.topic, retention_s, memq, kafka, compaction)


def as_dict(u: Usage, e: Estimate) -> dict[str, Any]:
    """One topic's counts in the window and its estimate, as `memq cost --json` and the dashboard show them."""
    c = u.counts
    return {"window_s": round(u.window_s, 3),
            "counts": {"bytes_in": c.bytes_in, "objects": c.objects, "stored_bytes": c.stored_bytes,
                       "notifications": c.notifications, "requests": c.requests},
            "memq_usd_month": e.memq_usd, "kafka_usd_month": e.kafka_usd, "saving": e.saving,
            "memq": _as_list(e.memq), "kafka": _as_list(e.kafka), "compaction": _compaction(e.compaction)}


def _compaction(c: Compaction | None) -> dict[str, float] | None:
    """A compacted topic's storage in bytes and USD per month; None for a plain topic."""
    if c is None:
        return None
    return {"parts_bytes": c.kept.parts_bytes, "tail_bytes": c.kept.tail_bytes, "kept_bytes": c.kept.kept_bytes,
            "uncompacted_bytes": c.uncompacted_bytes, "kept_usd_month": c.kept_usd,
            "uncompacted_usd_month": c.uncompacted_usd, "saving_usd_month": c.saving_usd}


def _as_list(bill: MemqBill | KafkaBill) -> list[dict[str, Any]]:
    """A bill's lines in display order, each with its field `name` for programs and `item` for people."""
    return [{"name": name, **dataclasses.asdict(line)} for name, line in bill.named()]


def price_source(p: CostConfig) -> str:
    """Name the prices in use: the public defaults, or the config's own table."""
    if p == CostConfig():
        return "S3 Standard, EBS gp3 and inter-AZ public list prices (AWS us-east-1)"
    return "the [cost] price table of the config"
