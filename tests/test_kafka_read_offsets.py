"""What a Kafka reader of memq's listener sees against what producers were told, on the real dev
cluster (moto S3, tansu) with confluent-kafka: a producer's delivery report names the offset
its record is read at, and a Message stored twice (a retry) reaches Kafka readers once, at the
same offsets wherever they start reading."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition
from kafka import KafkaProducer
from tests.support.cluster import records, write_batches
from tests.support.kafka_clients import Running, broker_thread

from memq.config import BrokerConfig, TopicConfig
from memq.devcluster import DevCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def running(devcluster: DevCluster) -> Iterator[Running]:
    with broker_thread(dataclasses.replace(devcluster.config(cluster="kafkaoffsets"),
                                           broker=BrokerConfig(kafka_port=0))) as r:
        yield r


def produce_reporting(address: str, topic: str, values: list[bytes], **conf: object) -> dict[bytes, int | None]:
    """Each value's offset as its delivery report gives it."""
    reported: dict[bytes, int | None] = {}

    def delivered(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        reported[msg.value()] = msg.offset()

    p = Producer({"bootstrap.servers": address, "linger.ms": 5, **conf})
    for v in values:
        p.produce(topic, v, on_delivery=delivered)
        p.poll(0)
    assert p.flush(60) == 0
    return reported


def read_offsets(address: str, topic: str, partitions: int, n: int, timeout_s: float = 60,
                 start: int = OFFSET_BEGINNING) -> list[tuple[int, bytes]]:
    """(offset, value) of the first `n` records and any that follow within a second, reading
    every partition from `start`."""
    c = Consumer({"bootstrap.servers": address, "group.id": "unused", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 200})
    got: list[tuple[int, bytes]] = []
    try:
        c.assign([TopicPartition(topic, p, start) for p in range(partitions)])
        deadline = time.monotonic() + timeout_s
        while len(got) < n:
            assert time.monotonic() < deadline, f"read {len(got)} of {n} records"
            got += [(m.offset(), m.value()) for m in c.consume(1000, 0.5) if m.error() is None]
        quiet = time.monotonic() + 1.0   # and nothing more: a duplicate would come right after
        while time.monotonic() < quiet:
            got += [(m.offset(), m.value()) for m in c.consume(1000, 0.2) if m.error() is None]
    finally:
        c.close()
    return got


def test_delivery_reports_name_the_offsets_the_records_are_read_at(running: Running) -> None:
    """On a sparse topic every acks=all report names its offset (a dense topic's are known once the
    broker counts the partition: -1 before, `kafka-clients.md`, "Offsets in delivery reports")."""
    topic = running.add_topic(partitions=1, offsets="sparse")
    address = running.broker.kafka_address
    values = [b"acked-%d" % i for i in range(300)]
    reported = produce_reporting(address, topic, values, acks="all", **{"batch.size": 2_000})
    leader = produce_reporting(address, topic, [b"leader-%d" % i for i in range(20)], acks=1)
    got = read_offsets(address, topic, 1, len(values) + len(leader))
    read_at = {v: o for o, v in got}
    assert reported == {v: read_at[v] for v in values}
    # acks=1 is answered before the notification exists: no offset is known, and none is made up
    # (confluent-kafka reports None for a negative one)
    assert set(leader.values()) == {None}


def test_kafka_python_and_aiokafka_take_acks_1_answers_without_an_offset_as_delivered(running: Running) -> None:
    """acks=1 is answered before the notification exists, with a negative base offset ("not
    known"): each client reports the send as done (no error, no retry: every value is stored
    once) and no offset that is another record's."""
    topic = running.add_topic(partitions=1)
    address = running.broker.kafka_address
    kp_values = [b"kp-%d" % i for i in range(30)]
    kp = KafkaProducer(bootstrap_servers=address, acks=1, linger_ms=5, retries=5)
    try:
        futures = [kp.send(topic, v) for v in kp_values]
        kp.flush(60)
        assert {f.get(30).offset < 0 for f in futures} == {True}
    finally:
        kp.close(10)

    async def aio() -> set[bool]:
        p = AIOKafkaProducer(bootstrap_servers=address, acks=1, linger_ms=5)
        await p.start()
        try:
            sent = [await p.send(topic, v) for v in aio_values]
            return {(await f).offset < 0 for f in sent}
        finally:
            await p.stop()

    aio_values = [b"aio-%d" % i for i in range(30)]
    assert asyncio.run(aio()) == {True}
    want = kp_values + aio_values
    assert sorted(v for _, v in read_offsets(address, topic, 1, len(want))) == sorted(want)   # each once


def test_a_message_stored_twice_reaches_kafka_readers_once_at_stable_offsets(running: Running) -> None:
    """A retried Message stored again (the broker's own dedup forgot it, or another broker took
    the retry): every Kafka reader drops the later copies, on any broker, wherever it starts."""
    topic = running.add_topic(partitions=1)
    first, retried, later = records(5, "first"), records(4, "retried"), records(3, "later")
    write_batches(running.config, topic, [
        [(7, 0, 0, first), (7, 0, 1, retried)],
        [(8, 0, 0, later), (7, 0, 1, retried)],    # the retry, stored a second time with other records
        [(7, 0, 1, retried)],                       # and a third time, alone
    ])
    want = sorted(r.value for r in first + retried + later)
    whole = read_offsets(running.broker.kafka_address, topic, 1, len(want))
    assert sorted(v for _, v in whole) == want
    second = min(o for o, v in whole if v == later[0].value)
    other = dataclasses.replace(running.config, broker=dataclasses.replace(running.config.broker, broker_id="b2"))
    with broker_thread(other) as b2:   # another broker, its own cache: reads from the start, then from the second part
        asyncio.run_coroutine_threadsafe(b2.broker.add_topic(TopicConfig(name=topic, read_partitions=1)),
                                         b2.loop).result(30)
        assert read_offsets(b2.broker.kafka_address, topic, 1, len(want)) == whole
        assert read_offsets(b2.broker.kafka_address, topic, 1, len(later), start=second) == [
            (o, v) for o, v in whole if o >= second]


def test_a_partition_ending_in_dropped_copies_reads_to_its_high_watermark(running: Running) -> None:
    """The last part holds only a retried copy: a reader still reaches the high watermark (end of
    partition, no lag left), so `kcat -e` and lag checks see the end without the next write."""
    topic = running.add_topic(partitions=1)
    first, retried = records(3, "first"), records(2, "retried")
    write_batches(running.config, topic, [[(7, 0, 0, first), (7, 0, 1, retried)], [(7, 0, 1, retried)]])
    c = Consumer({"bootstrap.servers": running.broker.kafka_address, "group.id": f"{topic}-end",
                  "enable.auto.commit": False, "enable.partition.eof": True, "fetch.wait.max.ms": 100})
    got: list[bytes] = []
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 30
        eof = False
        while not eof:
            assert time.monotonic() < deadline, f"no end of partition after {len(got)} records"
            for m in c.consume(100, 0.5):
                err = m.error()
                eof |= err is not None and err.code() == KafkaError._PARTITION_EOF
                if err is None:
                    got.append(m.value())
        _, high = c.get_watermark_offsets(TopicPartition(topic, 0), cached=True)
        [at] = c.position([TopicPartition(topic, 0)])
        assert sorted(got) == sorted(r.value for r in first + retried)
        c.commit(asynchronous=False)
        [committed] = c.committed([TopicPartition(topic, 0)], timeout=30)
        assert at.offset == high and committed.offset == high   # no lag left at the end
    finally:
        c.close()
