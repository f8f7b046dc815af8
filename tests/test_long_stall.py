"""Stalls longer than memq's timeouts, on the real path (moto S3, tansu, in-process brokers).

A Kafka frozen past the brokers' delivery-report timeout while a producer streams to two
brokers: every acked record is delivered once by the default Consumer.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from memq.config import KafkaConfig
from memq.devcluster import DevCluster
from test_broker_integration import running_broker, topic_config
from test_dedup_cluster import check_no_duplicates_delivered, stream

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

KAFKA_TIMEOUT_MS = 2_000    # the brokers' delivery-report timeout (librdkafka message.timeout.ms)


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[DevCluster]:
    """A tansu of this test's own, so freezing it cannot disturb other tests."""
    with DevCluster(tmp_path / "kafka", s3=False, zookeeper=False) as dc:
        yield dc


async def test_a_kafka_frozen_past_the_notify_timeout_delivers_no_duplicates(
        devcluster: DevCluster, own_kafka: DevCluster, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("freeze")
    base = devcluster.config(topics=[topic_config(topic, batch_ms=50)])
    config = dataclasses.replace(base, kafka=KafkaConfig(bootstrap_servers=own_kafka.kafka_bootstrap or "",
                                                         request_timeout_ms=KAFKA_TIMEOUT_MS))
    other = dataclasses.replace(config, broker=dataclasses.replace(config.broker, broker_id="b2"))
    tansu = own_kafka.pids["kafka"]
    async with running_broker(config) as a, running_broker(other) as b:
        acked = await stream(config, f"{a.url},{b.url}", topic, lambda: os.kill(tansu, signal.SIGSTOP),
                             lambda: os.kill(tansu, signal.SIGCONT), run_s=20, fault_at_s=3, fault_s=10)
    await check_no_duplicates_delivered(dataclasses.replace(config, kafka=dataclasses.replace(
        config.kafka, request_timeout_ms=10_000)), topic, acked)
