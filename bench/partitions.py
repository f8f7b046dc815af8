"""Partitions as the producer chose them: what they cost in objects (PUTs) and notifications.

A record is read from the partition its producer chose, so a broker's fill of a topic holds a
batch per partition written, each a part of the one object the fill is stored as and published
to its partition. This bench checks that PUTs per GiB do not grow with partitions: one governed
broker with its Kafka listener (dev cluster: moto S3, tansu, ZooKeeper), topics of 1, 8 and 64
read partitions, each with objects of its own (`storage_group = ""`) and in the shared group;
a confluent-kafka producer (16 KiB values, acks=1, keys spread evenly over the partitions by its
partitioner) writes the same bytes to each in turn, and the broker's counters say how many
objects (`memq_broker_group_objects`) and parts (notifications, `memq_broker_batch_bytes_count`)
held how many bytes. Ratios: `puts_per_gib_<n>p_vs_1p_<own|shared>`, the 1-partition topic's PUTs
per GiB over the n-partition one's (goal >= 0.9: no growth), and `puts_vs_ideal_<n>p_<own|shared>`,
GiB / batch_bytes over the PUTs per GiB measured (a run's last fill is partial, so a little
under 1). Notifications per GiB grow with the partitions written per fill, by design: each part
is read from its own partition.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer

from bench._cluster import broker_samples
from bench.kafka_produce import _kafka_address
from memq.config import BrokerConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster

MiB = 1024 ** 2
GiB = 1024 ** 3
BATCH_BYTES = 8 * MiB
BATCH_MS = 2_000          # fills seal by size, not age, at the rates measured here
VALUE_BYTES = 16 * 1024
PARTITIONS = (1, 8, 64)
GROUPS = {"own": "", "shared": "shared"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mib", type=int, default=None, help="MiB written to each topic")


def _counters(url: str, topic: str, group: str) -> tuple[float, float, float]:
    """(objects of `group`, parts of `topic`, bytes of those parts) on the broker so far."""
    objects = sum(s.value for s in broker_samples(url, "memq_broker_group_objects")
                  if s.name.endswith("_total") and s.labels.get("group") == group)
    parts = {s.name: s.value for s in broker_samples(url, "memq_broker_batch_bytes") if s.labels.get("topic") == topic}
    return objects, parts.get("memq_broker_batch_bytes_count", 0.0), parts.get("memq_broker_batch_bytes_sum", 0.0)


def _write(address: str, topic: str, total: int) -> None:
    """`total` bytes of VALUE_BYTES values, keyed so the partitioner spreads them evenly, acks=1."""
    p = Producer({"bootstrap.servers": address, "acks": 1, "linger.ms": 20, "batch.size": 1_000_000,
                  "queue.buffering.max.kbytes": 262_144, "max.in.flight.requests.per.connection": 16})
    values = [os.urandom(VALUE_BYTES // 2).hex().encode() for _ in range(64)]
    for i in range(total // VALUE_BYTES):
        while True:
            try:
                p.produce(topic, values[i % 64], key=b"key-%d" % i)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    if p.flush(120):
        raise RuntimeError(f"{topic}: records still queued after 120 s")


def _settled(url: str, topic: str, group: str, timeout_s: float = 60.0) -> tuple[float, float, float]:
    """The counters once the topic's last fill (sealed by age) is stored: unchanged for a second."""
    time.sleep(BATCH_MS / 1000)
    last, deadline = _counters(url, topic, group), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = _counters(url, topic, group)
        if now == last:
            return now
        last = now
    raise RuntimeError(f"{topic}: still storing after {timeout_s:.0f} s")


def run(quick: bool, mib: int | None = None) -> dict:
    total = (mib or (96 if quick else 512)) * MiB
    topics = {(n, kind): TopicConfig(f"bench-p{n}-{kind}", read_partitions=n, batch_bytes=BATCH_BYTES,
                                     batch_ms=BATCH_MS, ring_slots=4, storage_group=group)
              for n in PARTITIONS for kind, group in GROUPS.items()}
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="memq-bench-") as tmp, \
            DevCluster(Path(tmp) / "servers") as dc, \
            GovernedCluster(tmp, brokers=1, servers=dc, cluster="bench", broker=BrokerConfig(kafka_port=0)) as gc:
        for cfg in topics.values():
            gc.create_topic(cfg)
        url = gc.broker("b1").url
        address = _kafka_address(url)
        _write(address, topics[1, "own"].name, 8 * MiB)      # warm up: connections, metadata
        _settled(url, topics[1, "own"].name, "")
        for (n, kind), cfg in topics.items():
            before = _counters(url, cfg.name, cfg.storage_group)
            t0 = time.perf_counter()
            _write(address, cfg.name, total)
            after = _settled(url, cfg.name, cfg.storage_group)
            objects, parts, stored = (a - b for a, b in zip(after, before))
            gib = stored / GiB
            figures[f"{n}p_{kind}"] = {"puts_per_gib": round(objects / gib, 1), "notifications_per_gib": round(parts / gib, 1),
                                       "objects": objects, "parts": parts, "mib": round(stored / MiB, 1)}
            print(f"{n:>2} partitions, {kind:>6} objects: {objects:.0f} objects, {parts:.0f} parts for "
                  f"{stored / MiB:.0f} MiB in {time.perf_counter() - t0:.1f} s: {objects / gib:.1f} PUTs, "
                  f"{parts / gib:.0f} notifications per GiB", flush=True)
    ideal = GiB / BATCH_BYTES
    ratios: dict[str, float] = {}
    for kind in GROUPS:
        one = figures[f"1p_{kind}"]["puts_per_gib"]
        for n in PARTITIONS:
            puts = figures[f"{n}p_{kind}"]["puts_per_gib"]
            ratios[f"puts_vs_ideal_{n}p_{kind}"] = round(ideal / puts, 3)
            if n > 1:
                ratios[f"puts_per_gib_{n}p_vs_1p_{kind}"] = round(one / puts, 3)
    return {"ratios": ratios, "cases": figures, "ideal_puts_per_gib": ideal, "batch_bytes": BATCH_BYTES,
            "value_bytes": VALUE_BYTES, "mib_per_topic": total // MiB}
