"""Describe on real brokers with security on (issue 31): `produce` implies `describe`, so a
produce-only principal writes at once; a principal that may not see a topic is refused at once
by every client (Producer, Consumer, Spark source, CLI, Kafka Metadata) with an
AuthorizationError naming principal, operation and topic, the same whether the topic exists."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer as KafkaProducer

from memq.client._auth import BrokerAuth
from memq.client.cluster import fetch_metadata
from memq.client.consumer import Consumer
from memq.client.producer import Producer
from memq.config import AuditConfig, BrokerConfig, MemqConfig, ProducerConfig, SecurityConfig
from memq.devcluster import DevCluster
from memq.devcluster.broker_process import config_toml
from memq.errors import AuthorizationError
from memq.format.metadata import TopicRefusal
from memq.security.tokens import new_token
from spark_source.options import parse_options
from tests.support.cluster import read_stored, running_broker, topic_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[1]
ALICE, ALICE_ENTRY = new_token("alice")
AT_ONCE_S = 10.0   # "at once": well below producer.max_block_ms (60 s), whatever the machine's load


def refused(topic: str) -> str:
    return f"principal alice may not describe topic {topic}"


Names = tuple[str, str, str, str]


@pytest.fixture
def names(unique_name: Callable[[str], str]) -> Names:
    """(alice may produce, exists but alice has no rule, does not exist, alice may produce but
    it does not exist yet)."""
    return unique_name("sec-a"), unique_name("sec-b"), unique_name("ghost"), unique_name("later")


def secured(devcluster: DevCluster, names: Names) -> MemqConfig:
    sec_a, sec_b, _, later = names
    return dataclasses.replace(
        devcluster.config(topics=[topic_config(sec_a, read_partitions=1), topic_config(sec_b, read_partitions=1)]),
        broker=BrokerConfig(kafka_port=0), audit=AuditConfig(enabled=False),
        security=SecurityConfig(enabled=True, tokens=(str(ALICE_ENTRY),),
                                acls=(f"allow alice produce literal:{sec_a}", f"allow alice produce literal:{later}")))


def as_alice(config: MemqConfig, url: str) -> MemqConfig:
    """The client side: alice's token, default max_block_ms (the 60 s the issue waited)."""
    return dataclasses.replace(config, producer=ProducerConfig(brokers=url, token=ALICE, linger_ms=1,
                                                               request_timeout_ms=5_000, delivery_timeout_ms=20_000))


async def test_produce_implies_describe_and_a_refusal_is_at_once_existing_or_not(
        devcluster: DevCluster, names: Names) -> None:
    sec_a, sec_b, ghost, _ = names
    config = secured(devcluster, names)
    async with running_broker(config) as broker:
        client = as_alice(config, broker.url)
        start = time.monotonic()
        async with Producer(client.producer) as p:
            assert (await (await p.send(sec_a, b"produce-only"))).key      # no describe rule needed
        assert time.monotonic() - start < AT_ONCE_S

        for topic in (sec_b, ghost):
            start = time.monotonic()
            async with Producer(client.producer) as p:
                with pytest.raises(AuthorizationError, match=refused(topic)):
                    await p.send(topic, b"denied")
            assert time.monotonic() - start < AT_ONCE_S, topic
            with pytest.raises(AuthorizationError, match=refused(topic)):
                await asyncio.to_thread(Consumer, client, topic)

        # the answer itself: the same refusal whether the topic exists, neither listed
        md = await asyncio.to_thread(fetch_metadata, broker.url, 5, BrokerAuth(ALICE), (sec_a, sec_b, ghost))
        assert set(md.topics) == {sec_a}
        assert md.refused == {sec_b: TopicRefusal("alice", "describe"), ghost: TopicRefusal("alice", "describe")}

        # Kafka's Metadata says the same: TOPIC_AUTHORIZATION_FAILED for both, not UNKNOWN for the ghost
        def kafka_errors() -> dict[str, str]:
            p = KafkaProducer({"bootstrap.servers": broker.kafka_address, "security.protocol": "SASL_PLAINTEXT",
                               "sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": ALICE})
            return {t: p.list_topics(t, timeout=10).topics[t].error.name() for t in (sec_b, ghost)}
        assert await asyncio.to_thread(kafka_errors) == {sec_b: "TOPIC_AUTHORIZATION_FAILED",
                                                         ghost: "TOPIC_AUTHORIZATION_FAILED"}
    stored, _, _ = await read_stored(config, sec_a)
    assert sorted(v for _, v, _ in stored.values()) == [b"produce-only"]
    assert (await read_stored(config, sec_b))[0] == {}


async def test_cli_and_spark_options_fail_at_once_naming_the_refusal(
        devcluster: DevCluster, names: Names, tmp_path: Path) -> None:
    sec_a, sec_b, ghost, later = names
    config = secured(devcluster, names)
    async with running_broker(config) as broker:
        path = tmp_path / "alice.toml"
        path.write_text(config_toml(as_alice(config, broker.url)))

        def memq(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
            """The `memq` command as a user runs it, in its own process (this checkout's code)."""
            env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
            env |= {"PYTHONPATH": str(ROOT), "MEMQ_PRODUCER_TOKEN": ALICE}
            return subprocess.run([sys.executable, "-c", "from memq.cli import main; main()", "--config", str(path),
                                   *args], input=stdin, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)

        start = time.monotonic()
        ok = await asyncio.to_thread(memq, "produce", sec_a, stdin="x\n")     # echo x | memq produce sec-a
        assert ok.returncode == 0, ok.stderr
        assert time.monotonic() - start < AT_ONCE_S
        for topic in (sec_b, ghost):
            for args in (("produce", topic), ("consume", topic, "--idle-timeout", "1")):
                start = time.monotonic()
                result = await asyncio.to_thread(memq, *args, stdin="x\n")
                assert result.returncode == 1 and f"AuthorizationError: {refused(topic)}" in result.stderr, \
                    (args, result.stderr)
                assert "unknown" not in result.stderr and "not hosted" not in result.stderr
                assert time.monotonic() - start < AT_ONCE_S, args
            # the Spark source's driver: the same error before any task starts
            with pytest.raises(AuthorizationError, match=refused(topic)):
                await asyncio.to_thread(parse_options, _spark_options(topic, broker.url, path))
        # a topic alice may use that no broker hosts (yet) is waited for, saying so, for --max-block
        start = time.monotonic()
        waited = await asyncio.to_thread(memq, "produce", later, "--max-block", "2", stdin="x\n")
        assert waited.returncode == 1 and "UnknownTopicError" in waited.stderr, waited.stderr
        assert f"waiting for a broker to host topic {later} (up to 2 s, --max-block)" in waited.stderr
        assert 2.0 <= time.monotonic() - start < AT_ONCE_S
    stored, _, _ = await read_stored(config, sec_a)
    assert sorted(v for _, v, _ in stored.values()) == [b"x"]


@pytest.mark.spark
async def test_a_spark_read_of_a_refused_topic_fails_with_the_refusal(
        devcluster: DevCluster, names: Names, tmp_path: Path, spark: Any) -> None:
    _, sec_b, _, _ = names
    config = secured(devcluster, names)
    async with running_broker(config) as broker:
        path = tmp_path / "alice.toml"
        path.write_text(config_toml(as_alice(config, broker.url)))

        def read() -> Any:
            return spark.read.format("memq").options(**_spark_options(sec_b, broker.url, path)).load().count()
        with pytest.raises(Exception, match=f"AuthorizationError: {refused(sec_b)}"):
            await asyncio.to_thread(read)


def _spark_options(topic: str, url: str, config_path: Path) -> dict[str, str]:
    return {"topic": topic, "memq.broker": url, "memq.config": str(config_path)}
