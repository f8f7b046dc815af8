"""memq's topic settings under Kafka's config names (`memq.kafka_api.topic_configs`, pure),
TopicManager growing a topic's read partitions (notification topic first, never shrinking), and
the topics and configs families' refusals with an in-memory core (ACLs, no ZooKeeper)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest
from kafka.protocol import admin as kp
from tests.support.security import ALICE_ENTRY

from memq.broker.doors import kafka_admin_configs, kafka_admin_topics
from memq.broker.guard import Guard
from memq.broker.metrics import BrokerMetrics
from memq.config import MemqConfig, SecurityConfig, TopicConfig
from memq.errors import ConfigError, InvalidInputError
from memq.governor.registry import topic_from_json, topic_to_json
from memq.governor.topics import TopicManager
from memq.format.metadata import ClusterMetadata, StorageMetadata
from memq.kafka_api import topic_configs as tc
from memq.kafka_api.protocol import ErrorCode, decode_request_header
from memq.kafka_api.topic_configs import AlterOp, ConfigSource

CLUSTER = "c1"


def test_every_topic_setting_has_one_kafka_name() -> None:
    fields = [f.name for f in dataclasses.fields(TopicConfig) if f.name not in ("name", "kafka_inert")]
    mapped = [s.field for s in tc.SETTINGS if s.field]
    assert sorted(mapped) == sorted(fields)
    assert len({s.name for s in tc.SETTINGS}) == len(tc.SETTINGS)
    assert {s.name for s in tc.SETTINGS if not s.field} == set(tc.FIXED)


def test_describe_reports_values_sources_and_read_only_as_kafka() -> None:
    cfg = TopicConfig(name="t", retention_ms=60_000, batch_ms=40)
    got = {e.name: e for e in tc.describe(cfg, CLUSTER)}
    assert got["retention.ms"].value == "60000" and got["retention.ms"].source is ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert got["memq.batch.ms"].value == "40" and not got["memq.batch.ms"].is_default
    assert got["max.message.bytes"].source is ConfigSource.DEFAULT_CONFIG and got["max.message.bytes"].is_default
    assert got["retention.bytes"].value == "-1"               # no limit, as Kafka says it
    assert got["memq.max.batch.ms"].value is None              # unset: batch_ms
    assert got["memq.notification.topic"].value == "memq.c1.t"
    assert got["cleanup.policy"].value == "delete" and got["message.timestamp.type"].value == "CreateTime"
    assert {n for n, e in got.items() if e.read_only} == {"message.timestamp.type", "memq.notification.topic",
                                                          "memq.read.partitions"}
    assert [e.name for e in tc.describe(cfg, CLUSTER, ["retention.ms", "segment.byte", "retention.ms"])] == \
        ["retention.ms"]                                       # unknown names left out, as Kafka does


def test_incremental_sets_and_deletes_and_refuses_what_memq_lacks() -> None:
    cur = TopicConfig(name="t", batch_ms=40, storage_group="")
    ops = [("retention.ms", AlterOp.SET, "1000"), ("memq.batch.ms", AlterOp.DELETE, None),
           ("retention.bytes", AlterOp.SET, "5000"), ("memq.expected.mbps", AlterOp.SET, "2.5"),
           ("memq.read.partitions", AlterOp.SET, "3"), ("cleanup.policy", AlterOp.SET, "delete")]
    changes = tc.incremental(cur, ops, CLUSTER)
    assert changes == {"retention_ms": 1000, "batch_ms": 250, "retention_bytes": 5000, "expected_mbps": 2.5,
                       "cleanup_policy": "delete"}
    assert tc.incremental(cur, [("retention.bytes", AlterOp.SET, "-1")], CLUSTER) == {"retention_bytes": None}
    for ops, words in [([("segment.byte", AlterOp.SET, "1")], "segment.byte: memq has no such topic setting "
                                                               r"\(did you mean segment.bytes\?"),
                       ([("retention.msec", AlterOp.SET, "1")], "did you mean retention.ms"),
                       ([("cleanup.policy", AlterOp.SET, "shred")], "want delete, compact or compact,delete"),
                       ([("cleanup.policy", AlterOp.SUBTRACT, "delete")], "cleanup.policy=: want delete"),
                       ([("retention.ms", AlterOp.APPEND, "1")], "APPEND"),
                       ([("retention.ms", AlterOp.SUBTRACT, "1")], "SUBTRACT"),
                       ([("message.timestamp.type", AlterOp.SET, "LogAppendTime")], "message.timestamp.type"),
                       ([("memq.read.partitions", AlterOp.SET, "5")], "CreatePartitions"),
                       ([("retention.ms", AlterOp.SET, "soon")], "retention.ms='soon': not a number")]:
        with pytest.raises(ConfigError, match=words):
            tc.incremental(cur, ops, CLUSTER)


def test_kafka_settings_without_effect_are_kept_and_described_as_such() -> None:
    cur = TopicConfig(name="t", cleanup_policy="compact")
    created = tc.altered(cur, tc.assigned(cur, [("segment.ms", "100"), ("min.insync.replicas", "2"),
                                                ("unclean.leader.election.enable", "TRUE")], CLUSTER))
    assert created.cleanup_policy == "compact"
    assert dict(created.kafka_inert) == {"segment.ms": "100", "min.insync.replicas": "2",
                                         "unclean.leader.election.enable": "true"}
    got = {e.name: e for e in tc.describe(created, CLUSTER)}
    assert got["segment.ms"].value == "100" and got["segment.ms"].source is ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert got["segment.ms"].doc.startswith("no effect on memq") and not got["segment.ms"].read_only
    assert got["segment.bytes"].value == "1073741824" and got["segment.bytes"].is_default   # Kafka's default
    assert [e.name for e in tc.describe(created, CLUSTER, ["flush.ms"])] == ["flush.ms"]
    # stored where every topic setting is (ZooKeeper's JSON): a round trip keeps them
    assert topic_from_json(topic_to_json(created), "t") == created
    # DELETE drops one, SET changes one, APPEND extends a list one; replacement keeps only the listed ones
    ops = [("segment.ms", AlterOp.DELETE, None), ("min.insync.replicas", AlterOp.SET, "3"),
           ("leader.replication.throttled.replicas", AlterOp.APPEND, "0:1")]
    after = tc.altered(created, tc.incremental(created, ops, CLUSTER))
    assert dict(after.kafka_inert) == {"min.insync.replicas": "3", "unclean.leader.election.enable": "true",
                                       "leader.replication.throttled.replicas": "0:1"}
    assert tc.altered(after, tc.replacement(after, [("preallocate", "false")], CLUSTER)).kafka_inert == \
        (("preallocate", "false"),)
    for configs, words in [([("segment.ms", "soon")], "segment.ms='soon': not a number"),
                           ([("preallocate", "maybe")], "want true or false")]:
        with pytest.raises(ConfigError, match=words):
            tc.assigned(cur, configs, CLUSTER)


def test_replacement_returns_unlisted_settings_to_defaults() -> None:
    cur = TopicConfig(name="t", batch_ms=40, retention_ms=5000, expected_mbps=3.0)
    changes = tc.replacement(cur, [("retention.ms", "9000"), ("memq.notification.topic", "memq.c1.t")], CLUSTER)
    cfg = tc.altered(cur, changes)
    assert cfg == TopicConfig(name="t", retention_ms=9000)
    with pytest.raises(ConfigError, match="read-only"):
        tc.replacement(cur, [("memq.notification.topic", "elsewhere")], CLUSTER)
    sparse = TopicConfig(name="t", offsets="sparse", batch_ms=40)     # offsets are set at creation and kept
    assert tc.altered(sparse, tc.replacement(sparse, [], CLUSTER)) == TopicConfig(name="t", offsets="sparse")
    assert tc.incremental(sparse, [("memq.offsets", AlterOp.DELETE, None)], CLUSTER) == {}


def test_new_topics_are_dense_and_a_topic_stored_before_the_setting_stays_sparse() -> None:
    """Dense offsets are memq's default; a topic znode written before the setting existed has no
    `offsets` and reads sparse (its records keep the offsets they were read at); one written
    since states its offsets, whichever they are."""
    assert TopicConfig(name="t").offsets == "dense"
    old = json.loads(topic_to_json(TopicConfig(name="t", batch_ms=40)))
    del old["offsets"]
    assert topic_from_json(json.dumps(old).encode(), "t") == TopicConfig(name="t", batch_ms=40, offsets="sparse")
    for offsets in ("dense", "sparse"):
        cfg = TopicConfig(name="t", offsets=offsets)
        assert json.loads(topic_to_json(cfg))["offsets"] == offsets and topic_from_json(topic_to_json(cfg), "t") == cfg


def test_altered_checks_as_memq_does_and_names_the_kafka_setting() -> None:
    cur = TopicConfig(name="t")
    with pytest.raises(ConfigError, match=r"retention_ms is retention\.ms"):
        tc.altered(cur, tc.assigned(cur, [("retention.ms", "0")], CLUSTER))
    with pytest.raises(ConfigError, match=r"storage_group is memq\.storage\.group"):   # shared objects: no byte limit
        tc.altered(cur, tc.assigned(cur, [("retention.bytes", "1000")], CLUSTER))
    own = tc.altered(cur, tc.assigned(cur, [("retention.bytes", "1000"), ("memq.storage.group", "")], CLUSTER))
    assert own.retention_bytes == 1000 and own.storage_group == ""
    with pytest.raises(ConfigError, match="kafka_compression"):
        tc.altered(cur, tc.assigned(cur, [("memq.kafka.compression", "brotli")], CLUSTER))


def test_broker_view_is_read_only() -> None:
    entries = tc.broker_entries(7, "b1", "rack-a", 1024, CLUSTER)
    assert {e.name: e.value for e in entries}["broker.id"] == "7"
    assert all(e.read_only and e.source is ConfigSource.STATIC_BROKER_CONFIG for e in entries)


class FakeRegistry:
    def __init__(self, cfg: TopicConfig, calls: list[tuple[str, int]]) -> None:
        self.cfg = cfg
        self.calls = calls

    def topic(self, name: str) -> TopicConfig:
        return self.cfg

    def alter_topic(self, cfg: TopicConfig) -> None:
        self.calls.append(("registry", cfg.read_partitions))
        self.cfg = cfg


class FakeKafka:
    def __init__(self, calls: list[tuple[str, int]], refuse: bool = False) -> None:
        self.calls = calls
        self.refuse = refuse

    def create_partitions(self, name: str, total: int) -> None:
        if self.refuse:
            raise InvalidInputError(f"the notification Kafka does not serve CreatePartitions: {name}")
        self.calls.append((name, total))

    def set_retention(self, name: str, retention_ms: int) -> None:
        raise AssertionError("retention unchanged")


def manager(refuse: bool = False) -> tuple[TopicManager, FakeRegistry]:
    registry = FakeRegistry(TopicConfig(name="t", read_partitions=2), [])
    return TopicManager(registry, FakeKafka(registry.calls, refuse), CLUSTER), registry  # type: ignore[arg-type]


def test_read_partitions_grow_notification_topic_first_and_never_shrink() -> None:
    topics, registry = manager()
    assert topics.alter("t", read_partitions=4).read_partitions == 4
    assert registry.calls == [("memq.c1.t", 4), ("registry", 4)]
    with pytest.raises(InvalidInputError, match="cannot shrink"):
        topics.alter("t", read_partitions=3)
    assert registry.cfg.read_partitions == 4
    refused, registry = manager(refuse=True)
    with pytest.raises(InvalidInputError, match="CreatePartitions"):
        refused.alter("t", read_partitions=3)
    assert registry.cfg.read_partitions == 2 and registry.calls == []   # nothing stored


# --- the door's refusals, with an in-memory core (no servers) ------------------------------


@dataclasses.dataclass
class Core:
    guard: Guard
    cluster_admin: None = None          # no ZooKeeper: topics come from the config file
    config: MemqConfig = dataclasses.field(default_factory=lambda: MemqConfig(topics=(TopicConfig(name="t"),)))
    broker_id: str = "b1"

    def metadata(self) -> ClusterMetadata:
        return ClusterMetadata(CLUSTER, "b1", "", StorageMetadata(), topics={})


@dataclasses.dataclass
class Conn:
    core: Core
    principal: str | None
    peer: object = "peer"


def answer(conn: Conn, request: Any, response_cls: Any, version: int) -> Any:
    """The door's response to `request` at `version`, decoded by kafka-python."""
    request.with_header(correlation_id=9, client_id="unit")
    h, body = decode_request_header(request.encode(version=version, header=True))
    family = kafka_admin_configs if h.api_key in kafka_admin_configs.FAMILY.versions else kafka_admin_topics

    async def run() -> bytes:
        response = await family.serve(conn, h, body)  # type: ignore[arg-type]
        assert isinstance(response, asyncio.Future)   # answered in a task, in request order
        return await response
    return response_cls.decode(asyncio.run(run())[4:], version=version, header=True)


def secured(*acls: str) -> Core:
    return Core(Guard(SecurityConfig(enabled=True, tokens=(str(ALICE_ENTRY),), acls=acls), BrokerMetrics("b1").denials))


def test_acls_decide_and_without_zookeeper_changes_are_refused_with_a_reason() -> None:
    ct, dc, inc = kp.CreateTopicsRequest, kp.DescribeConfigsRequest, kp.IncrementalAlterConfigsRequest
    create = ct(topics=[ct.CreatableTopic(name="t", num_partitions=1, replication_factor=-1, assignments=[],
                                          configs=[])], timeout_ms=0, validate_only=False)
    describe = dc(resources=[dc.DescribeConfigsResource(resource_type=2, resource_name="t", configuration_keys=None),
                             dc.DescribeConfigsResource(resource_type=8, resource_name="x", configuration_keys=None)],
                  include_synonyms=False)
    alter = inc(resources=[inc.AlterConfigsResource(resource_type=2, resource_name="t", configs=[
        inc.AlterConfigsResource.AlterableConfig(name="retention.ms", config_operation=0, value="1")])],
        validate_only=False)
    denied = Conn(secured(), "alice")
    assert answer(denied, create, kp.CreateTopicsResponse, 5).topics[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert answer(denied, describe, kp.DescribeConfigsResponse, 1).results[0].error_code == \
        ErrorCode.TOPIC_AUTHORIZATION_FAILED
    reader = Conn(secured("allow alice describe literal:t"), "alice")
    got = answer(reader, describe, kp.DescribeConfigsResponse, 4).results
    assert got[0].error_code == 0 and {c.name for c in got[0].configs} == {s.name for s in (*tc.SETTINGS, *tc.INERT)}
    assert got[1].error_code == ErrorCode.INVALID_REQUEST          # a broker logger: not served
    assert answer(reader, alter, kp.IncrementalAlterConfigsResponse, 1).responses[0].error_code == \
        ErrorCode.TOPIC_AUTHORIZATION_FAILED
    admin = Conn(secured("allow alice admin literal:t"), "alice")
    refused = answer(admin, alter, kp.IncrementalAlterConfigsResponse, 0).responses[0]
    assert refused.error_code == ErrorCode.POLICY_VIOLATION and "no ZooKeeper" in refused.error_message
    created = answer(admin, create, kp.CreateTopicsResponse, 7).topics[0]
    assert created.error_code == ErrorCode.POLICY_VIOLATION and created.num_partitions == -1
