"""Server-side fault regressions found by the outside fault test, each on the real path
(moto S3, tansu, ZooKeeper, in-process brokers): a broker must ride out a Kafka stall,
never leave a notification pointing at a deleted object, drop resent Messages it already
holds, and keep retrying S3 while its acks can still be on time."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from memq.client.producer import Producer
from memq.config import KafkaConfig, MemqConfig
from memq.devcluster import DevCluster
from memq.errors import MemqError
from test_broker_integration import producer_config, running_broker, topic_config

pytestmark = pytest.mark.integration

KAFKA_TIMEOUT_MS = 3_000


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[DevCluster]:
    """A tansu of this test's own, so stopping it cannot disturb other tests."""
    with DevCluster(tmp_path / "kafka", s3=False, zookeeper=False) as dc:
        yield dc


async def health(url: str) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
        async with s.get(url + "/healthz") as r:
            return r.status, await r.json()


async def acked_within(url: str, topic: str, timeout_s: float) -> float:
    """Seconds until an ack=all write succeeds, retrying fresh writes; fails after `timeout_s`."""
    t0 = time.monotonic()
    errors: list[str] = []
    async with Producer(producer_config(url, request_timeout_ms=5_000, retries=0)) as p:
        while time.monotonic() - t0 < timeout_s:
            try:
                await (await p.send(topic, b"after-%d" % len(errors)))
                return time.monotonic() - t0
            except MemqError as e:
                errors.append(str(e))
                await asyncio.sleep(0.2)
    raise AssertionError(f"no ack=all write succeeded within {timeout_s}s; last errors {errors[-3:]}")


async def test_broker_recovers_by_itself_after_a_kafka_stall_longer_than_its_request_timeout(
        devcluster: DevCluster, own_kafka: DevCluster, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("kstall")
    base = devcluster.config(topics=[topic_config(topic, batch_ms=20)])
    config: MemqConfig = dataclasses.replace(base, kafka=KafkaConfig(
        bootstrap_servers=own_kafka.kafka_bootstrap or "", request_timeout_ms=KAFKA_TIMEOUT_MS))
    tansu = own_kafka.pids["kafka"]
    async with running_broker(config) as broker:
        await acked_within(broker.url, topic, 10)
        assert (await health(broker.url))[0] == 200
        async with Producer(producer_config(broker.url, request_timeout_ms=4_000, retries=0)) as p:
            os.kill(tansu, signal.SIGSTOP)
            try:
                # publishes in flight during the stall time out: librdkafka bumps its epoch
                stalled = [await p.send(topic, b"stalled-%d" % i) for i in range(5)]
                await asyncio.sleep(2 * KAFKA_TIMEOUT_MS / 1000)
                status, body = await health(broker.url)
                assert status == 503 and body["status"] == "unhealthy", body
                assert "Kafka" in str(body["reason"]), body
            finally:
                os.kill(tansu, signal.SIGCONT)
            await asyncio.gather(*stalled, return_exceptions=True)
        # fenced by the bump, the old producer fails every publish for good; the broker
        # replaces it by itself, without a restart
        await acked_within(broker.url, topic, 30)
        status, body = await health(broker.url)
        assert status == 200, body
