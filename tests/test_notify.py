"""memq.notify against a real Kafka (tansu): topic admin, publisher, consumer."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time

import pytest
from confluent_kafka import Producer

from memq.config import KafkaConfig
from memq.devcluster import DevCluster
from memq.devcluster.process import free_port
from memq.errors import CorruptDataError, NotifyError, UnknownTopicError, UnsupportedVersionError
from memq.format import NOTIFICATION_VERSION, Notification
from memq.notify import KafkaTopic, NotificationConsumer, NotificationPublisher, NotificationRecord, TopicAdmin

pytestmark = pytest.mark.integration

PARTITIONS = 4


def note(i: int, topic: str = "orders") -> Notification:
    return Notification(v=NOTIFICATION_VERSION, topic=topic, bucket="memq", key=f"ab/dev/topics/{topic}/{i:013d}",
                        size=1000 + i, header_size=64, message_count=3, logmessage_count=30 + i,
                        min_timestamp_ms=1_700_000_000_000 + i, max_timestamp_ms=1_700_000_000_500 + i,
                        crc32c=i * 7919 % 2**32, broker_id="b1", attempt=0, created_ms=1_700_000_001_000 + i)


@pytest.fixture
def kafka(devcluster: DevCluster) -> KafkaConfig:
    return devcluster.config().kafka


@pytest.fixture
def topic(kafka: KafkaConfig, unique_name) -> str:
    name = unique_name("n")
    TopicAdmin(kafka).create_topic(name, PARTITIONS)
    return name


async def publish_all(kafka: KafkaConfig, topic: str, notes: list[Notification]) -> list[tuple[int, int]]:
    pub = NotificationPublisher(kafka, client_id="test")
    try:
        return await asyncio.gather(*(pub.publish(topic, n) for n in notes))
    finally:
        pub.close()


def read_until(consumer: NotificationConsumer, count: int, timeout_s: float = 20) -> list[NotificationRecord]:
    out: list[NotificationRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        out += consumer.poll(0.5, max_records=1000)
    return out


def test_topic_admin(kafka: KafkaConfig, unique_name) -> None:
    admin = TopicAdmin(kafka)
    name = unique_name("adm")
    admin.create_topic(name, 3)
    admin.create_topic(name, 3)  # idempotent with the same partitions
    with pytest.raises(NotifyError, match=f"{name}.*3 partitions"):
        admin.create_topic(name, 5)
    assert admin.partitions(name) == 3
    assert name in admin.list_topics()
    admin.delete_topic(name)
    with pytest.raises(UnknownTopicError, match=name):
        admin.partitions(name)
    with pytest.raises(UnknownTopicError, match=name):
        admin.delete_topic(name)
    never = unique_name("never")
    with pytest.raises(UnknownTopicError):
        admin.partitions(never)
    assert never not in admin.list_topics()  # asking about it did not create it


def test_topic_admin_creates_many_topics_in_one_request_and_names_each_failure(kafka: KafkaConfig, unique_name) -> None:
    admin = TopicAdmin(kafka)
    base = unique_name("bulk")
    admin.create_topic(f"{base}-clash", 2)
    topics = [KafkaTopic(f"{base}-{i}", 1 + i % 3) for i in range(200)]
    failed = admin.create_topics([*topics, KafkaTopic(f"{base}-clash", 5)])
    assert failed == {f"{base}-clash": f"Kafka topic '{base}-clash' exists with 2 partitions, not 5"}
    assert all(admin.partitions(t.name) == t.partitions for t in topics[::37])
    assert admin.create_topics(topics) == {}   # all exist as asked: a no-op


async def test_publish_then_consume_everything(kafka: KafkaConfig, topic: str) -> None:
    notes = [note(i) for i in range(2000)]
    placed = await publish_all(kafka, topic, notes)
    assert len(set(placed)) == len(notes)
    assert {p for p, _ in placed} <= set(range(PARTITIONS))

    consumer = NotificationConsumer(kafka, topic, group_id="g-all")
    try:
        consumer.assign({p: 0 for p in range(PARTITIONS)})
        records = read_until(consumer, len(notes))
        assert len(records) == len(notes)
        by_place = {(r.partition, r.offset): r.notification for r in records}
        assert by_place == dict(zip(placed, notes))
        now = time.time() * 1000
        assert all(now - 60_000 < r.timestamp_ms <= now + 1000 for r in records)
        for p in range(PARTITIONS):
            assert consumer.watermarks(p) == (0, sum(1 for q, _ in placed if q == p))
        assert consumer.poll(0.2) == []
    finally:
        consumer.close()


async def test_one_pass_to_the_end_learns_every_partitions_true_end(kafka: KafkaConfig, topic: str) -> None:
    """`list_offsets` asks every partition at once; "latest" may be short (tansu 0.6: the last
    record batch's first offset + 1), and a fetch to the end with `partition_eof` tells the true end."""
    placed = await publish_all(kafka, topic, [note(i) for i in range(300)])
    ends = {p: sum(1 for q, _ in placed if q == p) for p in range(PARTITIONS)}
    consumer = NotificationConsumer(kafka, topic, group_id="g-eof", fetch_wait_ms=1, partition_eof=True)
    try:
        assert consumer.list_offsets(range(PARTITIONS)) == dict.fromkeys(range(PARTITIONS), 0)
        latest = consumer.list_offsets(range(PARTITIONS), latest=True)
        assert all(0 < latest[p] <= ends[p] for p in ends)
        consumer.assign(latest)
        deadline = time.monotonic() + 20
        while len(consumer.ends_reached()) < PARTITIONS and time.monotonic() < deadline:
            consumer.poll(0.5, 1000)
        assert consumer.ends_reached() == ends
        consumer.unassign()
        assert consumer.ends_reached() == {}
    finally:
        consumer.close()


async def test_a_burst_of_batches_spreads_over_every_read_partition(kafka: KafkaConfig, topic: str) -> None:
    """Read partitions are the consumer group's parallelism: a burst of notifications (a broker
    storing batches back to back) must not all land on one partition."""
    placed = await publish_all(kafka, topic, [note(i) for i in range(40)])
    per_partition = [sum(1 for p, _ in placed if p == q) for q in range(PARTITIONS)]
    assert all(n >= 3 for n in per_partition), per_partition


async def test_group_commit_committed_seek_position(kafka: KafkaConfig, topic: str, unique_name) -> None:
    placed = await publish_all(kafka, topic, [note(i) for i in range(200)])
    group = unique_name("g")
    assigned: list[list[int]] = []
    first = NotificationConsumer(kafka, topic, group_id=group)
    try:
        first.subscribe(on_assign=assigned.append)
        records = read_until(first, 200)
        assert len(records) == 200 and assigned == [list(range(PARTITIONS))]
        assert first.assignment() == list(range(PARTITIONS))
        # librdkafka's sticky partitioner may have put everything in fewer partitions
        ends = {p: max((o + 1 for q, o in placed if q == p), default=0) for p in range(PARTITIONS)}
        assert {p: o or 0 for p, o in first.position().items()} == ends
        assert first.committed(range(PARTITIONS)) == {p: None for p in range(PARTITIONS)}
        half = {p: o // 2 for p, o in ends.items()}
        first.commit(half)
        assert first.committed(range(PARTITIONS)) == half
        busiest = max(ends, key=ends.__getitem__)
        first.seek(busiest, 1)  # re-read it from offset 1
        again = read_until(first, ends[busiest] - 1)
        assert [(r.partition, r.offset) for r in again] == [(busiest, o) for o in range(1, ends[busiest])]
    finally:
        first.close()

    second = NotificationConsumer(kafka, topic, group_id=group)  # resumes at the commit
    try:
        second.subscribe()
        rest = read_until(second, sum(ends[p] - half[p] for p in ends))
        assert sorted((r.partition, r.offset) for r in rest) == sorted(
            (p, o) for p, o in placed if o >= half[p])
    finally:
        second.close()


async def test_offsets_for_times(kafka: KafkaConfig, topic: str) -> None:
    before = await publish_all(kafka, topic, [note(i) for i in range(40)])
    await asyncio.sleep(0.05)
    t_mid = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    after = await publish_all(kafka, topic, [note(i) for i in range(40, 100)])
    consumer = NotificationConsumer(kafka, topic, group_id="g-time")
    try:
        ends = {p: consumer.watermarks(p)[1] for p in range(PARTITIONS)}
        want = {p: min([o for q, o in after if q == p], default=ends[p]) for p in range(PARTITIONS)}
        assert consumer.offsets_for_times(t_mid) == want
        assert consumer.offsets_for_times(0) == {p: 0 for p in range(PARTITIONS)}
        assert consumer.offsets_for_times(t_mid + 3_600_000) == ends
        assert before  # both phases landed
    finally:
        consumer.close()


async def test_bad_payloads_name_partition_and_offset(kafka: KafkaConfig, topic: str) -> None:
    raw = Producer({"bootstrap.servers": kafka.bootstrap_servers, "acks": "all"})
    newer = json.loads(note(9).to_bytes()) | {"v": NOTIFICATION_VERSION + 1}
    for value in (note(0).to_bytes(), note(1).to_bytes(), b"\x00garbage", json.dumps(newer).encode(),
                  note(4).to_bytes()):
        raw.produce(topic, value, partition=2)
    assert raw.flush(10) == 0

    consumer = NotificationConsumer(kafka, topic, group_id="g-bad")
    try:
        consumer.assign({2: 0})
        good = read_until(consumer, 2)
        assert [(r.offset, r.notification) for r in good] == [(0, note(0)), (1, note(1))]
        for _ in range(2):  # the position stays on the bad record until the caller moves on
            with pytest.raises(CorruptDataError, match=f"{topic}.*partition 2 offset 2"):
                consumer.poll(5)
        consumer.seek(2, 3)
        with pytest.raises(UnsupportedVersionError, match="partition 2 offset 3"):
            consumer.poll(5)
        consumer.seek(2, 4)
        assert [(r.offset, r.notification) for r in read_until(consumer, 1)] == [(4, note(4))]
    finally:
        consumer.close()


async def test_publish_without_kafka_fails_naming_topic() -> None:
    dead = KafkaConfig(bootstrap_servers=f"127.0.0.1:{free_port()}", request_timeout_ms=1500)
    pub = NotificationPublisher(dead, client_id="test-dead")
    try:
        t0 = time.monotonic()
        with pytest.raises(NotifyError, match="nowhere"):
            await pub.publish("nowhere", note(0))
        assert time.monotonic() - t0 < 10
    finally:
        pub.close(timeout_s=1)
    with pytest.raises(NotifyError, match="closed"):
        await pub.publish("nowhere", note(0))


async def test_publish_many_places_each_note_and_fails_a_refused_one_alone(kafka: KafkaConfig, topic: str,
                                                                          unique_name) -> None:
    """One object's parts go out as one round: every note gets its own place or its own error,
    in the order given, and the round waits for all of them."""
    other = unique_name("n2")
    TopicAdmin(kafka).create_topic(other, 1)
    pub = NotificationPublisher(kafka, client_id="test-many")
    try:
        notes = [(topic, note(0)), ("bad/topic", note(1)), (other, note(2)), (topic, note(3))]
        results = await pub.publish_many(notes)
        assert [type(r) for r in results] == [tuple, NotifyError, tuple, tuple]
        assert "bad/topic" in str(results[1])
        assert results[2] == (0, 0)
        assert await pub.publish_many([]) == []
    finally:
        pub.close()
    consumer = NotificationConsumer(kafka, topic, group_id="g-many")
    try:
        consumer.assign({p: 0 for p in range(PARTITIONS)})
        got = {(r.partition, r.offset): r.notification for r in read_until(consumer, 2)}
        assert got == {results[0]: note(0), results[3]: note(3)}
    finally:
        consumer.close()


async def test_a_round_larger_than_librdkafka_s_queue_is_published_whole(kafka: KafkaConfig, topic: str) -> None:
    """librdkafka refuses messages beyond its queue (BufferError): the round waits for room and
    goes on where it stopped, so no part of a large object is skipped or sent twice."""
    small = dataclasses.replace(kafka, properties=("queue.buffering.max.messages=7",))
    pub = NotificationPublisher(small, client_id="test-small-queue")
    try:
        results = await pub.publish_many([(topic, note(i)) for i in range(60)])
    finally:
        pub.close()
    assert all(isinstance(r, tuple) for r in results), results
    assert len(set(results)) == 60
    consumer = NotificationConsumer(kafka, topic, group_id="g-small-queue")
    try:
        consumer.assign({p: 0 for p in range(PARTITIONS)})
        got = {(r.partition, r.offset): r.notification for r in read_until(consumer, 60)}
        assert got == {place: note(i) for i, place in enumerate(results)}
    finally:
        consumer.close()


async def test_each_topic_keeps_one_producer_so_its_notifications_stay_in_order(kafka: KafkaConfig,
                                                                               unique_name) -> None:
    """With several producers, a topic's notifications always go through the same one: each
    (one-partition) topic's offsets follow the order its notes were published in."""
    topics = [unique_name(f"o{i}") for i in range(8)]
    admin = TopicAdmin(kafka)
    for t in topics:
        admin.create_topic(t, 1)
    pub = NotificationPublisher(kafka, client_id="test-shards", producers=3)
    try:
        pollers = {t.name for t in threading.enumerate() if t.name.startswith("memq-notify-test-shards-")}
        assert len(pollers) == 3
        rounds = [[(t, note(r * 10 + j, t)) for t in topics for j in range(10)] for r in range(5)]
        results = await asyncio.gather(*(pub.publish_many(r) for r in rounds))
        assert pub.health() is None and pub.rebuilds == 0
    finally:
        pub.close()
    for t in topics:
        placed = [res for rnd, out in zip(rounds, results) for (topic, _), res in zip(rnd, out) if topic == t]
        assert placed == [(0, offset) for offset in range(50)], t
