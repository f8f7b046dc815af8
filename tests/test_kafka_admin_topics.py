"""Kafka's admin tools create, describe, alter, grow and delete memq topics through a governed
cluster's Kafka listeners (real ZooKeeper, governor, moto S3, tansu): confluent-kafka's
AdminClient, kafka-python's KafkaAdminClient, aiokafka's admin client and kafkajs' admin. What
they are told agrees with the governor's placement, `memq topic describe` and every broker's
Metadata; each version served answers in its own shape (kafka-python's codec of Kafka's schemas)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AioNewTopic
from aiokafka.admin.config_resource import ConfigResource as AioResource
from aiokafka.admin.config_resource import ConfigResourceType as AioResourceType
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource,
                                   NewPartitions, NewTopic)
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource as KpResource
from kafka.admin import ConfigResourceType as KpResourceType
from kafka.protocol import admin as kp
from tests.support.cli import memq
from tests.support.kafka_frames import Wire

from memq.client.cluster import fetch_metadata
from memq.config import BrokerConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster
from memq.errors import UnknownTopicError
from memq.kafka_api.metadata_flex import topic_id
from memq.kafka_api.protocol import ErrorCode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

KAFKAJS_ADMIN = Path(__file__).with_name("support") / "kafkajs_admin.js"
WAIT_MS = 30_000


@pytest.fixture(scope="module")
def gc(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GovernedCluster]:
    with GovernedCluster(tmp_path_factory.mktemp("kadmin"), brokers=2, servers=devcluster,
                         cluster=f"kadm-{uuid.uuid4().hex[:6]}", broker=BrokerConfig(kafka_port=0)) as cluster:
        yield cluster


def listeners(gc: GovernedCluster) -> dict[str, str]:
    return {b.id: b.kafka_address for b in fetch_metadata(gc.broker("b1").url, 10.0).brokers}


def name(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:6]}"


def stored(gc: GovernedCluster, topic: str) -> TopicConfig | None:
    try:
        return gc.registry.topic(topic)
    except UnknownTopicError:
        return None


def kafka_error(future: Any) -> KafkaError | None:
    try:
        future.result(40)
    except KafkaException as e:
        return e.args[0]
    return None


def test_confluent_admin_creates_describes_alters_grows_and_deletes(gc: GovernedCluster, tmp_path: Path) -> None:
    topic = name("orders")
    b1, b2 = listeners(gc).values()
    admin = AdminClient({"bootstrap.servers": b1})
    new = NewTopic(topic, 2, replication_factor=3, config={"retention.ms": "3600000", "memq.batch.ms": "40"})
    assert kafka_error(admin.create_topics([new], operation_timeout=30)[topic]) is None
    # the governor placed it with those settings; every broker's Metadata and memq's CLI agree
    cfg = stored(gc, topic)
    assert cfg is not None and (cfg.read_partitions, cfg.retention_ms, cfg.batch_ms) == (2, 3_600_000, 40)
    assert cfg.offsets == "dense"          # what Kafka applications count on: record numbers
    assert gc.wait_placed(topic)
    for address in (b1, b2):
        client = AdminClient({"bootstrap.servers": address})
        meta = client.list_topics(topic, timeout=20).topics[topic]
        assert meta.error is None and len(meta.partitions) == 2
    described = memq("topic", "describe", topic, config=gc.write_client_config(tmp_path / "client.toml"))
    assert described.returncode == 0, described.stderr
    assert f"memq.{gc.cluster}.{topic}" in described.stdout.decode()
    assert [line.split()[1] for line in described.stdout.decode().splitlines() if line.split()[1:2] in (["0"], ["1"])] \
        == ["0", "1"]

    assert kafka_error(admin.create_topics([NewTopic(topic, 1)], operation_timeout=10)[topic]).code() \
        == KafkaError.TOPIC_ALREADY_EXISTS

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(20)
    assert configs["retention.ms"].value == "3600000" and configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["max.message.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["message.timestamp.type"].is_read_only and not configs["retention.ms"].is_read_only
    assert configs["memq.notification.topic"].value == f"memq.{gc.cluster}.{topic}"
    # the other broker answers the same
    admin2 = AdminClient({"bootstrap.servers": b2})
    other = admin2.describe_configs([resource])[resource].result(20)
    assert {k: v.value for k, v in other.items()} == {k: v.value for k, v in configs.items()}

    change = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("memq.batch.ms", None, incremental_operation=AlterConfigOpType.DELETE)])
    assert kafka_error(admin.incremental_alter_configs([change])[change]) is None
    cfg = stored(gc, topic)
    assert cfg is not None and (cfg.retention_ms, cfg.batch_ms) == (7_200_000, TopicConfig(name="x").batch_ms)

    inert = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[   # Kafka's, no effect here
        ConfigEntry("segment.bytes", "1048576", incremental_operation=AlterConfigOpType.SET)])
    assert kafka_error(admin.incremental_alter_configs([inert])[inert]) is None
    described = admin.describe_configs([resource])[resource].result(20)["segment.bytes"]
    assert described.value == "1048576" and described.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    for entry, words in [(ConfigEntry("segment.byte", "1", incremental_operation=AlterConfigOpType.SET),
                          "did you mean segment.bytes?"),
                         (ConfigEntry("cleanup.policy", "shred", incremental_operation=AlterConfigOpType.SET),
                          "want delete, compact or compact,delete")]:
        bad = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
        err = kafka_error(admin.incremental_alter_configs([bad])[bad])
        assert err is not None and err.code() == KafkaError.INVALID_CONFIG and words in err.str()
    bad_topic = name("bad")
    refused = kafka_error(admin.create_topics([NewTopic(bad_topic, 1, config={"min.insync.replica": "2"})])[bad_topic])
    assert refused is not None and refused.code() == KafkaError.INVALID_CONFIG and "min.insync.replicas?" in refused.str()
    assert stored(gc, bad_topic) is None

    # more read partitions: tansu cannot grow its notification topic, and says so; never fewer
    grown = kafka_error(admin.create_partitions([NewPartitions(topic, 3)])[topic])
    assert grown is not None and grown.code() == KafkaError.INVALID_PARTITIONS and "CreatePartitions" in grown.str()
    shrunk = kafka_error(admin.create_partitions([NewPartitions(topic, 1)])[topic])
    assert shrunk is not None and shrunk.code() == KafkaError.INVALID_PARTITIONS
    assert (cfg := stored(gc, topic)) is not None and cfg.read_partitions == 2

    assert kafka_error(admin.delete_topics([topic], operation_timeout=20)[topic]) is None
    assert stored(gc, topic) is None
    assert topic not in admin.list_topics(timeout=20).topics
    assert kafka_error(admin.delete_topics([topic], operation_timeout=20)[topic]).code() \
        == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_kafka_python_admin_creates_describes_alters_and_deletes(gc: GovernedCluster) -> None:
    topic = name("kp")
    admin = KafkaAdminClient(bootstrap_servers=listeners(gc)["b2"])
    try:
        created = admin.create_topics({topic: {"num_partitions": 1, "configs": {
            "retention.ms": "60000", "memq.expected.mbps": "2.5"}}}, timeout_ms=WAIT_MS)
        [result] = created["topics"]
        assert result["error_code"] == 0 and result["num_partitions"] == 1 and result["replication_factor"] == 1
        assert result["configs"]["retention.ms"]["value"] == "60000"
        cfg = stored(gc, topic)
        assert cfg is not None and (cfg.retention_ms, cfg.expected_mbps) == (60_000, 2.5)
        # "modified": the settings whose source is DYNAMIC_TOPIC_CONFIG, as Kafka reports them
        modified = admin.describe_configs([KpResource(KpResourceType.TOPIC, topic)])["topic"][topic]
        assert {k: v["value"] for k, v in modified.items()} == {"retention.ms": "60000", "memq.expected.mbps": "2.5",
                                                                "memq.read.partitions": "1"}   # dense: the default
        def alter(value: str) -> str:
            return str(admin.alter_configs([KpResource(KpResourceType.TOPIC, topic, configs={"memq.batch.bytes": value})],
                                           raise_on_unknown=False)["topic"][topic])
        # memq's checks, Kafka's error: a batch smaller than the largest Message is INVALID_CONFIG (40)
        assert "Error 40" in (refused := alter(str(1 << 20))) and "memq.batch.bytes" in refused
        alter(str(16 << 20))
        assert (cfg := stored(gc, topic)) is not None and cfg.batch_bytes == 16 << 20
        bad = admin.create_topics({"no/slashes": {"num_partitions": 1}}, raise_errors=False)
        assert bad["topics"][0]["error_code"] == ErrorCode.INVALID_TOPIC_EXCEPTION
        admin.delete_topics([topic], timeout_ms=WAIT_MS)
        assert stored(gc, topic) is None
    finally:
        admin.close()


def test_aiokafka_admin_creates_describes_and_deletes(gc: GovernedCluster) -> None:
    topic = name("aio")

    async def scenario() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=listeners(gc)["b1"])
        await admin.start()
        try:
            created = await admin.create_topics([AioNewTopic(topic, 2, 1, topic_configs={"memq.batch.ms": "60",
                                                                                         "memq.offsets": "sparse"})],
                                                timeout_ms=WAIT_MS)
            assert [t[1] for t in created.topic_errors] == [0]
            [described] = await admin.describe_configs([AioResource(AioResourceType.TOPIC, topic)])
            values = {c[0]: c[1] for c in described.resources[0][4]}
            assert values["memq.batch.ms"] == "60" and values["memq.read.partitions"] == "2"
            assert values["memq.offsets"] == "sparse"        # the request chose them over memq's default, dense
            deleted = await admin.delete_topics([topic], timeout_ms=WAIT_MS)
            assert [t[1] for t in deleted.topic_error_codes] == [0]
        finally:
            await admin.close()
    asyncio.run(scenario())
    assert stored(gc, topic) is None


def test_kafkajs_admin_creates_a_topic_and_describes_its_configs(gc: GovernedCluster, kafkajs: Path) -> None:  # noqa: F811
    topic = name("js")
    done = subprocess.run(["node", str(KAFKAJS_ADMIN), json.dumps({
        "broker": listeners(gc)["b1"], "topic": topic, "partitions": 2, "configs": {"retention.ms": "120000"}})],
        capture_output=True, text=True, timeout=90, env={"NODE_PATH": str(kafkajs), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["created"] is True and got["partitions"] == 2
    assert got["configs"]["retention.ms"]["value"] == "120000"
    assert got["configs"]["memq.read.partitions"]["readOnly"] is True
    assert got["refused"].startswith("INVALID_CONFIG")   # kafkajs shows the code, not the message
    cfg = stored(gc, topic)
    assert cfg is not None and cfg.retention_ms == 120_000 and gc.wait_placed(topic)


# --- every version served, in its own shape ------------------------------------------------


def test_every_version_answers_in_its_shape(gc: GovernedCluster) -> None:
    wire = Wire(listeners(gc)["b1"])
    ct, dt, cp = kp.CreateTopicsRequest, kp.DeleteTopicsRequest, kp.CreatePartitionsRequest
    topics = {v: name(f"v{v}") for v in range(7)}
    for v, topic in topics.items():   # created without waiting (timeout 0, as Kafka)
        got = wire.call(ct(topics=[ct.CreatableTopic(name=topic, num_partitions=1, replication_factor=-1, assignments=[],
                                                     configs=[ct.CreatableTopic.CreatableTopicConfig(
                                                         name="retention.ms", value="50000")])],
                           timeout_ms=0, validate_only=False), kp.CreateTopicsResponse, v)
        assert got.topics[0].error_code == 0, got
        if v >= 5:
            assert got.topics[0].num_partitions == 1 and got.topics[0].replication_factor == 1
    checked = wire.call(ct(topics=[ct.CreatableTopic(name=name("v7"), num_partitions=-1, replication_factor=3,
                                                     assignments=[], configs=[])], timeout_ms=WAIT_MS,
                           validate_only=True), kp.CreateTopicsResponse, 7)
    assert checked.topics[0].error_code == 0 and checked.topics[0].num_partitions == TopicConfig(name="x").read_partitions
    assert stored(gc, checked.topics[0].name) is None   # validate only
    dc, inc, ac = kp.DescribeConfigsRequest, kp.IncrementalAlterConfigsRequest, kp.AlterConfigsRequest
    topic = topics[0]
    for v in range(5):
        got = wire.call(dc(resources=[dc.DescribeConfigsResource(resource_type=2, resource_name=topic,
                                                                 configuration_keys=["retention.ms"])],
                           include_synonyms=True, include_documentation=True), kp.DescribeConfigsResponse, v)
        [entry] = got.results[0].configs
        assert (entry.name, entry.value) == ("retention.ms", "50000")
    for v in range(2):
        got = wire.call(inc(resources=[inc.AlterConfigsResource(resource_type=2, resource_name=topic, configs=[
            inc.AlterConfigsResource.AlterableConfig(name="retention.ms", config_operation=0, value=str(51000 + v))])],
            validate_only=False), kp.IncrementalAlterConfigsResponse, v)
        assert got.responses[0].error_code == 0
    assert (cfg := stored(gc, topic)) is not None and cfg.retention_ms == 51001
    wire.call(inc(resources=[inc.AlterConfigsResource(resource_type=2, resource_name=topic, configs=[
        inc.AlterConfigsResource.AlterableConfig(name="memq.batch.ms", config_operation=0, value="77")])],
        validate_only=False), kp.IncrementalAlterConfigsResponse, 1)
    for v in range(3):   # AlterConfigs replaces: memq.batch.ms, not listed, returns to its default
        got = wire.call(ac(resources=[ac.AlterConfigsResource(resource_type=2, resource_name=topic, configs=[
            ac.AlterConfigsResource.AlterableConfig(name="retention.ms", value=str(52000 + v))])],
            validate_only=False), kp.AlterConfigsResponse, v)
        assert got.responses[0].error_code == 0
    assert (cfg := stored(gc, topic)) is not None and (cfg.retention_ms, cfg.batch_ms) == (52002, 250)
    for v in range(4):
        got = wire.call(cp(topics=[cp.CreatePartitionsTopic(name=topic, count=1, assignments=None)], timeout_ms=WAIT_MS,
                           validate_only=False), kp.CreatePartitionsResponse, v)
        assert got.results[0].error_code == ErrorCode.INVALID_PARTITIONS
    for v, topic in topics.items():
        state = dt.DeleteTopicState(name=None, topic_id=topic_id(gc.cluster, topic)) if v >= 6 else None
        got = wire.call(dt(topics=[state] if state else [], topic_names=[] if state else [topic], timeout_ms=WAIT_MS),
                        kp.DeleteTopicsResponse, v)
        assert got.responses[0].error_code == 0 and stored(gc, topic) is None, got
    gone = wire.call(dt(topics=[dt.DeleteTopicState(name=None, topic_id=uuid.uuid4())], timeout_ms=WAIT_MS),
                     kp.DeleteTopicsResponse, 6)
    assert gone.responses[0].error_code == ErrorCode.UNKNOWN_TOPIC_ID
