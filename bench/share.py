"""Share groups: confluent-kafka ShareConsumers reading a memq topic as a queue, vs a consumer group.

One dev cluster (moto S3, tansu, ZooKeeper) and one governed broker process with its Kafka
listener on (share-partition state in ZooKeeper, `share.auto_offset_reset = earliest` through
the environment). A confluent-kafka Producer writes the 100-byte values to a topic of
`PARTITIONS` read partitions; then `SHARE_CONSUMERS` ShareConsumers (one process each, implicit
acknowledgement: every record accepted) read them all as one share group, and `PARTITIONS`
plain Consumers (one process each, one consumer group, the same topic) read them again; the two
alternate `--runs` times (a new group each), best of each counts.
`ratios.vs_group` is share records/s over group records/s (the price of per-record
acknowledgement); `acks_per_s` the acknowledgements the broker persisted per second (its
`memq_share_acknowledged` over the share read's time); `state_writes_per_1000_acks` the
share-partition state writes (ZooKeeper sets, `memq_share_state_writes`) per 1,000 of them.
Each read is timed from its readers' start, so the consumer group's joins and rebalances count:
with `--quick`'s 100,000 records they are most of its time (`vs_group` near 3 there, 0.77 at 1M).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import tempfile
import time
import urllib.request
from collections.abc import Callable
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path

from bench._cluster import kafka_produce_s
from bench.kafka_produce import _kafka_address, _values
from memq.config import BrokerConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster

MiB = 1024 ** 2
TOPIC = "bench-share"
PARTITIONS = 4
SHARE_CONSUMERS = 8
READ_TIMEOUT_S = 600


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=None, help="values written, then read by each reader kind")
    parser.add_argument("--runs", type=int, default=None, help="reads per reader kind, interleaved (best counts)")


def _share_reader(address: str, group: str, count: Synchronized, stop: Synchronized) -> None:   # type: ignore[type-arg]
    from confluent_kafka import ShareConsumer
    c = ShareConsumer({"bootstrap.servers": address, "group.id": group})
    c.subscribe([TOPIC])
    try:
        while not stop.value:
            got = sum(1 for m in c.poll(0.5) or [] if m.error() is None)
            if got:
                with count.get_lock():
                    count.value += got
        c.commit_sync()
    finally:
        c.close()


def _group_reader(address: str, group: str, count: Synchronized, stop: Synchronized) -> None:   # type: ignore[type-arg]
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": address, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.partition.eof": False})
    c.subscribe([TOPIC])
    try:
        while not stop.value:
            got = sum(1 for m in c.consume(10_000, 0.5) if m.error() is None)
            if got:
                with count.get_lock():
                    count.value += got
    finally:
        c.close()


def read_rate(target: Callable[..., None], readers: int, address: str, group: str, n: int) -> float:
    """Records/s until `n` were read by `readers` processes running `target` (all of them, or it raises)."""
    ctx = multiprocessing.get_context("spawn")
    count, stop = ctx.Value("q", 0), ctx.Value("b", 0)
    procs = [ctx.Process(target=target, args=(address, group, count, stop)) for _ in range(readers)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    try:
        while count.value < n:
            if time.perf_counter() - t0 > READ_TIMEOUT_S:
                raise RuntimeError(f"{group}: read {count.value} of {n} within {READ_TIMEOUT_S} s")
            time.sleep(0.05)
        elapsed = time.perf_counter() - t0
    finally:
        stop.value = 1
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    return n / elapsed


def _metric(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def run(quick: bool, messages: int | None = None, runs: int | None = None) -> dict:
    n = messages or (100_000 if quick else 1_000_000)
    runs = runs or (1 if quick else 2)
    os.environ["MEMQ_SHARE_AUTO_OFFSET_RESET"] = "earliest"   # the broker process reads it
    with tempfile.TemporaryDirectory(prefix="memq-bench-") as tmp, \
            DevCluster(Path(tmp) / "servers") as dc, \
            GovernedCluster(tmp, brokers=1, servers=dc, cluster="bench", broker=BrokerConfig(kafka_port=0)) as gc:
        gc.create_topic(TopicConfig(TOPIC, read_partitions=PARTITIONS, batch_bytes=8 * MiB, batch_ms=100))
        url = gc.broker("b1").url
        address = _kafka_address(url)
        kafka_produce_s(address, TOPIC, _values(n))
        print(f"wrote {n:,} x 100 B to {TOPIC} ({PARTITIONS} partitions) through {address}", flush=True)
        share_rates: list[float] = []
        group_rates: list[float] = []
        for i in range(runs):   # interleaved, so drift on a shared machine hits both alike
            share_rates.append(read_rate(_share_reader, SHARE_CONSUMERS, address, f"bench-share-{i}", n))
            print(f"share group of {SHARE_CONSUMERS}: {share_rates[-1]:,.0f} records/s", flush=True)
            group_rates.append(read_rate(_group_reader, PARTITIONS, address, f"bench-group-{i}", n))
            print(f"consumer group of {PARTITIONS}: {group_rates[-1]:,.0f} records/s", flush=True)
        time.sleep(1.0)   # the last acknowledgements and their write
        text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    acks = _metric(text, "memq_share_acknowledged_total")
    writes = _metric(text, "memq_share_state_writes_total")
    share_rate, group_rate = max(share_rates), max(group_rates)
    share_s = sum(n / r for r in share_rates)   # every share run's acknowledgements over their time
    return {"ratios": {"vs_group": round(share_rate / group_rate, 3)},
            "records_per_s": round(share_rate), "group_records_per_s": round(group_rate),
            "records": n, "runs": runs, "acknowledged": int(acks), "every_record_acknowledged": acks == runs * n,
            "acks_per_s": round(acks / share_s), "state_writes": int(writes),
            "state_writes_per_1000_acks": round(writes / max(acks, 1) * 1000, 3),
            "share_consumers": SHARE_CONSUMERS, "partitions": PARTITIONS}
