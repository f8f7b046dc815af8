"""The broker a Kafka consumer reads from dies (SIGKILL): the consumer goes on through another
broker and loses nothing, on a governed two-broker cluster (real broker processes, ZooKeeper,
moto S3, tansu). Any broker serves any topic's reads (the data is in S3, offsets are a pure
function of the notifications), so the survivor answers from where the consumer was."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from tests.support.kafka_clients import Row, as_rows, kafka_produce, rows

from memq.client.cluster import fetch_metadata
from memq.config import BrokerConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster
from memq.kafka_api.mapping import node_id

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PARTITIONS = 2


def read(c: Consumer, n: int, got: list[tuple[int, int, Row]], timeout_s: float = 90) -> None:
    """Append (partition, offset, row) to `got` until it holds `n`; transport errors while a
    broker is down are the client's to retry, any other error fails."""
    deadline = time.monotonic() + timeout_s
    while len(got) < n:
        assert time.monotonic() < deadline, f"read {len(got)} of {n} records"
        for m in c.consume(500, 0.5):
            err = m.error()
            if err is None:
                got.append((m.partition(), m.offset(), (m.value(), m.key(), tuple(m.headers() or ()),
                                                        m.timestamp()[1])))
            else:
                assert err.code() in (KafkaError._PARTITION_EOF, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                                      KafkaError.NOT_LEADER_OR_FOLLOWER), err


def test_a_consumer_goes_on_through_another_broker_when_its_broker_is_killed(devcluster: DevCluster,
                                                                           tmp_path: Path) -> None:
    topic = f"failover-{uuid.uuid4().hex[:6]}"
    with GovernedCluster(tmp_path, brokers=2, servers=devcluster, cluster=f"kfo-{uuid.uuid4().hex[:6]}",
                         session_timeout_s=2.0, broker=BrokerConfig(kafka_port=0)) as gc:
        assert set(gc.create_topic(TopicConfig(name=topic, read_partitions=PARTITIONS, batch_ms=50),
                                   brokers=2)) == {"b1", "b2"}
        listeners = {b.id: b.kafka_address for b in fetch_metadata(gc.broker("b1").url, 10.0).brokers}
        before, after = rows(1_000, "before"), rows(500, "after")
        for i in range(0, len(before), 100):   # parts in both partitions (a notification's partition is random)
            kafka_produce(listeners["b2"], topic, before[i:i + 100], acks="all")
        c = Consumer({"bootstrap.servers": ",".join(listeners.values()), "group.id": "unused",
                      "enable.auto.commit": False, "fetch.wait.max.ms": 200, "max.partition.fetch.bytes": 4096,
                      "queued.min.messages": 10, "queued.max.messages.kbytes": 16,   # little read ahead
                      "topic.metadata.refresh.interval.ms": 1000})
        got: list[tuple[int, int, Row]] = []
        try:
            c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
            read(c, 300, got)   # mid-stream: small fetches, so the killed broker served only part of it
            [meta] = c.list_topics(topic, timeout=10).topics.values()
            assert node_id("b1") in {p.leader for p in meta.partitions.values()}   # b1 serves this consumer
            gc.kill_broker("b1")
            for i in range(0, len(after), 100):
                kafka_produce(listeners["b2"], topic, after[i:i + 100], acks="all")
            read(c, len(before) + len(after), got)
            [meta] = c.list_topics(topic, timeout=10).topics.values()
            assert {p.leader for p in meta.partitions.values()} == {node_id("b2")}   # all through b2 now
        finally:
            c.close()
        assert sorted(r for _, _, r in got) == sorted(as_rows(before + after))   # nothing lost, nothing twice
        for p in range(PARTITIONS):   # offsets went on where they were, on the other broker
            offsets = [o for part, o, _ in got if part == p]
            assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
