"""Kafka-protocol produce: a confluent-kafka Producer writing to memq's Kafka listener vs to tansu.

One dev cluster (moto S3, tansu, ZooKeeper) and one governed broker process with its Kafka
listener on; the same Producer settings (100-byte values, acks=all, linger.ms=5) write to a
3-partition memq topic through the listener (stored in S3 and notified before each ack) and to
a 3-partition topic on tansu. Runs alternate, best of `--runs` each; ratio key `vs_tansu` is
memq msg/s over tansu msg/s. Kafka's protocol has no "flush" a broker could see, so the last
batch of each run seals by age: `--batch-ms` (default the topic default) is part of every
run's time, which a short (`--quick`) run feels most.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from memq.client.cluster import fetch_metadata
from memq.config import BrokerConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster

MiB = 1024 ** 2
VALUE_BYTES = 100
PARTITIONS = 3
TOPIC = "bench-kafka-api"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=None, help="values per run")
    parser.add_argument("--runs", type=int, default=None, help="runs per target (best counts)")
    parser.add_argument("--batch-ms", type=int, default=TopicConfig.batch_ms,
                        help="the memq topic's batch_ms (a Kafka producer cannot ask for an early seal, "
                             "so each run's last batch waits this long)")


def _values(n: int) -> list[bytes]:
    """`n` values of VALUE_BYTES: hex of random bytes (compressible like text), 1024 distinct."""
    pool = [os.urandom(VALUE_BYTES // 2).hex().encode()[:VALUE_BYTES] for _ in range(1024)]
    return [pool[i % 1024] for i in range(n)]


def _produce_s(bootstrap: str, topic: str, values: list[bytes]) -> float:
    """Seconds for a confluent-kafka Producer to send every value and get every acks=all."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.num.messages": 10_000,
                  "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 1_048_576})
    delivered = 0

    def on_delivery(err: object, _msg: object) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1

    t0 = time.perf_counter()
    produce = p.produce
    for v in values:
        try:
            produce(topic, v, on_delivery=on_delivery)
        except BufferError:
            p.poll(0.01)
            produce(topic, v, on_delivery=on_delivery)
    p.flush(120)
    elapsed = time.perf_counter() - t0
    if delivered != len(values):
        raise RuntimeError(f"{bootstrap}: delivered {delivered} of {len(values)}")
    return elapsed


def _kafka_address(broker_url: str) -> str:
    """The broker's Kafka listener, as its metadata advertises it."""
    (address,) = [b.kafka_address for b in fetch_metadata(broker_url, 10.0).brokers if b.url == broker_url]
    return address


def run(quick: bool, messages: int | None = None, runs: int | None = None,
        batch_ms: int = TopicConfig.batch_ms) -> dict:
    n = messages or (200_000 if quick else 1_000_000)
    runs = runs or (2 if quick else 3)
    with tempfile.TemporaryDirectory(prefix="memq-bench-") as tmp, \
            DevCluster(Path(tmp) / "servers") as dc, \
            GovernedCluster(tmp, brokers=1, servers=dc, cluster="bench", broker=BrokerConfig(kafka_port=0)) as gc:
        gc.create_topic(TopicConfig(TOPIC, read_partitions=PARTITIONS, batch_bytes=8 * MiB, ring_slots=4,
                                    batch_ms=batch_ms))
        memq_at = _kafka_address(gc.broker("b1").url)
        tansu_at = dc.kafka_bootstrap or ""
        admin = AdminClient({"bootstrap.servers": tansu_at})   # kept alive until the topic exists
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(30)
        print(f"memq Kafka listener {memq_at}; tansu {tansu_at}", flush=True)
        values = _values(n)
        _produce_s(memq_at, TOPIC, values[:20_000])    # warm up both: connections, metadata
        _produce_s(tansu_at, TOPIC, values[:20_000])
        memq_rates, tansu_rates = [], []
        for _ in range(runs):   # interleaved, so drift on a shared machine hits both alike
            memq_rates.append(n / _produce_s(memq_at, TOPIC, values))
            tansu_rates.append(n / _produce_s(tansu_at, TOPIC, values))
            print(f"acks=all {VALUE_BYTES} B: memq {memq_rates[-1]:,.0f} msg/s, tansu {tansu_rates[-1]:,.0f} msg/s",
                  flush=True)
    best_memq, best_tansu = max(memq_rates), max(tansu_rates)
    return {"ratios": {"vs_tansu": round(best_memq / best_tansu, 3)},
            "memq_kafka_msg_s": round(best_memq), "tansu_msg_s": round(best_tansu),
            "messages": n, "value_bytes": VALUE_BYTES, "runs": runs, "batch_ms": batch_ms}
