"""Kafka's cluster calls and the group gaps on a governed cluster of real broker processes (moto S3,
tansu, ZooKeeper): DescribeCluster, DescribeLogDirs, DescribeProducers (kafka-python's and
confluent-kafka's admin clients), OffsetForLeaderEpoch (a raw v2 frame, as librdkafka sends it),
`kcat -L` and `kcat -G`, an old JoinGroup member (kafka-python pinned to 0.11: JoinGroup v2; raw v0 and v1
frames) sharing a topic with a JoinGroup v5 member (confluent-kafka), and OffsetDelete."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient, KafkaConsumer
from kafka import TopicPartition as KTopicPartition
from kafka.protocol.consumer import OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse
from tests.support.kafka_clients import kafka_produce, rows

from memq.broker.coordinator import coordinator_of
from memq.client.cluster import fetch_metadata
from memq.config import BrokerConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster
from memq.kafka_api.mapping import node_id

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "orders"
PARTITIONS = 4
RECORDS = 200


class Cluster:
    def __init__(self, gc: GovernedCluster) -> None:
        self.gc = gc
        meta = fetch_metadata(gc.broker("b1").url, 10.0)
        self.addresses = {b.id: b.kafka_address for b in meta.brokers}
        self.address = self.addresses["b1"]
        self.meta = meta

    def coordinator(self, group: str) -> str:
        """The Kafka listener of `group`'s coordinator (what FindCoordinator answers)."""
        coordinator = coordinator_of(self.meta, group)
        assert coordinator is not None
        return self.addresses[coordinator]


@pytest.fixture(scope="module")
def cluster(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with GovernedCluster(tmp_path_factory.mktemp("admin-cluster"), brokers=2, servers=devcluster,
                         cluster=f"adm{uuid.uuid4().hex[:6]}", broker=BrokerConfig(kafka_port=0)) as gc:
        gc.create_topic(TopicConfig(TOPIC, read_partitions=PARTITIONS, batch_ms=50), brokers=2)
        c = Cluster(gc)
        kafka_produce(c.address, TOPIC, rows(RECORDS, "adm"), acks="all")
        yield c


def test_describe_cluster_names_the_brokers_and_the_governor(cluster: Cluster) -> None:
    gc = cluster.gc
    # librdkafka describes the cluster with Metadata (v10): its controller is the broker answering
    admin = AdminClient({"bootstrap.servers": cluster.address})
    described = admin.describe_cluster(request_timeout=20).result(30)
    assert described.cluster_id == gc.cluster
    assert {(n.id, f"{n.host}:{n.port}") for n in described.nodes} == {
        (node_id(b), a) for b, a in cluster.addresses.items()}
    assert described.controller.id in {n.id for n in described.nodes}
    k = KafkaAdminClient(bootstrap_servers=cluster.address)   # DescribeCluster v0-2
    try:
        got = k.describe_cluster()
    finally:
        k.close()
    assert got["cluster_id"] == gc.cluster and got["controller_id"] == node_id(gc.governor())
    assert {(b["broker_id"], f"{b['host']}:{b['port']}") for b in got["brokers"]} == {
        (node_id(b), a) for b, a in cluster.addresses.items()}
    assert {"DESCRIBE", "ALTER", "IDEMPOTENT_WRITE"} <= set(got["authorized_operations"])   # security off: all


def test_log_dirs_hold_each_partition_once_across_the_brokers(cluster: Cluster) -> None:
    k = KafkaAdminClient(bootstrap_servers=cluster.address)
    try:
        answers = k.describe_log_dirs()
        producers = k.describe_producers([KTopicPartition(TOPIC, p) for p in range(PARTITIONS)])
    finally:
        k.close()
    held = []
    for answer in answers:
        [d] = answer["log_dirs"]
        assert d["error_code"] == 0 and d["log_dir"] == "s3://memq"
        held += [(t["name"], p["partition_index"]) for t in d["topics"] for p in t["partitions"]
                 if t["name"] == TOPIC]
    assert sorted(held) == [(TOPIC, p) for p in range(PARTITIONS)]   # each led by exactly one broker
    assert set(producers) == {KTopicPartition(TOPIC, p) for p in range(PARTITIONS)}
    assert all(not s.active_producers for s in producers.values()), producers


def _call(address: str, api_key: int, version: int, body: bytes) -> bytes:
    """One request (header v1) on a fresh connection; the response body after the correlation id."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as s:
        frame = struct.pack(">hhih", api_key, version, 7, 4) + b"test" + body
        s.sendall(struct.pack(">i", len(frame)) + frame)
        head = s.recv(4, socket.MSG_WAITALL)
        assert len(head) == 4, "connection closed"
        (size,) = struct.unpack(">i", head)
        data = s.recv(size, socket.MSG_WAITALL)
    assert struct.unpack(">i", data[:4])[0] == 7
    return data[4:]


def test_offset_for_leader_epoch_ends_at_the_high_watermark(cluster: Cluster) -> None:
    c = Consumer({"bootstrap.servers": cluster.address, "group.id": "wm"})
    try:
        highs = {p: c.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=20)[1] for p in range(PARTITIONS)}
    finally:
        c.close()
    assert sum(1 for h in highs.values() if h > 0) >= 1
    req = OffsetForLeaderEpochRequest(topics=[OffsetForLeaderEpochRequest.OffsetForLeaderTopic(
        topic=t, partitions=[OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
            partition=p, current_leader_epoch=-1, leader_epoch=5) for p in range(PARTITIONS)])
        for t in (TOPIC, "no-such-topic")])
    got = OffsetForLeaderEpochResponse.decode(_call(cluster.address, 23, 2, bytes(req.encode(version=2))), version=2)
    mine, unknown = got.topics
    assert {p.partition: (p.error_code, p.leader_epoch, p.end_offset) for p in mine.partitions} == {
        p: (0, 5, highs[p]) for p in range(PARTITIONS)}
    assert {p.error_code for p in unknown.partitions} == {3}


def test_kcat_lists_the_cluster(cluster: Cluster) -> None:
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (apt-get install kcat)")
    out = subprocess.run(["kcat", "-L", "-b", cluster.address, "-m", "20"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert f"{len(cluster.addresses)} brokers:" in out
    for b, address in cluster.addresses.items():
        assert f"broker {node_id(b)} at {address}" in out
    assert f'topic "{TOPIC}" with {PARTITIONS} partitions:' in out


def test_kcat_reads_in_a_group_and_commits(cluster: Cluster) -> None:
    """`kcat -G` (librdkafka 2.0, a classic group member) reads every record and its group's commits stay."""
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (apt-get install kcat)")
    group = f"kcat-{uuid.uuid4().hex[:6]}"
    out = subprocess.run(["kcat", "-b", cluster.address, "-G", group, "-o", "beginning", "-c", str(RECORDS),
                          "-f", "%p %o\\n", "-X", "auto.commit.interval.ms=100", TOPIC],
                         capture_output=True, text=True, timeout=90, check=True).stdout
    read = [tuple(map(int, line.split())) for line in out.splitlines()]
    assert len(set(read)) == RECORDS == len(read)
    c = Consumer({"bootstrap.servers": cluster.address, "group.id": group})
    try:
        committed = c.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=20)
    finally:
        c.close()
    last = {p: max(o for q, o in read if q == p) + 1 for p in {q for q, _ in read}}
    assert {tp.partition: tp.offset for tp in committed if tp.offset >= 0} == last


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


@pytest.mark.parametrize("version", [0, 1])
def test_an_old_join_group_gets_a_member_id_not_member_id_required(cluster: Cluster, version: int) -> None:
    group = f"old-{version}-{uuid.uuid4().hex[:6]}"
    body = _s(group) + struct.pack(">i", 6000) + (struct.pack(">i", 6000) if version >= 1 else b"")
    body += _s("") + _s("consumer") + struct.pack(">i", 1) + _s("range") + struct.pack(">i", 4) + b"\0\0\0\0"
    answer = _call(cluster.coordinator(group), 11, version, body)
    error, generation = struct.unpack(">hi", answer[:6])
    assert error == 0 and generation >= 0   # joined (not 79, MEMBER_ID_REQUIRED), in the v0/v1 shape
    rest = answer[6:]
    parts = []
    for _ in range(3):   # protocol, leader, member id
        (n,) = struct.unpack(">h", rest[:2])
        parts.append(rest[2:2 + n].decode())
        rest = rest[2 + n:]
    assert parts[0] == "range" and parts[1] == parts[2] and parts[2]   # the only member leads


def test_an_old_member_and_a_new_one_share_a_topic(cluster: Cluster) -> None:
    group = f"mixed-{uuid.uuid4().hex[:6]}"
    old = KafkaConsumer(TOPIC, bootstrap_servers=cluster.address, group_id=group, api_version=(0, 11, 0),
                        auto_offset_reset="earliest", enable_auto_commit=False, session_timeout_ms=6_000,
                        heartbeat_interval_ms=500, max_poll_interval_ms=6_000, consumer_timeout_ms=500)
    new = Consumer({"bootstrap.servers": cluster.address, "group.id": group, "auto.offset.reset": "earliest",
                    "enable.auto.commit": False, "session.timeout.ms": 6_000, "heartbeat.interval.ms": 500,
                    "max.poll.interval.ms": 6_000})
    got_old: set[bytes] = set()
    got_new: set[bytes] = set()
    stop = threading.Event()

    def poll_old() -> None:
        while not stop.is_set():
            for records in old.poll(timeout_ms=200).values():
                got_old.update(r.value for r in records)

    worker = threading.Thread(target=poll_old, daemon=True)
    worker.start()
    try:
        new.subscribe([TOPIC])
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            for m in new.consume(100, 0.3):
                if m.error() is None:
                    got_new.add(m.value())
                else:
                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
            mine = {tp.partition for tp in new.assignment()}
            theirs = {tp.partition for tp in old.assignment()}
            if mine and theirs and mine | theirs == set(range(PARTITIONS)) \
                    and len(got_old | got_new) == RECORDS:
                break
        mine = {tp.partition for tp in new.assignment()}
        theirs = {tp.partition for tp in old.assignment()}
        assert mine and theirs and not mine & theirs and mine | theirs == set(range(PARTITIONS)), (mine, theirs)
        # Together they read every record. Which one read what depends on when the rebalance split
        # the partitions (the first member may have read them all before): not asserted.
        assert len(got_old | got_new) == RECORDS, (len(got_old), len(got_new))
    finally:
        stop.set()
        worker.join(10)
        new.close()
        old.close()


def test_offset_delete_forgets_an_empty_groups_offsets(cluster: Cluster) -> None:
    group = f"del-{uuid.uuid4().hex[:6]}"
    tps = [TopicPartition(TOPIC, p, 1) for p in range(PARTITIONS)]
    c = Consumer({"bootstrap.servers": cluster.address, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=tps, asynchronous=False)
        assert [tp.offset for tp in c.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], 20)] == \
            [1] * PARTITIONS
        k = KafkaAdminClient(bootstrap_servers=cluster.address)
        try:
            result = k.delete_group_offsets(group, [KTopicPartition(TOPIC, 0), KTopicPartition(TOPIC, 2),
                                                    KTopicPartition("no-such-topic", 0)])
        finally:
            k.close()
        assert {tp: e.__name__ for tp, e in result.items()} == {
            KTopicPartition(TOPIC, 0): "NoError", KTopicPartition(TOPIC, 2): "NoError",
            KTopicPartition("no-such-topic", 0): "UnknownTopicOrPartitionError"}
        left = c.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], 20)
        assert [tp.offset for tp in left] == [-1001, 1, -1001, 1]   # -1001: none committed
    finally:
        c.close()

