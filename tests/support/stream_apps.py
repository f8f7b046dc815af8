"""What the tests of stream-processing applications on memq share (tests/test_faust.py,
tests/test_quix.py): a governed 2-broker cluster with Kafka listeners, a group's lag per
partition as Kafka's tools compute it, and a topic read to its end with read_committed."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from memq.client.cluster import fetch_metadata
from memq.config import BrokerConfig
from memq.devcluster import DevCluster, GovernedCluster


@contextlib.contextmanager
def kafka_cluster(devcluster: DevCluster, path: Path, name: str) -> Iterator[str]:
    """Two governed brokers with Kafka listeners; yields the first one's Kafka address."""
    with GovernedCluster(path, brokers=2, servers=devcluster, cluster=f"{name}{uuid.uuid4().hex[:6]}",
                         broker=BrokerConfig(kafka_port=0)) as gc:
        yield fetch_metadata(gc.broker("b1").url, 10.0).brokers[0].kafka_address


def lag(address: str, group: str, topic: str, partitions: int = 2) -> list[int]:
    """High watermark minus the group's committed offset, per partition (its whole size when none)."""
    parts = [TopicPartition(topic, p) for p in range(partitions)]
    admin = AdminClient({"bootstrap.servers": address})
    done = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, parts)])[group].result(30)
    c = Consumer({"bootstrap.servers": address, "group.id": group})
    try:
        return [c.get_watermark_offsets(tp, timeout=20)[1] - max(tp.offset, 0) for tp in done.topic_partitions]
    finally:
        c.close()


def read_to_end(address: str, topic: str, partitions: int, timeout_s: float = 30.0,
                isolation: str = "read_committed") -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record of `topic` from its start to each partition's end (the last stable offset with
    read_committed), as (partition, key, value), in each partition's order."""
    c = Consumer({"bootstrap.servers": address, "group.id": f"read-{uuid.uuid4().hex[:6]}",
                  "enable.partition.eof": True, "isolation.level": isolation, "fetch.wait.max.ms": 100})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[tuple[int, bytes | None, bytes | None]] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"{topic}: read {len(got)} records, at the end of {at_end}"
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                at_end.add(m.partition())
                continue
            got.append((m.partition(), m.key(), m.value()))
    finally:
        c.close()
    return got
