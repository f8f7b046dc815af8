"""Consumer throughput: the same N messages (100-byte values) read through memq's Consumer
(notifications from tansu, batches from moto S3) and through confluent-kafka's consumer
straight from tansu, in one run on one dev cluster.

Both rates are measured from the group assignment to the N-th message in the
application's hands, so the group join (the same Kafka protocol on both sides) does not
count; totals with the join are reported too. Each side reads every message in Python. Ratio `vs_kafka` = memq msg/s / Kafka msg/s, higher is better.
memq reads with its default path (`consumer.read_path = auto`: the parts are young, so through the
broker's read cache), then again from S3 directly (`read_path = s3`, a fresh group): `vs_kafka_s3`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.admin import AdminClient, NewTopic

from bench._cluster import bench_cluster, read_memq
from memq.client.producer import Producer
from memq.config import KafkaConfig, MemqConfig, TopicConfig

VALUE_BYTES = 100
PARTITIONS = 3
TIMEOUT_S = 120.0


def _produce_memq(config: MemqConfig, topic: str, n: int) -> None:
    values = [b"%099d" % i + b"\n" for i in range(n)]   # 100 bytes each, all different

    async def send() -> None:
        async with Producer(config.producer) as producer:
            futures = [await producer.send_many(topic, values[i:i + 20_000]) for i in range(0, n, 20_000)]
            await asyncio.gather(*futures)

    asyncio.run(asyncio.wait_for(send(), TIMEOUT_S))


def _produce_kafka(bootstrap: str, topic: str, n: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    producer = KafkaProducer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20,
                              "batch.size": 1 << 20, "queue.buffering.max.messages": 1_000_000})
    for i in range(n):
        while True:
            try:
                producer.produce(topic, b"%099d" % i + b"\n")
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(60) != 0:
        raise RuntimeError("Kafka producer did not deliver every message")


def _read_kafka(kafka: KafkaConfig, topic: str, n: int) -> tuple[float, float]:
    t0 = time.monotonic()
    assigned: list[float] = []
    # group timings as memq's notification consumer uses them, so both join alike
    c = KafkaConsumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                       "auto.offset.reset": "earliest", "enable.auto.commit": False,
                       "session.timeout.ms": kafka.session_timeout_ms,
                       "heartbeat.interval.ms": max(100, kafka.session_timeout_ms // 6)})
    got = 0
    try:
        c.subscribe([topic], on_assign=lambda *_: assigned.append(time.monotonic()))
        deadline = t0 + TIMEOUT_S
        while got < n and time.monotonic() < deadline:
            for m in c.consume(num_messages=10_000, timeout=1.0):
                if m.error() is None:
                    got += 1
        end = time.monotonic()
    finally:
        c.close()
    if got < n:
        raise RuntimeError(f"Kafka consumer read {got} of {n}")
    return end - assigned[0], end - t0


def run(quick: bool) -> dict:
    n = 1_000_000 if quick else 2_000_000
    name = f"bench-consume-{uuid.uuid4().hex[:6]}"
    with bench_cluster([TopicConfig(name=name, read_partitions=PARTITIONS)]) as bc:
        dc, config = bc.dc, bc.config
        print(f"producing {n:,} messages of {VALUE_BYTES} B to memq and to Kafka", flush=True)
        _produce_memq(config, name, n)
        assert dc.kafka_bootstrap is not None
        _produce_kafka(dc.kafka_bootstrap, name + "-kafka", n)
        memq = read_memq(config, name, n, TIMEOUT_S)
        memq_s, memq_total_s = memq.read_s, memq.total_s
        print(f"memq consumer:  {n / memq_s:,.0f} msg/s ({memq_total_s:.1f} s with group join)", flush=True)
        direct = dataclasses.replace(config, consumer=dataclasses.replace(config.consumer, read_path="s3"))
        s3_s = read_memq(direct, name, n, TIMEOUT_S).read_s
        print(f"memq consumer reading S3 directly: {n / s3_s:,.0f} msg/s", flush=True)
        kafka_s, kafka_total_s = _read_kafka(config.kafka, name + "-kafka", n)
        print(f"kafka consumer: {n / kafka_s:,.0f} msg/s ({kafka_total_s:.1f} s with group join)", flush=True)
    return {
        "ratios": {"vs_kafka": round(kafka_s / memq_s, 2), "vs_kafka_s3": round(kafka_s / s3_s, 2)},
        "messages": n,
        "value_bytes": VALUE_BYTES,
        "memq_msgs_per_s": round(n / memq_s),
        "memq_s3_msgs_per_s": round(n / s3_s),
        "kafka_msgs_per_s": round(n / kafka_s),
        "memq_total_s": round(memq_total_s, 2),
        "kafka_total_s": round(kafka_total_s, 2),
    }
