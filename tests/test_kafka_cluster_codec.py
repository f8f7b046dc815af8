"""The cluster calls' answers (`memq.kafka_api.cluster`) and the group relay's old-JoinGroup and
OffsetDelete rewrites (`memq.kafka_api.groups`), without servers: checked against kafka-python's
codec of Kafka's schemas and against hand-laid frames."""

from __future__ import annotations


from kafka.protocol.admin import DescribeClusterResponse, DescribeLogDirsResponse, DescribeProducersResponse
from kafka.protocol.consumer import OffsetForLeaderEpochResponse

from memq.format.metadata import BrokerMetadata, ClusterMetadata, StorageMetadata, TopicMetadata
from memq.kafka_api.cluster import (cluster_operations, controller, describe_cluster, describe_log_dirs,
                                    describe_producers, epoch_end, led_here, log_dir, offset_for_leader_epoch)
from memq.kafka_api.mapping import node_id
from memq.kafka_api.protocol import ErrorCode

META = ClusterMetadata(
    cluster="prod", broker_id="b1", kafka_bootstrap_servers="k:9092", storage=StorageMetadata(bucket="memq-data"),
    brokers=(BrokerMetadata("b1", "http://h1:1", "rack-a", kafka_address="h1:9092"),
             BrokerMetadata("b2", "http://h2:1", "rack-b", kafka_address="h2:9092"),
             BrokerMetadata("b3", "http://h3:1")),   # no Kafka listener
    topics={"orders": TopicMetadata("orders", "memq.orders", 4, ("http://h1:1", "http://h2:1")),
            "solo": TopicMetadata("solo", "memq.solo", 2, ("http://h2:1",))})


def test_describe_cluster_lists_the_listeners_with_the_governor_as_controller() -> None:
    for v in (0, 1, 2):
        got = DescribeClusterResponse.decode(
            bytes(describe_cluster(META, controller(META, "b2", "b1")).encode(version=v)), version=v)
        assert got.error_code == 0 and got.cluster_id == "prod" and got.controller_id == node_id("b2")
        assert {(b.broker_id, b.host, b.port, b.rack) for b in got.brokers} == {
            (node_id("b1"), "h1", 9092, "rack-a"), (node_id("b2"), "h2", 9092, "rack-b")}
        assert got.authorized_operations is None   # not asked: -2147483648 on the wire
    asked = describe_cluster(META, 1, authorized_operations=frozenset({8, 10}))
    wire = DescribeClusterResponse.decode(bytes(asked.encode(version=0)), version=0)
    assert wire.authorized_operations == {8, 10}
    # a governor with no listener (or none known): the broker answering
    assert controller(META, "b3", "b1") == controller(META, None, "b1") == node_id("b1")
    refused = describe_cluster(META, 1, endpoint_type=2)
    assert refused.error_code == ErrorCode.MISMATCHED_ENDPOINT_TYPE and refused.brokers == []


def test_cluster_operations_follow_memq_rights_on_the_cluster() -> None:
    assert cluster_operations(lambda op: False) == frozenset()
    describe = cluster_operations(lambda op: op == "describe")
    assert describe == {8, 10, 12}   # DESCRIBE, DESCRIBE_CONFIGS, IDEMPOTENT_WRITE
    assert cluster_operations(lambda op: True) == describe | {7, 11, 13, 14}


def test_log_dirs_are_the_bucket_and_hold_what_the_broker_leads() -> None:
    assert log_dir(META.storage) == "s3://memq-data"
    assert log_dir(StorageMetadata(kind="local", root_dir="/data")) == "file:///data"
    # orders: partitions 0, 2 led by b1 and 1, 3 by b2 (round robin); solo: both by b2
    assert led_here(META, "b1", None) == [("orders", [0, 2])]
    assert led_here(META, "b2", None) == [("orders", [1, 3]), ("solo", [0, 1])]
    assert led_here(META, "b2", [("orders", [0, 1]), ("nope", [0]), ("solo", [5])]) == [("orders", [1])]
    for v in (0, 1, 2, 3, 4):
        got = DescribeLogDirsResponse.decode(bytes(describe_log_dirs(
            META.storage, led_here(META, "b1", None)).encode(version=v)), version=v)
        [result] = got.results
        assert result.log_dir == "s3://memq-data" and result.error_code == 0
        assert [(t.name, [(p.partition_index, p.partition_size, p.is_future_key) for p in t.partitions])
                for t in result.topics] == [("orders", [(0, 0, False), (2, 0, False)])]
    denied = DescribeLogDirsResponse.decode(bytes(describe_log_dirs(
        META.storage, (), ErrorCode.CLUSTER_AUTHORIZATION_FAILED).encode(version=3)), version=3)
    assert denied.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED and denied.results == []


def test_an_asked_epoch_ends_at_the_high_watermark() -> None:
    assert epoch_end(7, 1 << 30) == (7, 1 << 30)
    assert epoch_end(0, 5) == (0, 5)
    assert epoch_end(-1, 5) == (-1, -1)   # Kafka's undefined epoch
    answer = offset_for_leader_epoch([("orders", [(0, 0, 3, 99), (1, ErrorCode.TOPIC_AUTHORIZATION_FAILED, -1, -1)])])
    for v in (0, 1, 2, 3, 4):
        got = OffsetForLeaderEpochResponse.decode(bytes(answer.encode(version=v)), version=v)
        [t] = got.topics
        assert [(p.partition, p.error_code, p.end_offset) for p in t.partitions] == [(0, 0, 99), (1, 29, -1)]
        if v >= 1:
            assert t.partitions[0].leader_epoch == 3


def test_producers_answer_each_partition_with_none_active() -> None:
    got = DescribeProducersResponse.decode(bytes(describe_producers(
        [("orders", [(0, 0), (9, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)])]).encode(version=0)), version=0)
    [t] = got.topics
    assert [(p.partition_index, p.error_code, p.active_producers) for p in t.partitions] == [(0, 0, []), (9, 3, [])]


