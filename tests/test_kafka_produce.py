"""Kafka producers (confluent-kafka, kcat) write through a broker's Kafka listener on the real
dev cluster (moto S3, tansu); memq's Consumer and the Spark source read back exactly that."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.kafka_clients import Row, Running, as_rows, broker_thread, kafka_produce, rows
from confluent_kafka import KafkaError, Producer
from tests.support.audit import audit_config
from tests.support.waiting import async_wait_for

from memq.audit.books import GroupSummary
from memq.audit.dashboard import AuditService
from memq.audit.emitter import AuditEmitter, make_audit_sink

from memq.client.cluster import fetch_metadata
from memq.client.consumer import Consumer
from memq.config import BrokerConfig, MemqConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster
from memq.format import LogMessage

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]



@pytest.fixture(scope="module")
def running(devcluster: DevCluster) -> Iterator[Running]:
    with broker_thread(dataclasses.replace(devcluster.config(cluster="kafkaapi"),
                                           broker=BrokerConfig(kafka_port=0))) as r:
        yield r


def consume(config: MemqConfig, topic: str, n: int, timeout_s: float = 60, *,
            audit: AuditEmitter | None = None) -> list[Row]:
    got: list[Row] = []
    with Consumer(config, topic, group_id=f"g-{uuid.uuid4().hex[:8]}", audit=audit) as c:
        deadline = time.monotonic() + timeout_s
        while len(got) < n:
            assert time.monotonic() < deadline, f"read {len(got)} of {n} records"
            got.extend((r.value, r.key, tuple(map(tuple, r.headers)), r.timestamp_ms) for r in c.poll(0.5))
        got.extend((r.value, r.key, tuple(map(tuple, r.headers)), r.timestamp_ms) for r in c.poll(1.0))
    return got


@pytest.mark.parametrize("acks,idempotence,codec", [
    ("all", True, "zstd"), ("all", True, "lz4"), ("all", False, "gzip"), ("1", False, "snappy"), ("0", False, "none"),
])
def test_confluent_kafka_producer_writes_what_the_consumer_reads(running: Running, acks: str, idempotence: bool,
                                                                 codec: str) -> None:
    topic = running.add_topic()
    sent = rows(2_000, codec)
    kafka_produce(running.broker.kafka_address, topic, sent, acks=acks, **{"enable.idempotence": idempotence,
                                                                          "compression.type": codec})
    assert sorted(consume(running.config, topic, len(sent))) == sorted(as_rows(sent))


def test_kcat_writes_values_keys_and_headers(running: Running) -> None:
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed (Debian package kcat)")
    topic = running.add_topic()
    lines = [f"k{i}:value {i}" for i in range(200)]
    before = int(time.time() * 1000)
    run = subprocess.run([kcat, "-P", "-b", running.broker.kafka_address, "-t", topic, "-K:", "-H", "via=kcat",
                          "-X", "compression.codec=zstd"],
                         input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    got = consume(running.config, topic, len(lines))
    assert sorted((v, k, h) for v, k, h, _ in got) == sorted(
        (f"value {i}".encode(), f"k{i}".encode(), (("via", b"kcat"),)) for i in range(200))
    assert all(before <= ts <= int(time.time() * 1000) for *_, ts in got)


def test_spark_reads_what_a_kafka_producer_wrote(running: Running, spark: Any) -> None:
    from pyspark.sql import functions as F

    topic = running.add_topic(partitions=2)
    sent = rows(1_000, "spark")
    kafka_produce(running.broker.kafka_address, topic, sent, acks="all", **{"compression.type": "lz4"})
    consume(running.config, topic, len(sent))   # stored and announced
    c = running.config
    df = (spark.read.format("memq").option("memq.broker", running.broker.url).option("topic", topic)
          .option("s3.accessKeyId", c.s3.access_key_id or "").option("s3.secretAccessKey", c.s3.secret_access_key or "")
          .load())
    got = df.select("value", "key", "headers", F.expr("unix_millis(timestamp)").alias("ts")).collect()
    assert sorted((bytes(r.value), None if r.key is None else bytes(r.key),
                   tuple((h.key, bytes(h.value)) for h in r.headers), r.ts) for r in got) == sorted(as_rows(sent))


def test_kafka_producer_follows_a_topic_the_governor_moves(devcluster: DevCluster, tmp_path: Path) -> None:
    """Drained off b1, the topic lives on b2 alone: a producer that wrote to b1 is told
    NOT_LEADER_OR_FOLLOWER, re-reads metadata and goes on on b2, losing nothing."""
    cluster = f"kmove-{uuid.uuid4().hex[:6]}"
    topic = f"moved-{uuid.uuid4().hex[:6]}"
    with GovernedCluster(tmp_path, brokers=2, servers=devcluster, cluster=cluster, session_timeout_s=2.0,
                         broker=BrokerConfig(kafka_port=0)) as gc:
        assert set(gc.create_topic(TopicConfig(name=topic, read_partitions=2, batch_ms=50), brokers=2)) == {"b1", "b2"}
        listeners = {b.id: b.kafka_address for b in fetch_metadata(gc.broker("b1").url, 10.0).brokers}
        p = Producer({"bootstrap.servers": listeners["b1"], "acks": "all", "enable.idempotence": True,
                      "linger.ms": 5, "message.timeout.ms": 60_000})
        errors: list[KafkaError] = []
        first, second = rows(400, "before"), rows(400, "after")

        def send(records: list[LogMessage]) -> None:
            for r in records:
                p.produce(topic, value=r.value, key=r.key, headers=list(r.headers) or None,
                          timestamp=r.timestamp_ms, on_delivery=lambda e, _m: errors.append(e) if e else None)
            assert p.flush(60) == 0

        send(first)
        gc.registry.set_drain("b1")
        assert gc.wait_placed(topic, brokers=1) == ("b2",)
        send(second)
        assert errors == []
        assert "NOT_LEADER_OR_FOLLOWER" in gc.broker("b1").log_tail()   # the redirect did happen
        assert sorted(consume(gc.config(), topic, len(first) + len(second))) == sorted(as_rows(first + second))


async def test_the_audit_counts_what_kafka_producers_wrote(devcluster: DevCluster, unique_name: Callable[[str], str],
                                                           tmp_path: Path) -> None:
    """A Kafka client carries no memq audit emitter: the broker reports its acked Messages, so the
    books balance against memq's Consumer (acks=0 writes are not reported, as memq's own ack=0); a
    transaction's are reported by its coordinator when it commits, an aborted one's counted apart."""
    config = audit_config(dataclasses.replace(devcluster.config(cluster=unique_name("kaudit")),
                                              broker=BrokerConfig(kafka_port=0)), unique_name)
    service = AuditService(config, db_path=str(tmp_path / "audit.db"), port=0)
    await service.start()
    try:
        with broker_thread(config) as r:
            topic = r.add_topic(partitions=2)
            sent = rows(1_500, "audited")
            await asyncio.to_thread(kafka_produce, r.broker.kafka_address, topic, sent[:1_000], acks="all",
                                    **{"enable.idempotence": True, "compression.type": "zstd"})
            await asyncio.to_thread(kafka_produce, r.broker.kafka_address, topic, sent[1_000:], acks="1")
            committed, aborted = rows(200, "txn-committed"), rows(50, "txn-aborted")
            await asyncio.to_thread(_transactions, r.broker.kafka_address, topic, [(committed, True), (aborted, False)])
            sent += committed
            sink = make_audit_sink(config, client_id="kaudit-consumer")
            assert sink is not None
            try:
                got = await asyncio.to_thread(consume, config, topic, len(sent), audit=sink)
            finally:
                assert sink.flush(10) == 0
                sink.close()
        assert sorted(got) == sorted(as_rows(sent))

        def row() -> GroupSummary | None:
            rows_ = [s for s in service.auditor.read(lambda b: b.summary(int(time.time() * 1000))) if s.topic == topic]
            return rows_[0] if rows_ else None

        await async_wait_for(lambda: (x := row()) is not None and x.produced == x.consumed == len(sent)
                             and x.aborted == len(aborted), 30, "the broker's and the consumer's audit records")
        x = row()
        assert x is not None and (x.lost, x.duplicates, x.mismatches) == (0, 0, 0)
    finally:
        await service.stop()


def _transactions(address: str, topic: str, txns: list[tuple[list[LogMessage], bool]]) -> None:
    """One transactional confluent-kafka producer: each (records, commit) as one transaction."""
    p = Producer({"bootstrap.servers": address, "transactional.id": f"audit-{uuid.uuid4().hex[:6]}", "linger.ms": 5})
    p.init_transactions(30)
    for records, commit in txns:
        p.begin_transaction()
        for i, r in enumerate(records):
            p.produce(topic, value=r.value, key=r.key, headers=list(r.headers) or None, timestamp=r.timestamp_ms,
                      partition=i % 2)
        assert p.flush(30) == 0
        (p.commit_transaction if commit else p.abort_transaction)(30)


def test_a_kafka_producer_waiting_on_acks_gets_its_batch_sealed_when_it_is_large(running: Running) -> None:
    """Kafka has no flush a broker could see: a connection gone quiet with acks=all pending is a
    producer waiting, so a batch of kafka_idle_seal_bytes (1 MiB) or more seals at once; then a
    small one still waits for batch_ms (its connection spent its credit: no object per request
    for a trickle)."""
    topic = running.add_topic(partitions=1, batch_ms=8_000)
    acked: list[int] = []
    p = Producer({"bootstrap.servers": running.broker.kafka_address, "acks": "all", "linger.ms": 5,
                  "message.timeout.ms": 60_000})
    for i in range(3):                                   # ~1.5 MiB, then the producer waits
        p.produce(topic, os.urandom(500_000), on_delivery=lambda e, _m: acked.append(0 if e else 1))
    assert p.flush(6) == 0 and acked == [1, 1, 1], "the large batch waited for batch_ms (8 s)"
    p.produce(topic, b"small", on_delivery=lambda e, _m: acked.append(0 if e else 1))
    assert p.flush(2) == 1, "a small batch must wait for batch_ms, not seal on every quiet moment"
    assert p.flush(30) == 0 and acked == [1, 1, 1, 1]


def test_a_bulk_kafka_producer_gets_its_last_small_batch_sealed_when_it_waits(running: Running) -> None:
    """A connection that sent kafka_idle_seal_bytes or more has credit for an early seal: the
    small batch left at the end of a bulk send (the rest sealed at batch_bytes) goes as soon as
    the producer waits, not after batch_ms."""
    topic = running.add_topic(partitions=1, batch_ms=8_000, batch_bytes=1024 * 1024, max_message_bytes=1024 * 1024)
    acked: list[int] = []
    p = Producer({"bootstrap.servers": running.broker.kafka_address, "acks": "all", "linger.ms": 5,
                  "message.timeout.ms": 60_000})
    for _ in range(8):              # ~4 MB: batches seal at 1 MiB, a smaller last one is left
        p.produce(topic, os.urandom(500_000), on_delivery=lambda e, _m: acked.append(0 if e else 1))
    p.produce(topic, b"tail", on_delivery=lambda e, _m: acked.append(0 if e else 1))
    assert p.flush(4) == 0, "the bulk's last small batch waited for batch_ms (8 s)"
    assert acked == [1] * 9
