"""memq's own Producer in transactions, over memq's protocol, on a real governed cluster (two
broker processes, moto S3, tansu, ZooKeeper): commit A, abort B, commit C and memq's Consumer
reads exactly A and C; a second Producer of the same transactional id fences the first (its open
transaction aborted); misuse is refused at once with TransactionError; a Consumer group's offsets are refused until the
service can commit them under memq's own group ids."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Literal

import pytest

from memq.client.consumer import Consumer
from memq.client.producer import Producer
from memq.config import BrokerConfig, MemqConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster
from memq.errors import ProducerFencedError, TransactionError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SETTLE_S = 2.0   # a reader polls this long past the last expected record, so a late one would show


@pytest.fixture(scope="module")
def cluster(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GovernedCluster]:
    with GovernedCluster(tmp_path_factory.mktemp("txn"), brokers=2, servers=devcluster, cluster="producertxn",
                         broker=BrokerConfig(kafka_port=0)) as gc:
        yield gc


def _topic(gc: GovernedCluster, name: str, offsets: Literal["sparse", "dense"] = "dense") -> str:
    topic = f"{name}-{uuid.uuid4().hex[:6]}"
    gc.create_topic(TopicConfig(topic, read_partitions=2, batch_ms=50, offsets=offsets), brokers=2)
    return topic


def _read(config: MemqConfig, topic: str, expect: int, group: str | None = None, timeout_s: float = 60) -> list[bytes]:
    """Every value a fresh group reads: until `expect` came, then SETTLE_S more."""
    got: list[bytes] = []
    loop = asyncio.new_event_loop()
    try:
        with Consumer(config, topic, group_id=group or f"check-{uuid.uuid4().hex[:6]}") as c:
            deadline = loop.time() + timeout_s
            while len(got) < expect and loop.time() < deadline:
                got.extend(bytes(r.value) for r in c.poll(0.5))
            settle = loop.time() + SETTLE_S
            while loop.time() < settle:
                got.extend(bytes(r.value) for r in c.poll(0.2))
    finally:
        loop.close()
    return got


def _values(tag: str, n: int) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(n)]


def test_commit_abort_commit_a_reader_sees_the_committed_exactly(cluster: GovernedCluster) -> None:
    config = cluster.config()
    topic = _topic(cluster, "acb")
    a, b, c = _values("a", 300), _values("b", 200), _values("c", 5)

    async def write() -> None:
        async with Producer(config.producer, transactional_id=f"tx-{topic}") as p:
            await p.begin()
            await asyncio.gather(await p.send_many(topic, a[:150]), await p.send_many(topic, a[150:]))
            await p.commit()
            await p.begin()
            sent_b = await p.send_many(topic, b)
            await p.flush()
            assert len(await sent_b) >= 1          # stored and pending: acked, yet never to be read
            await p.abort()
            await p.begin()
            for v in c:
                await p.send(topic, v)
            await p.commit()

    asyncio.run(write())
    got = _read(config, topic, len(a) + len(c))
    assert sorted(got) == sorted(a + c), f"{len(got)} read, {len(set(got) & set(b))} of the aborted"


def test_a_second_producer_of_the_id_fences_the_first_and_aborts_its_transaction(cluster: GovernedCluster) -> None:
    config = cluster.config()
    topic = _topic(cluster, "fence")
    txn_id = f"tx-{topic}"

    async def write() -> None:
        async with Producer(config.producer, transactional_id=txn_id) as first, \
                Producer(config.producer, transactional_id=txn_id) as second:
            await first.begin()
            await (await first.send_many(topic, _values("old", 50)))   # acked: pending in its transaction
            await second.begin()                                        # a new epoch: first is fenced
            assert second.producer_id == first.producer_id and second.epoch > first.epoch
            with pytest.raises(ProducerFencedError):
                await first.commit()
            with pytest.raises(ProducerFencedError):
                await first.begin()
            await (await second.send_many(topic, _values("new", 50)))
            await second.commit()

    asyncio.run(write())
    assert sorted(_read(config, topic, 50)) == sorted(_values("new", 50))


def test_a_consumer_groups_offsets_commit_with_the_transaction_and_not_with_an_abort(
        cluster: GovernedCluster) -> None:
    """send_offsets: a memq Consumer group's notification offsets commit when the transaction
    commits (under the group's own id, where the Consumer reads them), never when it aborts. (A
    sparse topic: its offsets are notification offsets; a dense topic's record offsets are
    tested in test_kafka_read_clients.)"""
    config = cluster.config()
    topic = _topic(cluster, "offsets", offsets="sparse")
    group = f"g-{topic}"

    async def offsets() -> None:
        async with Producer(config.producer, transactional_id=f"tx-{topic}") as p:
            await p.begin()
            await p.send_offsets(group, {topic: {0: 3}})
            await p.abort()
            await p.begin()
            await p.send_offsets(group, {topic: {0: 5, 1: 2}})
            await p.send(topic, b"with-offsets")
            await p.commit()

    asyncio.run(offsets())
    with Consumer(config, topic, group_id=group, subscribe=False) as c:
        assert c.committed([0, 1]) == {0: 5, 1: 2}


def test_misuse_is_refused_at_once(cluster: GovernedCluster) -> None:
    config = cluster.config()
    topic = _topic(cluster, "misuse")

    async def misuse() -> None:
        async with Producer(config.producer, transactional_id=f"tx-{topic}") as p:
            with pytest.raises(TransactionError, match="begin"):
                await p.send(topic, b"x")
            with pytest.raises(TransactionError, match="begin"):
                await p.commit()
            await p.begin()
            with pytest.raises(TransactionError, match="commit\\(\\) or abort\\(\\) first"):
                await p.begin()
            await p.abort()
        async with Producer(config.producer) as plain:
            with pytest.raises(TransactionError, match="no transactional_id"):
                await plain.begin()

    asyncio.run(misuse())


def test_a_transactional_id_survives_the_producer_the_next_one_continues(cluster: GovernedCluster) -> None:
    """A Producer that closes with its transaction open leaves it to the next one of the id,
    whose first begin aborts it: only the next one's records are read."""
    config = cluster.config()
    topic = _topic(cluster, "handover")

    async def write() -> None:
        async with Producer(config.producer, transactional_id=f"tx-{topic}") as p:
            await p.begin()
            await (await p.send_many(topic, _values("left", 20)))
        async with Producer(config.producer, transactional_id=f"tx-{topic}") as p:
            await p.begin()
            await (await p.send_many(topic, _values("kept", 20)))
            await p.commit()

    asyncio.run(write())
    assert sorted(_read(config, topic, 20)) == sorted(_values("kept", 20))
