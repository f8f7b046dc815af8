"""Kafka clients other than librdkafka read memq through a broker's Kafka listener, on the real
dev cluster (moto S3, tansu): kafka-python, aiokafka and kafkajs (Node, installed with npm into
a cache directory; skipped with the reason when node, npm or the registry are missing). Each
reads the records memq's Producer and a Kafka producer wrote with identical values, keys,
headers and timestamps (assigned, from the earliest offset), reads only what comes after the
latest offset, and reads in a group whose commit a later member of that group resumes from.
Kafka producers' batches of each codec (none, gzip, snappy, lz4, zstd) read back identical too,
and so do memq's own records framed in each (`kafka_compression`); kafkajs with no codec plug-in
reads what memq's Producer wrote (the broker default, gzip). Every client, and memq's Consumer,
reads each record from the partition its producer chose: a Kafka producer's explicit partition,
memq's Producer's key placement (Kafka's default partitioner), in the order they were sent.
(The Java client cannot be installed here: no Maven registry; librdkafka's tests are in
tests/test_kafka_fetch.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioPartition
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KpPartition
from tests.support.kafka_clients import (Row, Running, as_rows, broker_thread, kafka_produce, memq_produce,
                                         rows)

from memq.client.consumer import Consumer as MemqConsumer
from memq.client.producer import Producer as MemqProducer
from memq.client.placement import key_partition
from memq.config import BrokerConfig, MemqConfig, ProducerConfig, TopicConfig
from memq.devcluster import DevCluster
from memq.format import LogMessage

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PARTITIONS = 2
READ_TIMEOUT_S = 60
#: Group timings: the notification Kafka here (tansu) answers a JoinGroup after the rebalance
#: timeout, so the clients' defaults (60 s and more) would make each join that slow.
KP_GROUP = {"max_poll_interval_ms": 3000, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
AIO_GROUP = {"rebalance_timeout_ms": 3000, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}


@dataclasses.dataclass
class Written:
    topic: str
    rows: list[Row]


@pytest.fixture(scope="module")
def running(devcluster: DevCluster) -> Iterator[Running]:
    with broker_thread(dataclasses.replace(devcluster.config(cluster="kafkaclients"),
                                           broker=BrokerConfig(kafka_port=0))) as r:
        yield r


def write(running: Running, tag: str, n: int = 300) -> Written:
    """A topic holding `n` records from memq's Producer (zstd Messages: framed as zstd batches)
    and `n` from a Kafka producer (gzip: every client here decodes it unaided)."""
    topic = running.add_topic(partitions=PARTITIONS)
    from_memq, from_kafka = rows(n, f"{tag}-memq"), rows(n, f"{tag}-kafka")
    memq_produce(running, topic, from_memq)
    kafka_produce(running.broker.kafka_address, topic, from_kafka, acks="all", **{"compression.type": "gzip"})
    return Written(topic, as_rows(from_memq + from_kafka))


def group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


# --- kafka-python ---------------------------------------------------------------------------


def kp_rows(c: KafkaConsumer, n: int) -> list[Row]:
    got: list[Row] = []
    deadline = time.monotonic() + READ_TIMEOUT_S
    while len(got) < n and time.monotonic() < deadline:
        for msgs in c.poll(timeout_ms=500).values():
            got += [(m.value, m.key, tuple((k, v) for k, v in m.headers), m.timestamp) for m in msgs]
    return got


def test_kafka_python_reads_assigned_latest_and_in_a_group(running: Running) -> None:
    w = write(running, "kp")
    address = running.broker.kafka_address
    c = KafkaConsumer(bootstrap_servers=address, enable_auto_commit=False, auto_offset_reset="earliest",
                      fetch_max_wait_ms=200)
    try:
        parts = [KpPartition(w.topic, p) for p in range(PARTITIONS)]
        c.assign(parts)
        c.seek_to_beginning()
        assert sorted(kp_rows(c, len(w.rows))) == sorted(w.rows)
        c.seek_to_end()
        for tp in parts:
            c.position(tp)   # resolves the latest offset now (seek_to_end is lazy)
        later = rows(20, "kp-later")
        kafka_produce(address, w.topic, later, acks="all")
        assert sorted(kp_rows(c, len(later))) == sorted(as_rows(later))
    finally:
        c.close()
    g = group()
    first = KafkaConsumer(w.topic, bootstrap_servers=address, group_id=g, enable_auto_commit=False,
                          auto_offset_reset="earliest", fetch_max_wait_ms=200, **KP_GROUP)
    try:
        assert len(kp_rows(first, len(w.rows) + 20)) == len(w.rows) + 20
        first.commit()
    finally:
        first.close()
    more = rows(10, "kp-more")
    kafka_produce(address, w.topic, more, acks="all")
    second = KafkaConsumer(w.topic, bootstrap_servers=address, group_id=g, enable_auto_commit=False,
                           auto_offset_reset="earliest", fetch_max_wait_ms=200, **KP_GROUP)
    try:   # the group's commit: the next member reads only what came after it
        assert sorted(kp_rows(second, len(more))) == sorted(as_rows(more))
    finally:
        second.close()


# --- aiokafka -------------------------------------------------------------------------------


async def aio_rows(c: AIOKafkaConsumer, n: int) -> list[Row]:
    got: list[Row] = []
    deadline = time.monotonic() + READ_TIMEOUT_S
    while len(got) < n and time.monotonic() < deadline:
        for msgs in (await c.getmany(timeout_ms=500)).values():
            got += [(m.value, m.key, tuple((k, v) for k, v in m.headers), m.timestamp) for m in msgs]
    return got


def test_aiokafka_reads_assigned_latest_and_in_a_group(running: Running) -> None:
    w = write(running, "aio")
    address = running.broker.kafka_address
    later, more = rows(20, "aio-later"), rows(10, "aio-more")

    async def scenario() -> None:
        c = AIOKafkaConsumer(bootstrap_servers=address, enable_auto_commit=False, auto_offset_reset="earliest",
                             fetch_max_wait_ms=200)
        await c.start()
        try:
            parts = [AioPartition(w.topic, p) for p in range(PARTITIONS)]
            c.assign(parts)
            await c.seek_to_beginning()
            assert sorted(await aio_rows(c, len(w.rows))) == sorted(w.rows)
            await c.seek_to_end()
            for tp in parts:
                await c.position(tp)   # resolves the latest offset now (seek_to_end is lazy)
            await asyncio.to_thread(kafka_produce, address, w.topic, later, acks="all")
            assert sorted(await aio_rows(c, len(later))) == sorted(as_rows(later))
        finally:
            await c.stop()
        g = group()
        first = AIOKafkaConsumer(w.topic, bootstrap_servers=address, group_id=g, enable_auto_commit=False,
                                 auto_offset_reset="earliest", fetch_max_wait_ms=200, **AIO_GROUP)
        await first.start()
        try:
            assert len(await aio_rows(first, len(w.rows) + len(later))) == len(w.rows) + len(later)
            await first.commit()
        finally:
            await first.stop()
        await asyncio.to_thread(kafka_produce, address, w.topic, more, acks="all")
        second = AIOKafkaConsumer(w.topic, bootstrap_servers=address, group_id=g, enable_auto_commit=False,
                                  auto_offset_reset="earliest", fetch_max_wait_ms=200, **AIO_GROUP)
        await second.start()
        try:   # the group's commit: the next member reads only what came after it
            assert sorted(await aio_rows(second, len(more))) == sorted(as_rows(more))
        finally:
            await second.stop()

    asyncio.run(scenario())


# --- kafkajs (Node) -------------------------------------------------------------------------

KAFKAJS_SCRIPT = Path(__file__).with_name("support") / "kafkajs_read.js"


def kafkajs_run(modules: Path, when_ready: Callable[[], None] | None = None, **args: object) -> list[Row]:
    """Rows the script read; `when_ready` runs once it says "ready" (mode latest)."""
    return [(bytes.fromhex(v), None if k is None else bytes.fromhex(k),
             tuple((name, bytes.fromhex(h)) for name, h in hs), ts)
            for v, k, hs, ts, _ in kafkajs_out(modules, when_ready, **args)]


def kafkajs_out(modules: Path, when_ready: Callable[[], None] | None = None, **args: object) -> list[list]:
    """What the script printed: [value hex, key hex, headers, timestamp, partition] per record."""
    proc = subprocess.Popen(["node", str(KAFKAJS_SCRIPT), json.dumps(args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "NODE_PATH": str(modules)})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if when_ready is not None:
            assert line.strip() == "ready", line + proc.communicate(timeout=60)[1][-3000:]
            when_ready()
            line = proc.stdout.readline()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    out_rows: list[list] = json.loads(line + out)
    return out_rows


def test_kafkajs_reads_assigned_latest_and_in_a_group(running: Running, kafkajs: Path) -> None:
    w = write(running, "js")
    address = running.broker.kafka_address
    got = kafkajs_run(kafkajs, broker=address, topic=w.topic, mode="earliest", count=len(w.rows))
    assert sorted(got) == sorted(w.rows)
    later = rows(20, "js-later")
    got = kafkajs_run(kafkajs, lambda: kafka_produce(address, w.topic, later, acks="all"), broker=address,
                      topic=w.topic, mode="latest", count=len(later))
    assert sorted(got) == sorted(as_rows(later))
    g = group()
    got = kafkajs_run(kafkajs, broker=address, topic=w.topic, mode="group", group=g, count=len(w.rows) + len(later))
    assert sorted(got) == sorted(w.rows + as_rows(later))
    more = rows(10, "js-more")
    kafka_produce(address, w.topic, more, acks="all")
    got = kafkajs_run(kafkajs, broker=address, topic=w.topic, mode="group", group=g, count=len(more))
    assert sorted(got) == sorted(as_rows(more))   # the group's commit: only what came after it


# --- what Kafka producers wrote with each codec, read by librdkafka ----------------------------


def test_records_of_kafka_producers_with_each_codec_read_back_identical(running: Running) -> None:
    topic = running.add_topic(partitions=PARTITIONS)
    expected: list[Row] = []
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        sent = rows(200, f"codec-{codec}")
        kafka_produce(running.broker.kafka_address, topic, sent, acks="all", **{"compression.type": codec})
        expected += as_rows(sent)
    c = Consumer({"bootstrap.servers": running.broker.kafka_address, "group.id": "unused",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 200})
    got: list[Row] = []
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + READ_TIMEOUT_S
        while len(got) < len(expected) and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                assert m.error() is None, m.error()
                got.append((m.value(), m.key(), tuple(m.headers() or ()), m.timestamp()[1]))
    finally:
        c.close()
    assert sorted(got) == sorted(expected)


# --- what memq writes, framed for Kafka readers (kafka_compression) ----------------------------


def test_kafkajs_without_a_codec_plugin_reads_topics_memq_producers_wrote(running: Running, kafkajs: Path) -> None:
    """The broker default (gzip) is one kafkajs decodes as installed: topics written by memq's
    Producer with each of its codecs (zstd, none, arrow: what Spark's sink writes; arrow through
    the Producer here, Spark itself being too slow to start for this file) read back intact.
    With a topic set to zstd, the same read fails: "ZSTD compression not implemented"."""
    topic = running.add_topic(partitions=PARTITIONS)   # kafka_compression "auto": the broker default
    expected: list[Row] = []
    for codec in ("zstd", "none", "arrow"):
        sent = rows(200, f"js-plain-{codec}")
        memq_produce(running, topic, sent, codec=codec)
        expected += as_rows(sent)
    got = kafkajs_run(kafkajs, broker=running.broker.kafka_address, topic=topic, mode="earliest",
                      count=len(expected), zstd=False)
    assert sorted(got) == sorted(expected)


def test_memq_records_framed_in_each_codec_read_back_identical(running: Running) -> None:
    """A topic per `kafka_compression`, read by librdkafka and aiokafka (snappy in xerial
    framing and lz4 frames as the Java client writes them, gzip, zstd)."""
    address = running.broker.kafka_address
    expected: dict[str, list[Row]] = {}
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        topic = running.add_topic(partitions=1, kafka_compression=codec)
        sent = rows(300, f"framed-{codec}")
        memq_produce(running, topic, sent)
        expected[topic] = as_rows(sent)
    total = sum(len(v) for v in expected.values())
    c = Consumer({"bootstrap.servers": address, "group.id": "unused", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 200})
    got: dict[str, list[Row]] = {t: [] for t in expected}
    try:
        c.assign([TopicPartition(t, 0, OFFSET_BEGINNING) for t in expected])
        deadline = time.monotonic() + READ_TIMEOUT_S
        while sum(map(len, got.values())) < total and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                assert m.error() is None, m.error()
                got[m.topic()].append((m.value(), m.key(), tuple(m.headers() or ()), m.timestamp()[1]))
    finally:
        c.close()
    assert got == expected

    async def aio() -> dict[str, list[Row]]:
        ac = AIOKafkaConsumer(bootstrap_servers=address, enable_auto_commit=False, fetch_max_wait_ms=200)
        await ac.start()
        try:
            ac.assign([AioPartition(t, 0) for t in expected])
            await ac.seek_to_beginning()
            out: dict[str, list[Row]] = {t: [] for t in expected}
            deadline = time.monotonic() + READ_TIMEOUT_S
            while sum(map(len, out.values())) < total and time.monotonic() < deadline:
                for tp, msgs in (await ac.getmany(timeout_ms=500)).items():
                    out[tp.topic] += [(m.value, m.key, tuple((k, v) for k, v in m.headers), m.timestamp)
                                      for m in msgs]
            return out
        finally:
            await ac.stop()

    assert asyncio.run(aio()) == expected


# --- partitions as the producer chose them -----------------------------------------------------

CHOSEN_PARTITIONS = 3


@dataclasses.dataclass
class Chosen:
    topic: str
    where: dict[bytes, int]     # value -> the partition its producer chose
    order: list[bytes]          # values in the order they were sent
    reported: dict[bytes, int]  # value -> the offset its delivery report gave (Kafka producer's; < 0 unknown)


@pytest.fixture(scope="module")
def chosen(running: Running) -> Chosen:
    """A topic of 3 read partitions (not compacted, dense offsets): a Kafka producer sends records
    to the partitions it names (0, 1, 2 in turn, and only 1 for a stretch), memq's Producer sends
    keyed records (placed by key) and a few without a key."""
    topic = running.add_topic(partitions=CHOSEN_PARTITIONS, offsets="dense")
    where: dict[bytes, int] = {}
    order: list[bytes] = []
    p = Producer({"bootstrap.servers": running.broker.kafka_address, "linger.ms": 5, "acks": "all"})
    reported: dict[bytes, int] = {}
    for i in range(240):
        partition = 1 if 100 <= i < 160 else i % CHOSEN_PARTITIONS
        value = b"kafka-%d" % i
        p.produce(topic, value, key=b"k%d" % (i % 11), partition=partition,
                  on_delivery=lambda err, m: reported.__setitem__(m.value(), m.offset()))
        where[value] = partition
        order.append(value)
        if i == CHOSEN_PARTITIONS - 1:
            p.flush(30)   # each partition's first part: its broker starts counting the partition
            _counted(running.broker.kafka_address, topic)
    assert p.flush(30) == 0
    keyed = [LogMessage(b"memq-%d" % i, b"key-%d" % (i % 23), (), 1_700_000_000_000 + i) for i in range(120)]
    memq_produce(running, topic, keyed)
    where.update((r.value, key_partition(r.key or b"", CHOSEN_PARTITIONS)) for r in keyed)
    order += [r.value for r in keyed]
    memq_produce(running, topic, [LogMessage(b"memq-nokey-%d" % i, None, (), 1_700_000_000_000) for i in range(5)])
    return Chosen(topic, where, order, reported)


def _counted(address: str, topic: str) -> None:
    """Once the broker counted each partition's offsets: a high watermark waits for the count,
    which a delivery report does not (it answers -1 until then), so the reports after this one
    know their offsets however loaded the machine is."""
    c = Consumer({"bootstrap.servers": address, "group.id": "unused"})
    try:
        for partition in range(CHOSEN_PARTITIONS):
            c.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
    finally:
        c.close()


def check_chosen(c: Chosen, got: list[tuple[int, bytes]]) -> None:
    """`got` (partition, value) in the order read holds every record once, each from the
    partition its producer chose and in the order sent within it (records without a key: anywhere)."""
    placed = [(p, v) for p, v in got if v in c.where]
    assert sorted(v for _, v in placed) == sorted(c.where)
    assert {v: p for p, v in placed} == c.where
    rank = {v: i for i, v in enumerate(c.order)}
    for partition in range(CHOSEN_PARTITIONS):
        mine = [rank[v] for p, v in placed if p == partition]
        assert mine == sorted(mine), f"partition {partition} out of order"
    assert sorted(v for _, v in got if v not in c.where) == sorted(b"memq-nokey-%d" % i for i in range(5))


def check_dense(got: list[tuple[int, int, bytes]]) -> list[tuple[int, bytes]]:
    """Each partition's offsets, as read, are its record numbers 0, 1, 2, ...: (partition, value) of each."""
    for partition in range(CHOSEN_PARTITIONS):
        offsets = [o for p, o, _ in got if p == partition]
        assert offsets == list(range(len(offsets))), f"partition {partition}: {offsets[:5]}..."
    return [(p, v) for p, _, v in got]


def librdkafka_read(address: str, topic: str, n: int) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of `n` records read from the beginning of each partition, which
    then ends (its high watermark) just after its last record."""
    c = Consumer({"bootstrap.servers": address, "group.id": "unused", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 200})
    got: list[tuple[int, int, bytes]] = []
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(CHOSEN_PARTITIONS)])
        deadline = time.monotonic() + READ_TIMEOUT_S
        while len(got) < n and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                assert m.error() is None, m.error()
                got.append((m.partition(), m.offset(), m.value()))
        ends = [c.get_watermark_offsets(TopicPartition(topic, p))[1] for p in range(CHOSEN_PARTITIONS)]
        assert ends == [max((o + 1 for q, o, _ in got if q == p), default=0) for p in range(CHOSEN_PARTITIONS)]
    finally:
        c.close()
    return got


def test_librdkafka_kafka_python_aiokafka_and_memqs_consumer_read_each_record_from_its_chosen_partition(
        running: Running, chosen: Chosen) -> None:
    """... at consecutive offsets (the topic's are dense)."""
    address, n = running.broker.kafka_address, len(chosen.where) + 5
    read = librdkafka_read(address, chosen.topic, n)
    check_chosen(chosen, check_dense(read))
    known = {v: o for v, o in chosen.reported.items() if o is not None and o >= 0}
    # a partition's first request starts its count in the background and answers -1, as do those
    # that arrive before the count is done (how many depends on the load): the rest are known
    assert known, chosen.reported
    assert known == {v: o for _, o, v in read if v in known}   # delivery reports give the offsets read

    kp = KafkaConsumer(bootstrap_servers=address, enable_auto_commit=False, fetch_max_wait_ms=200)
    try:
        kp.assign([KpPartition(chosen.topic, p) for p in range(CHOSEN_PARTITIONS)])
        kp.seek_to_beginning()
        dense = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while len(dense) < n and time.monotonic() < deadline:
            for tp, msgs in kp.poll(timeout_ms=500).items():
                dense += [(tp.partition, m.offset, m.value) for m in msgs]
    finally:
        kp.close()
    check_chosen(chosen, check_dense(dense))

    async def aio() -> list[tuple[int, int, bytes]]:
        ac = AIOKafkaConsumer(bootstrap_servers=address, enable_auto_commit=False, fetch_max_wait_ms=200)
        await ac.start()
        try:
            ac.assign([AioPartition(chosen.topic, p) for p in range(CHOSEN_PARTITIONS)])
            await ac.seek_to_beginning()
            out: list[tuple[int, int, bytes]] = []
            deadline = time.monotonic() + READ_TIMEOUT_S
            while len(out) < n and time.monotonic() < deadline:
                for tp, msgs in (await ac.getmany(timeout_ms=500)).items():
                    out += [(tp.partition, m.offset, m.value) for m in msgs]
            return out
        finally:
            await ac.stop()
    check_chosen(chosen, check_dense(asyncio.run(aio())))

    # memq's Consumer, told the topic by the broker, gives each record the offset Kafka clients read
    with MemqConsumer(asked_of(running), chosen.topic, group_id=group()) as mc:
        got: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while len(got) < n and time.monotonic() < deadline:
            got += [(r.partition, r.offset, r.value) for r in mc.poll(0.5)]
    assert sorted(got) == sorted(read)
    check_chosen(chosen, check_dense(got))


def asked_of(running: Running) -> MemqConfig:
    """`running`'s config with its broker named: clients learn the topics (and their offsets) from it."""
    return dataclasses.replace(running.config, producer=dataclasses.replace(running.config.producer,
                                                                            brokers=running.broker.url))


def test_memqs_consumer_seeks_commits_and_positions_in_record_offsets_on_a_dense_topic(
        running: Running, chosen: Chosen) -> None:
    """A seek to a record offset in the middle of a part starts there; position, commit and
    committed answer record offsets (the notification Kafka keeps the part's position)."""
    read = librdkafka_read(running.broker.kafka_address, chosen.topic, len(chosen.where) + 5)
    ones = sorted((o, v) for p, o, v in read if p == 1)
    # memq's Producer sent its keyed records 100 a Message: its second one on partition 1 is inside a part
    cut = [v.startswith(b"memq-") for _, v in ones].index(True) + 1
    middle = ones[cut][0]
    with MemqConsumer(asked_of(running), chosen.topic, group_id=group(), subscribe=False) as mc:
        mc._notify.assign({1: 0})   # type: ignore[attr-defined]
        mc.seek(1, middle)
        assert mc.position()[1] == middle
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while len(got) < len(ones) - cut and time.monotonic() < deadline:
            got += [(r.offset, r.value) for r in mc.poll(0.5)]
        assert got == ones[cut:]
        assert mc.commit() == {1: ones[-1][0] + 1} == mc.committed([1])
    # a transaction commits a Consumer's position in record offsets too (here the memq part's first record)
    first_memq, other, txn_group = ones[cut - 1][0], running.add_topic(partitions=1), group()

    async def commit_in_transaction() -> None:
        async with MemqProducer(ProducerConfig(brokers=running.broker.url, linger_ms=5),
                                transactional_id=f"t-{txn_group}") as p:
            await p.begin()
            await p.send_offsets(txn_group, {chosen.topic: {1: first_memq}})
            await p.send(other, b"with-offsets")
            await p.commit()
    asyncio.run_coroutine_threadsafe(commit_in_transaction(), running.loop).result(60)
    with MemqConsumer(asked_of(running), chosen.topic, group_id=txn_group, subscribe=False) as mc:
        assert mc.committed([1]) == {1: first_memq}


def test_kafkajs_reads_each_record_from_its_chosen_partition(running: Running, chosen: Chosen, kafkajs: Path) -> None:
    out = kafkajs_out(kafkajs, broker=running.broker.kafka_address, topic=chosen.topic, mode="earliest",
                      count=len(chosen.where) + 5)
    check_chosen(chosen, [(p, bytes.fromhex(v)) for v, _, _, _, p in out])


def test_dense_offsets_are_the_same_on_a_broker_starting_cold(running: Running, chosen: Chosen) -> None:
    """A second broker, started after the records were written (as after a restart), counts the
    partitions' offsets itself from the notification log: each record at the same offset."""
    n = len(chosen.where) + 5
    here = sorted(librdkafka_read(running.broker.kafka_address, chosen.topic, n))
    with broker_thread(dataclasses.replace(running.config, broker=BrokerConfig(kafka_port=0))) as other:
        topic = TopicConfig(name=chosen.topic, read_partitions=CHOSEN_PARTITIONS, batch_ms=50, offsets="dense")
        asyncio.run_coroutine_threadsafe(other.broker.add_topic(topic), other.loop).result(30)
        there = sorted(librdkafka_read(other.broker.kafka_address, chosen.topic, n))
    assert len(here) == n and there == here
