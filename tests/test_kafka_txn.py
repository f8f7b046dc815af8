"""Kafka transactions on a governed cluster of real broker processes (moto S3, tansu, ZooKeeper):
commit A, abort B, commit C with confluent-kafka, kafka-python, aiokafka and kafkajs producers,
read by all four read_committed (A and C exactly, never B); a second producer with the same
transactional id fences the first; a vanished producer's transaction aborts after its
transaction.timeout.ms; a zombie group member's offsets are refused (ILLEGAL_GENERATION); a consume-transform-produce worker SIGKILLed mid-transaction is
finished by a second with every input transformed exactly once; a broker SIGKILLed between the
records and EndTxn leaves the transaction all or nothing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Literal
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as ATopicPartition
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from tests.support.kafka_clients import read_committed
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition

from memq.client.cluster import fetch_metadata
from memq.config import BrokerConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PARTITIONS = 3
SUPPORT = Path(__file__).with_name("support")
TIMEOUT_S = 30.0


class Cluster:
    def __init__(self, gc: GovernedCluster) -> None:
        self.gc = gc
        self.address = fetch_metadata(gc.broker("b1").url, 10.0).brokers[0].kafka_address

    def topic(self, partitions: int = PARTITIONS, offsets: Literal["sparse", "dense"] = "sparse") -> str:
        name = f"tx-{uuid.uuid4().hex[:8]}"
        self.gc.create_topic(TopicConfig(name, read_partitions=partitions, batch_ms=20, offsets=offsets), brokers=2)
        return name


@pytest.fixture(scope="module")
def cluster(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    broker = BrokerConfig(kafka_port=0, txn_scan_ms=500)
    with GovernedCluster(tmp_path_factory.mktemp("kafka-txn"), brokers=2, servers=devcluster,
                         cluster=f"txn{uuid.uuid4().hex[:6]}", broker=broker) as gc:
        yield Cluster(gc)


def _producer(address: str, txn_id: str, **extra: object) -> Producer:
    p = Producer({"bootstrap.servers": address, "transactional.id": txn_id, "linger.ms": 5, **extra})
    p.init_transactions(TIMEOUT_S)
    return p


def _txn(p: Producer, topic: str, values: list[str], commit: bool) -> None:
    p.begin_transaction()
    for i, v in enumerate(values):
        p.produce(topic, v.encode(), partition=i % PARTITIONS)
    p.flush(TIMEOUT_S)
    (p.commit_transaction if commit else p.abort_transaction)(TIMEOUT_S)


def _kafka_python_read(address: str, topic: str, count: int) -> list[str]:
    c = KafkaConsumer(bootstrap_servers=address, isolation_level="read_committed", enable_auto_commit=False,
                      consumer_timeout_ms=3000, fetch_max_wait_ms=100)
    c.assign([KTopicPartition(topic, p) for p in range(PARTITIONS)])
    c.seek_to_beginning()
    got: list[str] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(got) < count and time.monotonic() < deadline:
            for batch in c.poll(500).values():
                got += [r.value.decode() for r in batch]
    finally:
        c.close()
    return got


async def _aiokafka_read(address: str, topic: str, count: int) -> list[str]:
    c = AIOKafkaConsumer(bootstrap_servers=address, isolation_level="read_committed", enable_auto_commit=False,
                         fetch_max_wait_ms=100)
    await c.start()
    got: list[str] = []
    try:
        c.assign([ATopicPartition(topic, p) for p in range(PARTITIONS)])
        await c.seek_to_beginning()
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < count and time.monotonic() < deadline:
            for batch in (await c.getmany(timeout_ms=500)).values():
                got += [r.value.decode() for r in batch]
    finally:
        await c.stop()
    return got


async def _aiokafka_txns(address: str, topic: str, commit: list[str], abort: list[str]) -> None:
    p = AIOKafkaProducer(bootstrap_servers=address, transactional_id=f"ak-{uuid.uuid4().hex[:6]}")
    await p.start()
    try:
        for values, ok in ((commit, True), (abort, False)):
            await p.begin_transaction()
            for v in values:
                await p.send(topic, v.encode())
            await (p.commit_transaction() if ok else p.abort_transaction())
    finally:
        await p.stop()


def _kafka_python_txns(address: str, topic: str, commit: list[str], abort: list[str]) -> None:
    p = KafkaProducer(bootstrap_servers=address, transactional_id=f"kp-{uuid.uuid4().hex[:6]}")
    try:
        p.init_transactions()
        for values, ok in ((commit, True), (abort, False)):
            p.begin_transaction()
            for v in values:
                p.send(topic, v.encode())
            p.flush()
            (p.commit_transaction if ok else p.abort_transaction)()
    finally:
        p.close(timeout=5)


def _node(script: str, args: dict[str, object], node_path: Path) -> list[str]:
    done = subprocess.run(["node", str(SUPPORT / script), json.dumps(args)], capture_output=True, text=True,
                          timeout=90, env={"NODE_PATH": str(node_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()


def test_read_committed_sees_committed_transactions_of_every_client_never_aborted_ones(
        cluster: Cluster, kafkajs: Path) -> None:
    topic = cluster.topic()
    vals = {name: [f"{name}-{i}" for i in range(n)] for name, n in
            (("A", 30), ("B", 30), ("C", 30), ("KA", 8), ("KB", 8), ("AA", 8), ("AB", 8), ("JA", 8), ("JB", 8))}
    p = _producer(cluster.address, f"c-{uuid.uuid4().hex[:6]}")
    _txn(p, topic, vals["A"], commit=True)
    _txn(p, topic, vals["B"], commit=False)
    _txn(p, topic, vals["C"], commit=True)
    _kafka_python_txns(cluster.address, topic, vals["KA"], vals["KB"])
    asyncio.run(_aiokafka_txns(cluster.address, topic, vals["AA"], vals["AB"]))
    assert _node("kafkajs_txn.js", {"broker": cluster.address, "topic": topic, "id": f"js-{uuid.uuid4().hex[:6]}",
                                    "commit": vals["JA"], "abort": vals["JB"]}, kafkajs) == ["ok"]
    want = sorted(vals["A"] + vals["C"] + vals["KA"] + vals["AA"] + vals["JA"])

    assert sorted(read_committed(cluster.address, topic, partitions=PARTITIONS)) == want
    assert sorted(_kafka_python_read(cluster.address, topic, len(want))) == want
    assert sorted(asyncio.run(_aiokafka_read(cluster.address, topic, len(want)))) == want
    rows = json.loads(_node("kafkajs_read.js", {"broker": cluster.address, "topic": topic, "mode": "earliest",
                                                "count": len(want)}, kafkajs)[-1])
    assert sorted(bytes.fromhex(r[0]).decode() for r in rows) == want


def test_a_transactions_pipelined_requests_are_read_in_the_order_sent(cluster: Cluster) -> None:
    """librdkafka keeps several Produce requests of a partition in flight: their PUTs finish in any
    order, but the commit publishes them in the order they were sent (a Quix application's counts
    of a key once came out 53, 55, 54)."""
    topic = cluster.topic(1, offsets="dense")
    p = _producer(cluster.address, f"o-{uuid.uuid4().hex[:6]}", **{"linger.ms": 0, "batch.num.messages": 1})
    values = [f"v{i}" for i in range(200)]
    p.begin_transaction()
    for v in values:
        p.produce(topic, v.encode(), partition=0)
        p.poll(0)
    assert p.flush(TIMEOUT_S) == 0
    p.commit_transaction(TIMEOUT_S)
    assert read_committed(cluster.address, topic, partitions=1) == values


def test_a_second_producer_with_the_same_id_fences_the_first(cluster: Cluster) -> None:
    topic = cluster.topic()
    txn_id = f"fence-{uuid.uuid4().hex[:6]}"
    first = _producer(cluster.address, txn_id)
    first.begin_transaction()
    first.produce(topic, b"old", partition=0)
    first.flush(TIMEOUT_S)
    second = _producer(cluster.address, txn_id)   # aborts the first's open transaction
    _txn(second, topic, ["new"], commit=True)
    with pytest.raises(KafkaException) as fenced:
        first.commit_transaction(TIMEOUT_S)
    assert fenced.value.args[0].fatal() or fenced.value.args[0].code() in (
        KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
    assert read_committed(cluster.address, topic, partitions=PARTITIONS) == ["new"]


def test_a_vanished_producers_transaction_aborts_after_its_timeout(cluster: Cluster) -> None:
    topic = cluster.topic()
    p = _producer(cluster.address, f"gone-{uuid.uuid4().hex[:6]}", **{"transaction.timeout.ms": 3000})
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, f"lost-{i}".encode(), partition=i % PARTITIONS)
    p.flush(TIMEOUT_S)
    time.sleep(5)   # the producer says nothing more: the coordinator's scan aborts it (epoch bumped)
    with pytest.raises(KafkaException):
        p.commit_transaction(TIMEOUT_S)
    assert read_committed(cluster.address, topic, partitions=PARTITIONS) == []


def test_a_zombie_members_offsets_are_refused_in_its_transaction(cluster: Cluster) -> None:
    """A worker's group metadata taken before the group moved to a new generation: its
    TxnOffsetCommit is ILLEGAL_GENERATION (the transaction must abort), the live one's commits."""
    topic, group = cluster.topic(), f"g-{uuid.uuid4().hex[:6]}"
    conf = {"bootstrap.servers": cluster.address, "group.id": group, "enable.auto.commit": False,
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 200}
    first, second = Consumer(conf), Consumer(conf)
    try:
        first.subscribe([topic])
        deadline = time.monotonic() + TIMEOUT_S
        while not first.assignment():
            assert time.monotonic() < deadline, "never assigned"
            first.poll(0.1)
        zombie = first.consumer_group_metadata()
        second.subscribe([topic])   # a rebalance: a new generation for both
        while not (second.assignment() and first.assignment()):
            assert time.monotonic() < deadline, "never rebalanced"
            first.poll(0.1)
            second.poll(0.1)
        p = _producer(cluster.address, f"z-{uuid.uuid4().hex[:6]}")
        p.begin_transaction()
        with pytest.raises(KafkaException) as refused:
            p.send_offsets_to_transaction([TopicPartition(topic, 0, 5)], zombie, TIMEOUT_S)
        assert refused.value.args[0].code() == KafkaError.ILLEGAL_GENERATION
        p.abort_transaction(TIMEOUT_S)
        p.begin_transaction()
        p.send_offsets_to_transaction([TopicPartition(topic, 0, 5)], first.consumer_group_metadata(), TIMEOUT_S)
        p.commit_transaction(TIMEOUT_S)
        [tp] = first.committed([TopicPartition(topic, 0)], TIMEOUT_S)
        assert tp.offset == 5
    finally:
        first.close()
        second.close()


def test_consume_transform_produce_survives_a_killed_worker_exactly_once(cluster: Cluster) -> None:
    """On dense topics: the offsets sent with each transaction are record numbers, mapped by both brokers alike."""
    source, sink = cluster.topic(2, "dense"), cluster.topic(2, "dense")
    inputs = [f"in-{i}" for i in range(40)]
    feed = Producer({"bootstrap.servers": cluster.address, "acks": "all"})
    for i, v in enumerate(inputs):
        feed.produce(source, v.encode(), partition=i % 2)
    assert feed.flush(TIMEOUT_S) == 0
    argv = [sys.executable, str(SUPPORT / "txn_worker.py"), cluster.address, source, sink,
            f"g-{uuid.uuid4().hex[:6]}", f"w-{uuid.uuid4().hex[:6]}", "2"]
    first = subprocess.Popen([*argv, "--die-after", "2"], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "mid"
    finally:
        first.kill()   # SIGKILL mid-transaction: its records are stored, pending, never committed
        first.wait()
    second = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    assert second.returncode == 0, second.stderr[-2000:]
    assert sorted(read_committed(cluster.address, sink, partitions=2)) == sorted(f"out-{v}" for v in inputs)


def test_a_broker_killed_between_the_records_and_end_txn_leaves_the_transaction_atomic(cluster: Cluster) -> None:
    topic = cluster.topic()
    values = [f"k-{i}" for i in range(12)]
    p = _producer(cluster.address, f"crash-{uuid.uuid4().hex[:6]}", **{"transaction.timeout.ms": 4000})
    p.begin_transaction()
    for i, v in enumerate(values):
        p.produce(topic, v.encode(), partition=i % PARTITIONS)
    p.flush(TIMEOUT_S)
    cluster.gc.kill_broker("b2")   # records stored on both brokers, pending in ZooKeeper
    try:
        p.commit_transaction(15)
        committed = True
    except KafkaException:
        committed = False
    time.sleep(5)   # not committed: the coordinator's scan aborts it after its timeout
    got = sorted(read_committed(cluster.address, topic, partitions=PARTITIONS))
    assert got == (sorted(values) if committed else []), f"committed={committed}: read {got}"
