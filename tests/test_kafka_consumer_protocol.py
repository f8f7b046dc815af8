"""KIP-848 consumer groups coordinated by memq, on a governed two-broker cluster (real broker
processes, ZooKeeper, moto S3, tansu): confluent-kafka members with `group.protocol=consumer`
(3, then one more, then two SIGKILLed) read a 12-partition topic with a commit after each batch
while the group's coordinator broker is SIGKILLed once. Every record is read, and read twice
only when a killed member had read it after its last acknowledged commit; then Kafka's admin
tools list the group by type and alter its offsets."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, ConsumerGroupType, TopicPartition
from confluent_kafka.admin import AdminClient, ConsumerGroupDescription
from bench._group_member import member_log
from tests.support.kafka_clients import kafka_produce, rows
from tests.support.waiting import wait_for

from memq.broker.coordinator import coordinator_of
from memq.client.cluster import fetch_metadata
from memq.config import BrokerConfig, GroupConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PARTITIONS = 12


class Members:
    """Member processes (`bench._group_member`) of one group, each with its log."""

    def __init__(self, tmp: Path, bootstrap: str, topic: str, group: str) -> None:
        self.tmp, self.bootstrap, self.topic, self.group = tmp, bootstrap, topic, group
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def add(self, name: str) -> None:
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "bench._group_member", self.bootstrap, self.topic, self.group, "consumer",
             str(self.tmp / f"{name}.log")], cwd=Path(__file__).parent.parent)

    def kill(self, name: str) -> None:
        self.procs[name].kill()
        self.procs[name].wait(10)

    def stop(self) -> None:
        for p in self.procs.values():
            p.terminate()
        for p in self.procs.values():
            p.wait(20)

    def read(self) -> list[tuple[int, int]]:
        return [r for name in self.procs for r in member_log(self.tmp / f"{name}.log").read]

    def wait_read(self, n: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while len(set(self.read())) < n:
            assert time.monotonic() < deadline, f"read {len(set(self.read()))} of {n}"
            time.sleep(0.2)


def test_consumer_protocol_members_read_each_record_once_through_joins_kills_and_a_coordinator_kill(
        devcluster: DevCluster, tmp_path: Path) -> None:
    topic, group = f"kip848-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    with GovernedCluster(tmp_path, brokers=2, servers=devcluster, cluster=f"k848-{uuid.uuid4().hex[:6]}",
                         session_timeout_s=2.0, broker=BrokerConfig(kafka_port=0),
                         group=GroupConfig(session_timeout_ms=4_000)) as gc:
        gc.create_topic(TopicConfig(name=topic, read_partitions=PARTITIONS, batch_ms=20), brokers=2)
        meta = fetch_metadata(gc.broker("b1").url, 10.0)
        listeners = {b.id: b.kafka_address for b in meta.brokers}
        coordinator = coordinator_of(meta, group)
        assert coordinator is not None
        survivor = next(b for b in listeners if b != coordinator)
        members = Members(tmp_path, ",".join(listeners.values()), topic, group)
        sent = 0

        def produce(n: int, tag: str, broker: str) -> None:
            nonlocal sent
            batch = rows(n, tag)
            for i in range(0, n, 50):
                kafka_produce(listeners[broker], topic, batch[i:i + 50], acks="all")
            sent += n

        try:
            produce(600, "first", survivor)
            for name in ("m1", "m2", "m3"):
                members.add(name)
            members.wait_read(sent)
            admin = AdminClient({"bootstrap.servers": members.bootstrap})

            def stable() -> ConsumerGroupDescription | None:   # ConsumerGroupDescribe: settled on 3 members
                [described] = admin.describe_consumer_groups([group], request_timeout=10).values()
                d = described.result(20)
                return d if d.state == ConsumerGroupState.STABLE else None

            d = wait_for(stable, timeout_s=20, what="the group stable")
            assert len(d.members) == 3
            assert sum(len(m.assignment.topic_partitions) for m in d.members) == PARTITIONS
            members.add("m4")   # a fourth: partitions move to it, revoked first
            produce(600, "second", survivor)
            members.wait_read(sent)
            gc.kill_broker(coordinator)   # the survivor loads the group from ZooKeeper
            produce(600, "third", survivor)
            members.wait_read(sent)
            members.kill("m1")
            members.kill("m2")   # two gone without a word: their session ends, the rest take over
            produce(600, "fourth", survivor)
            members.wait_read(sent, 90)
        finally:
            members.stop()
        # Kafka's admin tools on the same group, now empty: listed by type, its offsets altered
        admin = AdminClient({"bootstrap.servers": listeners[survivor]})
        consumer_groups = admin.list_consumer_groups(types={ConsumerGroupType.CONSUMER}, request_timeout=10).result(20)
        assert group in {g.group_id for g in consumer_groups.valid}
        classic = admin.list_consumer_groups(types={ConsumerGroupType.CLASSIC}, request_timeout=10).result(20)
        assert group not in {g.group_id for g in classic.valid}
        moved = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 0)])
        wait_for(lambda: admin.alter_consumer_group_offsets([moved], request_timeout=10)[group].result(20),
                 timeout_s=20, what="offsets altered once the killed members' sessions ended")
        fetched = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])],
                                                    request_timeout=10)[group].result(20)
        assert [tp.offset for tp in fetched.topic_partitions] == [0]
        got = members.read()
        twice = {r for r, n in Counter(got).items() if n > 1}
        assert len(set(got)) == sent   # nothing lost
        killed = {r for name in ("m1", "m2") for r in member_log(tmp_path / f"{name}.log").uncommitted}
        assert twice <= killed, f"read twice though committed: {sorted(twice - killed)[:10]}"
