"""The audit proven end to end: real Producer -> broker process -> S3 + Kafka -> real Consumer.

Both clients carry an `AuditEmitter`. One batch object is deleted from S3 before it is read
(the consumer skips it), one batch is read twice (a re-delivery): the auditor must report
exactly that batch's LogMessages as lost, in the window they were produced, and exactly the
re-read batch's LogMessages as duplicates; a topic with no fault must balance exactly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest
from tests.support.audit import GRACE_S, audit_config
from tests.support.waiting import async_wait_for

from memq.audit.books import BOOKS_MS
from memq.audit.dashboard import AuditService
from memq.audit.emitter import make_audit_sink
from memq.client.consumer import Consumer, notification_topic
from memq.client.producer import Delivery, Producer
from memq.config import MemqConfig, ProducerConfig, TopicConfig
from memq.devcluster import DevCluster
from memq.devcluster.broker_process import BrokerProcess
from memq.notify import TopicAdmin

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
ROUNDS, PER_ROUND = 6, 150


async def produce(config: MemqConfig, topics: list[str]) -> dict[str, list[Delivery]]:
    """ROUNDS rounds per topic, each acked before the next, so each round is its own batch."""
    sink = make_audit_sink(config, client_id="e2e-producer")
    out: dict[str, list[Delivery]] = defaultdict(list)
    try:
        async with Producer(config.producer, audit=sink) as producer:
            for r in range(ROUNDS):
                for t in topics:
                    fut = await producer.send_many(t, [b"r%d-%d" % (r, i) for i in range(PER_ROUND)])
                    out[t].extend(await asyncio.wait_for(fut, 30))
                await asyncio.sleep(0.15)          # > batch_ms: the next round seals a new batch
    finally:
        if sink is not None:
            assert sink.flush(10) == 0
            sink.close()
    return out


def consume(config: MemqConfig, topic: str, group: str, expect: int, *, reread: Delivery | None = None) -> int:
    """Read `expect` records (skipping lost batches), then optionally re-read one batch."""
    sink = make_audit_sink(config, client_id="e2e-consumer")
    got = 0
    try:
        with Consumer(config, topic, group_id=group, audit=sink) as consumer:
            deadline = time.monotonic() + 60
            while got < expect and time.monotonic() < deadline:
                got += sum(1 for _ in consumer.poll(0.5))
            if reread is not None:
                consumer.seek(reread.partition, reread.offset)
                target, deadline = got + PER_ROUND, time.monotonic() + 30
                while got < target and time.monotonic() < deadline:
                    got += sum(1 for _ in consumer.poll(0.5))
            for _ in range(3):                     # nothing more arrives
                got += sum(1 for _ in consumer.poll(0.2))
    finally:
        if sink is not None:
            assert sink.flush(10) == 0
            sink.close()
    return got


async def test_audit_through_the_real_clients(devcluster: DevCluster, unique_name: Callable[[str], str],
                                              tmp_path: Path) -> None:
    clean, lossy = unique_name("clean"), unique_name("lossy")
    # sparse: the groups read after the broker stopped (a dense topic's reader asks a broker where its
    # offsets stand) and re-read a batch by its delivery's notification offset
    topics = [TopicConfig(name=t, read_partitions=2, batch_ms=50, offsets="sparse") for t in (clean, lossy)]
    base = audit_config(devcluster.config(topics=topics), unique_name)
    base = dataclasses.replace(base, consumer=dataclasses.replace(base.consumer, on_data_loss="skip",
                                                                  dedup=False))
    admin = TopicAdmin(base.kafka)
    for t in topics:
        admin.create_topic(notification_topic(base, t.name), t.read_partitions)
    service = AuditService(base, db_path=str(tmp_path / "audit.db"), port=0)
    await service.start()
    try:
        with BrokerProcess(base, tmp_path / "broker") as broker:
            config = dataclasses.replace(base, producer=ProducerConfig(brokers=broker.url, ack="all"))
            deliveries = await produce(config, [clean, lossy])

        total = ROUNDS * PER_ROUND
        by_object: dict[str, list[Delivery]] = defaultdict(list)
        for d in deliveries[lossy]:
            by_object[d.key].append(d)
        assert len(by_object) >= 3, "expected several batch objects"
        # In the order produced (rounds are acked one by one), not by offset: offsets of the two
        # notification partitions do not compare, and a victim produced last would be backlog,
        # never loss, as no later consumption passes it.
        keys = list(by_object)
        victim = by_object[keys[1]]                       # not the first batch the group reads
        lost = sum(d.count for d in victim)
        s3 = boto3.client("s3", endpoint_url=devcluster.s3_endpoint, region_name=base.s3.region,
                          aws_access_key_id=base.s3.access_key_id or "test",
                          aws_secret_access_key=base.s3.secret_access_key or "test")
        s3.delete_object(Bucket=victim[0].bucket, Key=victim[0].key)
        again = by_object[keys[-1]][0]
        dup = sum(d.count for d in by_object[keys[-1]])

        got_clean = await asyncio.to_thread(consume, config, clean, "g-clean", total)
        got_lossy = await asyncio.to_thread(consume, config, lossy, "g-lossy", total - lost, reread=again)
        assert got_clean == total and got_lossy == total - lost + dup

        await async_wait_for(lambda: service.auditor.read(
            lambda b: b.summary(int(time.time() * 1000))[0].produced) == total, 20, "audit records")
        await asyncio.sleep(GRACE_S + 1.5)

        def summary() -> dict:
            return {r.topic: r for r in service.auditor.read(lambda b: b.summary(int(time.time() * 1000)))}

        # loss is decided once the group's later consumption records are in (a loaded box is slower)
        try:
            await async_wait_for(lambda: summary()[lossy].lost == lost, 30, "the deleted batch counted as lost")
        except AssertionError as e:   # once seen on a loaded CI run: say what the books held instead
            raise AssertionError(f"{e}: expected {lost} lost of {len(victim)} Messages in "
                                 f"{victim[0].key}; books: {summary()[lossy]}") from None
        rows = summary()
        c, x = rows[clean], rows[lossy]
        assert (c.group, c.produced, c.consumed, c.lost, c.duplicates, c.mismatches) == ("g-clean", total, total, 0, 0, 0)
        assert (x.group, x.produced, x.consumed, x.lost, x.duplicates, x.mismatches) == (
            "g-lossy", total, total - lost, lost, dup, 0)
        assert c.p99_ms is not None and c.p99_ms < 30_000

        # The loss sits in the book windows the victim's Messages were produced in.
        lost_at = service.auditor.read(
            lambda b: {s: w.lost for s, w in b.series(BOOKS_MS, lossy, "g-lossy", 0) if w.lost})
        produced_at = service.auditor.read(
            lambda b: {s for s, w in b.series(BOOKS_MS, lossy, "", 0) if w.produced})
        assert sum(lost_at.values()) == lost and set(lost_at) <= produced_at
    finally:
        await service.stop()
