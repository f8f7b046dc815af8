"""The typed cluster metadata and the one resolver every client reads it through (no servers)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from memq.client.cluster import broker_urls, metadata_url, refusal, resolve, resolve_topic
from memq.config import KafkaConfig, MemqConfig, ProducerConfig, S3Config, TopicConfig
from memq.errors import AuthorizationError, BrokerUnavailableError, CorruptDataError, UnsupportedVersionError
from memq.format.metadata import (METADATA_VERSION, BrokerMetadata, ClusterMetadata, ClusterView,
                                  StorageMetadata, TopicMetadata, TopicRefusal)

MD = ClusterMetadata(
    cluster="prod", broker_id="b1", kafka_bootstrap_servers="k1:9092,k2:9092",
    storage=StorageMetadata(kind="s3", bucket="batches", endpoint_url="http://s3:9000", region="eu-west-1"),
    brokers=(BrokerMetadata("b1", "http://b1:8080", "ra"), BrokerMetadata("b2", "http://b2:8080", "rb")),
    topics={"events": TopicMetadata("events", "custom.events", 6, ("http://b1:8080",), 86_400_000)})


def test_round_trip_through_json() -> None:
    doc = json.loads(json.dumps(MD.to_dict()))
    assert doc["v"] == METADATA_VERSION
    assert ClusterMetadata.from_dict(doc) == MD


def test_unknown_fields_are_ignored_and_missing_v_is_version_1() -> None:
    doc = MD.to_dict()
    doc["quotas"] = {"events": 5}
    doc["topics"]["events"]["compaction"] = "none"
    doc["brokers"][0]["zone"] = "z"
    doc["storage"]["tier"] = "standard"
    del doc["v"]
    assert ClusterMetadata.from_dict(doc) == MD


def test_refusals_round_trip_and_an_older_brokers_document_has_none() -> None:
    refused = dataclasses.replace(MD, refused={"secret": TopicRefusal("alice", "describe")})
    doc = json.loads(json.dumps(refused.to_dict()))
    assert doc["refused"] == {"secret": {"principal": "alice", "operation": "describe"}}
    assert ClusterMetadata.from_dict(doc) == refused
    del doc["refused"]
    assert ClusterMetadata.from_dict(doc).refused == {}


def test_a_refusal_is_an_authorization_error_naming_principal_operation_and_topic() -> None:
    refused = dataclasses.replace(MD, refused={"secret": TopicRefusal("alice", "describe")})
    error = refusal(refused, "secret")
    assert isinstance(error, AuthorizationError)
    assert "principal alice may not describe topic secret" in str(error)
    assert "memq acl add allow alice produce literal:secret" in str(error)
    assert refusal(refused, "events") is None and refusal(MD, "secret") is None


def test_metadata_urls_name_the_topics_asked_about() -> None:
    assert metadata_url("http://b1:8080/") == "http://b1:8080/v1/metadata"
    assert metadata_url("http://b1:8080", ("a b", "c&d")) == "http://b1:8080/v1/metadata?topic=a+b&topic=c%26d"


def test_an_overlay_replaces_brokers_and_topics_only() -> None:
    view = ClusterView(brokers=(BrokerMetadata("b9", "http://b9"),),
                       topics={"x": TopicMetadata("x", "memq.prod.x", 1, ())})
    merged = MD.overlaid(view)
    assert merged.brokers == view.brokers and dict(merged.topics) == dict(view.topics)
    assert (merged.cluster, merged.broker_id, merged.storage) == (MD.cluster, MD.broker_id, MD.storage)
    assert MD.overlaid(None) is MD


@pytest.mark.parametrize("mutate, error, named", [
    (lambda d: d.update(v=METADATA_VERSION + 1), UnsupportedVersionError, "version"),
    (lambda d: d.update(v="1"), CorruptDataError, "'v'"),
    (lambda d: d.pop("cluster"), CorruptDataError, "cluster"),
    (lambda d: d["topics"]["events"].update(read_partitions=0), CorruptDataError, "read_partitions"),
    (lambda d: d["topics"]["events"].update(brokers=[1]), CorruptDataError, "brokers"),
    (lambda d: d.update(brokers={}), CorruptDataError, "brokers"),
    (lambda d: d["kafka"].update(bootstrap_servers=None), CorruptDataError, "bootstrap_servers"),
    (lambda d: d.update(refused=["t"]), CorruptDataError, "refused"),
    (lambda d: d.update(refused={"t": {"principal": "a"}}), CorruptDataError, "operation"),
])
def test_bad_documents_raise_naming_the_field(mutate, error, named: str) -> None:
    doc = MD.to_dict()
    mutate(doc)
    with pytest.raises(error, match=named):
        ClusterMetadata.from_dict(doc)


def test_not_an_object_is_corrupt() -> None:
    with pytest.raises(CorruptDataError):
        ClusterMetadata.from_dict([1, 2])


def test_metadata_wins_over_the_config_file_which_keeps_credentials() -> None:
    config = MemqConfig(kafka=KafkaConfig(bootstrap_servers="old:1", request_timeout_ms=1234),
                        s3=S3Config(bucket="old", access_key_id="AK", secret_access_key="SK"),
                        topics=(TopicConfig("events", notification_topic="stale.events"),))
    r = resolve(config, "events", MD)
    assert r.source == "metadata" and r.topic.notification_topic == "custom.events"
    assert r.topic.read_partitions == 6 and r.topic.brokers == ("http://b1:8080",)
    assert r.config.cluster.name == "prod" and r.config.kafka.bootstrap_servers == "k1:9092,k2:9092"
    assert r.config.kafka.request_timeout_ms == 1234
    assert (r.config.s3.bucket, r.config.s3.endpoint_url, r.config.s3.region) == ("batches", "http://s3:9000",
                                                                                  "eu-west-1")
    assert (r.config.s3.access_key_id, r.config.s3.secret_access_key) == ("AK", "SK")


def test_a_topic_the_brokers_do_not_know_falls_back_to_the_config_file() -> None:
    configured = MemqConfig(topics=(TopicConfig("other", notification_topic="mine.other"),))
    r = resolve(configured, "other", MD)
    assert (r.source, r.topic.notification_topic) == ("config", "mine.other")
    assert r.config.kafka.bootstrap_servers == "k1:9092,k2:9092"       # the cluster still comes from metadata
    r = resolve(MemqConfig(), "unlisted", MD)
    assert (r.source, r.topic.notification_topic) == ("default", "memq.prod.unlisted")


def test_without_brokers_the_config_file_decides() -> None:
    config = MemqConfig(topics=(TopicConfig("events", read_partitions=2),))
    r = resolve_topic(config, "events")
    assert r.config is config and r.topic == TopicMetadata("events", "memq.dev.events", 2, retention_ms=7 * 86_400_000,
                                                                    storage_group="shared", offsets="dense")
    # a topic neither a broker nor the config file describes: its offsets are unstated, read as positions
    assert resolve_topic(config, "unlisted").topic.offsets == "sparse"


def test_a_topics_offsets_are_written_when_dense_and_read_sparse_when_unstated() -> None:
    """Sparse is left out of the document, as brokers from before dense offsets left the field
    out: a topic without it reads sparse whatever a new topic's default; dense is written."""
    dense = dataclasses.replace(MD, topics={"events": dataclasses.replace(MD.topics["events"], offsets="dense")})
    assert dense.to_dict()["topics"]["events"]["offsets"] == "dense" and ClusterMetadata.from_dict(dense.to_dict()) == dense
    assert "offsets" not in MD.to_dict()["topics"]["events"]
    assert ClusterMetadata.from_dict(MD.to_dict()).topics["events"].offsets == "sparse"


def test_unreachable_brokers_fail_only_when_named_explicitly() -> None:
    config = MemqConfig(producer=ProducerConfig(brokers="http://127.0.0.1:1"))
    assert resolve_topic(config, "t", timeout_s=2).source == "default"
    with pytest.raises(BrokerUnavailableError, match="127.0.0.1:1"):
        resolve_topic(MemqConfig(), "t", brokers="http://127.0.0.1:1", timeout_s=2)


def test_broker_urls_are_normalised() -> None:
    assert broker_urls(" http://a:1/, ,http://b:2") == ["http://a:1", "http://b:2"]
