"""Read-side credentials: `[kafka] properties` (librdkafka's SASL/SSL settings) reach every Kafka
client memq creates, and `[s3]` profile / session token reach every S3 client, against the dev
cluster's real tansu and moto."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from memq.config import KafkaConfig, S3Config, load_config
from memq.devcluster import DevCluster
from memq.errors import ConfigError, KafkaUnreachableError
from memq.notify import NotificationConsumer, TopicAdmin
from memq.notify._kafka import base_settings
from memq.storage import make_storage
from spark_source.options import _require_credentials


def test_kafka_properties_are_checked_and_given_to_clients() -> None:
    kafka = KafkaConfig(properties=("security.protocol=SASL_SSL", "sasl.mechanism = PLAIN", "sasl.password=a=b"))
    settings = base_settings(kafka)
    assert settings["security.protocol"] == "SASL_SSL" and settings["sasl.mechanism"] == "PLAIN"
    assert settings["sasl.password"] == "a=b" and "a=b" not in repr(kafka)
    with pytest.raises(ConfigError, match=r"kafka.properties\[0\]: set bootstrap.servers with kafka.bootstrap_servers"):
        KafkaConfig(properties=("bootstrap.servers=elsewhere:9092",))
    with pytest.raises(ConfigError, match=r"kafka.properties\[1\]: 'oops'... is not 'key=value'"):
        load_config(env={"MEMQ_KAFKA_PROPERTIES": "client.id=x,oops"})


@pytest.mark.integration
def test_kafka_security_properties_reach_the_real_clients(devcluster: DevCluster) -> None:
    """TLS asked of librdkafka against the plaintext dev Kafka: the admin client and the
    notification consumer both fail to reach it; a harmless property changes nothing."""
    kafka = devcluster.config().kafka
    assert TopicAdmin(dataclasses.replace(kafka, properties=("client.id=memq-props-test",))).list_topics() is not None
    tls = dataclasses.replace(kafka, properties=("security.protocol=SSL",), request_timeout_ms=3_000)
    with pytest.raises(KafkaUnreachableError):
        TopicAdmin(tls).list_topics()
    with pytest.raises(KafkaUnreachableError):
        NotificationConsumer(tls, "memq.dev.any", group_id="memq-props-test")


@pytest.fixture
def aws_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A named profile in an AWS credentials file, and no other AWS credentials anywhere."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    credentials = tmp_path / "credentials"
    credentials.write_text("[memq-reader]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    return "memq-reader"


@pytest.mark.integration
async def test_s3_profile_and_session_token_reach_the_storage_client(
        devcluster: DevCluster, aws_profile: str, unique_name: Callable[[str], str]) -> None:
    base = devcluster.config()
    topic = unique_name("profile")
    for s3 in (dataclasses.replace(base.s3, access_key_id=None, secret_access_key=None, profile=aws_profile),
               dataclasses.replace(base.s3, session_token="sts-session-token")):
        storage = make_storage(dataclasses.replace(base, s3=s3))
        try:
            loc = await storage.put_batch(topic, b"x" * 10, first_request_id=1, timestamp_ms=int(time.time() * 1000),
                                          broker_id="t")
            assert await storage.get(loc) == b"x" * 10
        finally:
            await storage.close()
    with pytest.raises(ConfigError, match="s3.profile = 'nope': no such profile"):
        make_storage(dataclasses.replace(base, s3=dataclasses.replace(base.s3, profile="nope")))


def test_spark_source_accepts_a_profile_as_credentials(aws_profile: str) -> None:
    _require_credentials(S3Config(profile=aws_profile))
    with pytest.raises(ConfigError, match="no S3 credentials"):
        _require_credentials(S3Config())
