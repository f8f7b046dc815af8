"""The dev cluster runs real servers, and never leaves one behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

from memq.devcluster import DevCluster

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (killed, not yet reaped by init) counts as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_dead(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def test_kafka_topic_produce_consume(devcluster: DevCluster, unique_name) -> None:
    topic = unique_name("dc")
    admin = AdminClient({"bootstrap.servers": devcluster.kafka_bootstrap})
    for f in admin.create_topics([NewTopic(topic, 3, 1)], request_timeout=10).values():
        f.result(timeout=10)
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 3

    producer = Producer({"bootstrap.servers": devcluster.kafka_bootstrap, "acks": "all"})
    sent = {f"v{i}".encode() for i in range(300)}
    for v in sent:
        producer.produce(topic, v)
    assert producer.flush(15) == 0

    consumer = Consumer({"bootstrap.servers": devcluster.kafka_bootstrap, "group.id": unique_name("g"),
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
    got: set[bytes] = set()
    deadline = time.monotonic() + 20
    while got != sent and time.monotonic() < deadline:
        for m in consumer.consume(500, timeout=1):
            assert m.error() is None
            got.add(m.value())
    consumer.close()
    assert got == sent


def test_zookeeper_znodes(devcluster: DevCluster, unique_name) -> None:
    zk = KazooClient(hosts=devcluster.zk_hosts, timeout=5)
    zk.start(timeout=10)
    try:
        path = f"/{unique_name('dc')}/a/b"
        zk.create(path, b"hello", makepath=True)
        eph = zk.create(f"{path}/e", ephemeral=True, sequence=True)
        assert zk.get(path)[0] == b"hello"
        assert zk.get_children(path) == [eph.rsplit("/", 1)[1]]
    finally:
        zk.stop()
        zk.close()


def test_s3_bucket_and_config(devcluster: DevCluster, unique_name) -> None:
    bucket = unique_name("b")
    cfg = devcluster.config(cluster="c1", bucket=bucket)
    assert cfg.s3.bucket == bucket and cfg.cluster.name == "c1"
    assert cfg.kafka.bootstrap_servers == devcluster.kafka_bootstrap
    assert cfg.zookeeper.hosts == devcluster.zk_hosts
    s3 = boto3.client("s3", endpoint_url=cfg.s3.endpoint_url, region_name=cfg.s3.region,
                      aws_access_key_id=cfg.s3.access_key_id, aws_secret_access_key=cfg.s3.secret_access_key)
    body = os.urandom(70_000)
    s3.put_object(Bucket=bucket, Key="k", Body=body)
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == body


def test_stop_leaves_no_process(tmp_path: Path) -> None:
    cluster = DevCluster(tmp_path, kafka=False)
    with cluster:
        pids = cluster.pids
        assert set(pids) == {"s3", "zookeeper"}
        assert cluster.kafka_bootstrap is None and cluster.s3_endpoint and cluster.zk_hosts
        assert cluster.config().kafka.bootstrap_servers == "127.0.0.1:9092"  # default kept
        assert all(_alive(p) for p in pids.values())
    assert _wait_dead(list(pids.values()), 1) == []
    for pid in pids.values():  # nothing left in the servers' process groups either
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
    assert (tmp_path / "logs" / "zookeeper.log").exists()
    cluster.stop()  # idempotent


_PARENT = """
import json, sys, time
from memq.devcluster import DevCluster
c = DevCluster(sys.argv[1]).start()
print(json.dumps(c.pids), flush=True)
time.sleep(120)
"""


def test_servers_die_with_sigkilled_parent(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(tmp_path / uuid.uuid4().hex)],
                              stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()  # type: ignore[union-attr]
        pids = json.loads(line)
        assert set(pids) == {"s3", "kafka", "zookeeper"}
        assert all(_alive(p) for p in pids.values())
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
    assert _wait_dead(list(pids.values()), 10) == []
