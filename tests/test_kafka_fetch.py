"""Kafka consumers (confluent-kafka, assigned partitions) read memq through a broker's Kafka
listener on the real dev cluster (moto S3, tansu): what memq's Producer and Kafka producers
wrote comes back with identical values, keys, headers and timestamps, at offsets that are a
pure function of where each record is."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from tests.support.kafka_clients import (Row, Running, as_rows, broker_thread, kafka_produce, memq_produce,
                                         rows)

from memq.client.cluster import fetch_metadata
from memq.config import BrokerConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster
from memq.kafka_api.offsets import split_offset

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def running(devcluster: DevCluster) -> Iterator[Running]:
    with broker_thread(dataclasses.replace(devcluster.config(cluster="kafkafetch"),
                                           broker=BrokerConfig(kafka_port=0))) as r:
        yield r


def kafka_consumer(running: Running, **conf: object) -> Consumer:
    return Consumer({"bootstrap.servers": running.broker.kafka_address, "group.id": "unused",
                     "enable.auto.commit": False, "fetch.wait.max.ms": 200, **conf})


def read(c: Consumer, n: int, timeout_s: float = 60) -> list[tuple[int, int, Row]]:
    """(partition, offset, row) of the next `n` records; fails on any consumer error."""
    got: list[tuple[int, int, Row]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n:
        assert time.monotonic() < deadline, f"read {len(got)} of {n} records"
        for m in c.consume(1000, 0.5):
            err = m.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                continue
            kind, ts = m.timestamp()
            got.append((m.partition(), m.offset(), (m.value(), m.key(), tuple(m.headers() or ()), ts)))
    return got


def assign_all(c: Consumer, topic: str, partitions: int, offset: int = OFFSET_BEGINNING) -> None:
    c.assign([TopicPartition(topic, p, offset) for p in range(partitions)])


def test_records_of_memq_and_kafka_producers_read_back_identical(running: Running) -> None:
    topic = running.add_topic(partitions=3)
    from_memq = rows(1_500, "memq")
    from_memq_none = rows(500, "memq-none")
    from_kafka = rows(1_500, "kafka")
    memq_produce(running, topic, from_memq)
    memq_produce(running, topic, from_memq_none, codec="none")
    kafka_produce(running.broker.kafka_address, topic, from_kafka, acks="all",
                  **{"enable.idempotence": True, "compression.type": "lz4"})
    expected = as_rows(from_memq + from_memq_none + from_kafka)
    c = kafka_consumer(running)
    try:
        assign_all(c, topic, 3)
        got = read(c, len(expected))
    finally:
        c.close()
    assert sorted(r for _, _, r in got) == sorted(expected)
    for p in range(3):   # offsets grow within a partition, and say where each record is
        offsets = [o for part, o, _ in got if part == p]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
        assert all(split_offset(o)[1] < 1 << 24 for o in offsets)


def test_earliest_latest_and_timestamp_seek(running: Running) -> None:
    topic = running.add_topic(partitions=1)
    first = rows(300, "first")
    kafka_produce(running.broker.kafka_address, topic, first, acks="all")
    time.sleep(0.1)
    cut_ms = int(time.time() * 1000)
    second = [r._replace(timestamp_ms=cut_ms + i) for i, r in enumerate(rows(200, "second"))]
    memq_produce(running, topic, second)
    c = kafka_consumer(running)
    try:
        # everything read: no lag (the high watermark is just after the last record)
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        everything = read(c, len(first) + len(second))
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=20)
        assert low == 0 and high == max(o for _, o, _ in everything) + 1
        # by timestamp: the records published at or after cut_ms, none of the earlier ones
        [tp] = c.offsets_for_times([TopicPartition(topic, 0, cut_ms)], timeout=20)
        assert tp.offset > 0
        c.assign([tp])
        assert sorted(r for _, _, r in read(c, len(second))) == sorted(as_rows(second))
        # latest: nothing until something new arrives, then exactly that
        c.assign([TopicPartition(topic, 0, OFFSET_END)])
        assert read_nothing_for(c, 1.0)
        third = rows(50, "third")
        kafka_produce(running.broker.kafka_address, topic, third, acks="all")
        assert sorted(r for _, _, r in read(c, len(third))) == sorted(as_rows(third))
    finally:
        c.close()


def read_nothing_for(c: Consumer, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for m in c.consume(100, 0.2):
            if m.error() is None:
                return False
    return True


def test_a_fetch_at_the_end_waits_for_the_next_record_then_answers(running: Running) -> None:
    topic = running.add_topic(partitions=1)
    c = kafka_consumer(running, **{"fetch.wait.max.ms": 5_000})
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        assert read_nothing_for(c, 1.0)
        t0 = time.monotonic()
        kafka_produce(running.broker.kafka_address, topic, rows(10, "late"), acks="all")
        assert len(read(c, 10, timeout_s=10)) == 10
        assert time.monotonic() - t0 < 4.0   # answered when the record came, not after the 5 s wait
    finally:
        c.close()


def test_the_read_cache_serves_parts_the_broker_just_wrote(running: Running) -> None:
    """Once a topic is read through the broker, the parts it stores are kept (fill on write)."""
    topic = running.add_topic(partitions=1)
    m = running.broker.metrics
    kafka_produce(running.broker.kafka_address, topic, rows(10, "warm"), acks="all")
    c = kafka_consumer(running)
    try:
        assign_all(c, topic, 1)
        assert len(read(c, 10)) == 10   # the topic's first read: a GET, and the broker now keeps its parts
    finally:
        c.close()
    gets = m.read_gets._value.get()
    kafka_produce(running.broker.kafka_address, topic, rows(500, "hot"), acks="all")
    for _ in range(3):   # three readers: no GET at all, the new part was filled on write
        c = kafka_consumer(running)
        try:
            assign_all(c, topic, 1)
            assert len(read(c, 510)) == 510
        finally:
            c.close()
    assert m.read_gets._value.get() == gets
    assert m.read_cache_hits._value.get() >= 2


def test_byte_limits_split_parts_across_fetches_and_lose_nothing(running: Running) -> None:
    """Parts far larger than the fetch limits: read in many small fetches, every record once, in order."""
    topic = running.add_topic(partitions=1, batch_ms=300)
    first, second = rows(3_000, "one"), rows(2_000, "two")
    kafka_produce(running.broker.kafka_address, topic, first, acks="all", **{"batch.size": 4_000})
    memq_produce(running, topic, second)
    c = kafka_consumer(running, **{"max.partition.fetch.bytes": 2_000, "fetch.max.bytes": 3_000,
                                   "message.max.bytes": 3_000})
    try:
        assign_all(c, topic, 1)
        got = read(c, len(first) + len(second))
        assert read_nothing_for(c, 0.5)
    finally:
        c.close()
    assert [r for _, _, r in got] == as_rows(first + second)   # one partition: in the order written
    offsets = [o for _, o, _ in got]
    assert offsets == sorted(set(offsets))


def test_a_consumer_group_of_three_reads_every_record_once_and_commits(running: Running) -> None:
    """Group state lives in memq's group coordinator; offsets committed by one group member are
    where a later member of the same group resumes."""
    topic = running.add_topic(partitions=3)
    sent = rows(3_000, "group")
    kafka_produce(running.broker.kafka_address, topic, sent, acks="all")
    group = f"g-{topic}"
    conf = {"group.id": group, "enable.auto.commit": True, "auto.commit.interval.ms": 200,
            "auto.offset.reset": "earliest", "session.timeout.ms": 6_000, "heartbeat.interval.ms": 500}
    members = [kafka_consumer(running, **conf) for _ in range(3)]
    got: list[list[tuple[int, int, Row]]] = [[] for _ in members]
    try:
        for c in members:
            c.subscribe([topic])
        deadline = time.monotonic() + 90
        while sum(map(len, got)) < len(sent):
            assert time.monotonic() < deadline, f"read {sum(map(len, got))} of {len(sent)}"
            for c, mine in zip(members, got):
                mine += [(m.partition(), m.offset(), (m.value(), m.key(), tuple(m.headers() or ()), m.timestamp()[1]))
                         for m in c.consume(500, 0.2) if m.error() is None]
        assert all(read_nothing_for(c, 0.5) for c in members)   # auto commits go out meanwhile; close commits too
        assigned = [{tp.partition for tp in c.assignment()} for c in members]
        admin = AdminClient({"bootstrap.servers": running.broker.kafka_address})   # Kafka's admin tools see it
        listed = admin.list_consumer_groups(request_timeout=20).result(30)
        assert group in {g.group_id for g in listed.valid}
        described = admin.describe_consumer_groups([group], request_timeout=20)[group].result(30)
        assert described.group_id == group and len(described.members) == 3
    finally:
        for c in members:
            c.close()
    everything = [r for mine in got for r in mine]
    assert sorted(r for _, _, r in everything) == sorted(as_rows(sent))     # every record exactly once
    assert sorted(p for a in assigned for p in a) == [0, 1, 2]              # the partitions split between them
    # the commits are the group's, kept by memq's coordinator: a consumer of the group sees
    # them and resumes there
    late = kafka_consumer(running, **conf)
    try:
        committed = late.committed([TopicPartition(topic, p) for p in range(3)], timeout=20)
        last = {p: max(o for q, o, _ in everything if q == p) for p in range(3) if any(q == p for q, _, _ in everything)}
        assert {tp.partition: tp.offset for tp in committed if tp.offset >= 0} == {p: o + 1 for p, o in last.items()}
        late.assign(committed)
        more = rows(20, "more")
        kafka_produce(running.broker.kafka_address, topic, more, acks="all")
        assert sorted(r for _, _, r in read(late, len(more))) == sorted(as_rows(more))
        assert read_nothing_for(late, 0.5)
    finally:
        late.close()


def test_kcat_reads_a_topic_to_its_end(running: Running) -> None:
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed (Debian package kcat)")
    topic = running.add_topic(partitions=2)
    sent = rows(300, "kcat")
    kafka_produce(running.broker.kafka_address, topic, sent, acks="all")
    # -e: exit at the end of every partition, which needs the high watermark right after the last record
    run = subprocess.run([kcat, "-C", "-b", running.broker.kafka_address, "-t", topic, "-o", "beginning", "-e",
                          "-f", "%s\n"], capture_output=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert sorted(run.stdout.splitlines()) == sorted(r.value for r in sent)


def lookups(url: str) -> float:
    """Parts a broker looked up for Kafka readers (read cache hits + misses), from its /metrics."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(("memq_broker_read_cache_hits_total", "memq_broker_read_cache_misses_total")))


def test_a_consumer_reads_from_a_broker_of_its_own_rack(devcluster: DevCluster, tmp_path: Path) -> None:
    """KIP-392: partition leaders on both racks; a consumer with client.rack = b2's rack is sent to
    b2 for every partition, so b1 serves it no records."""
    topic = f"racks-{uuid.uuid4().hex[:6]}"
    with GovernedCluster(tmp_path, brokers=2, servers=devcluster, cluster=f"kr-{uuid.uuid4().hex[:6]}",
                         broker=BrokerConfig(kafka_port=0)) as gc:
        assert set(gc.create_topic(TopicConfig(name=topic, read_partitions=2, batch_ms=50), brokers=2)) == {"b1", "b2"}
        listeners = {b.id: b.kafka_address for b in fetch_metadata(gc.broker("b1").url, 10.0).brokers}
        sent = rows(500, "rack")
        for i in range(0, len(sent), 50):   # parts in both partitions (each notification's partition is random)
            kafka_produce(listeners["b1"], topic, sent[i:i + 50], acks="all")
        c = Consumer({"bootstrap.servers": listeners["b1"], "group.id": "unused", "enable.auto.commit": False,
                      "client.rack": gc.rack("b2"), "fetch.wait.max.ms": 200})
        try:
            c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(2)])
            got = read(c, len(sent))
        finally:
            c.close()
        assert sorted(r for _, _, r in got) == sorted(as_rows(sent))
        assert {p for p, _, _ in got} == {0, 1} and gc.rack("b1") != gc.rack("b2")   # b1 leads one of them
        assert lookups(gc.broker("b1").url) == 0 and lookups(gc.broker("b2").url) > 0


def _group_member(address: str, topic: str, conf: dict, ready: object) -> None:
    """A member that joins and reads, committing nothing, until it is killed."""
    c = Consumer({"bootstrap.servers": address, **conf})
    c.subscribe([topic])
    while True:
        for m in c.consume(100, 0.2):
            if m.error() is None:
                ready.set()  # type: ignore[attr-defined]


@pytest.mark.slow   # a spawned member's first assignment took over 60 s once on a loaded 2-core run
def test_a_killed_group_member_loses_its_partitions_to_the_others_and_nothing_is_lost(running: Running) -> None:
    topic = running.add_topic(partitions=3)
    group = f"g-{topic}"
    conf = {"group.id": group, "enable.auto.commit": True, "auto.commit.interval.ms": 200,
            "auto.offset.reset": "earliest", "session.timeout.ms": 6_000, "heartbeat.interval.ms": 500}
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    # the victim commits nothing, so every record it read must reach the survivors
    victim = ctx.Process(target=_group_member, daemon=True,
                         args=(running.broker.kafka_address, topic, {**conf, "enable.auto.commit": False}, ready))
    victim.start()
    members = [kafka_consumer(running, **conf) for _ in range(2)]
    got: list[Row] = []
    try:
        for c in members:
            c.subscribe([topic])
        first = rows(600, "before")
        for i in range(0, len(first), 100):   # parts in several partitions
            kafka_produce(running.broker.kafka_address, topic, first[i:i + 100], acks="all")
        assert ready.wait(120), "the spawned member got no partitions"
        os.kill(victim.pid, signal.SIGKILL)   # type: ignore[arg-type]
        victim.join(10)
        second = rows(600, "after")
        for i in range(0, len(second), 100):
            kafka_produce(running.broker.kafka_address, topic, second[i:i + 100], acks="all")
        deadline = time.monotonic() + 90
        want = set(as_rows(first + second))
        while not want <= set(got):
            assert time.monotonic() < deadline, f"{len(want - set(got))} records never read by the survivors"
            for c in members:
                got += [(m.value(), m.key(), tuple(m.headers() or ()), m.timestamp()[1])
                        for m in c.consume(500, 0.2) if m.error() is None]
        assigned = sorted(tp.partition for c in members for tp in c.assignment())
    finally:
        for c in members:
            c.close()
    assert assigned == [0, 1, 2]   # the survivors took the killed member's partitions
    assert len(got) == len(set(got))   # and the survivors read each once
