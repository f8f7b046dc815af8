"""Producer failover between real broker processes: after one broker hosting a topic is
SIGKILLed, retries go to the survivor at once and later sends never try the dead one again."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from memq.client.producer import Delivery, Producer
from memq.config import MemqConfig, ProducerConfig
from memq.devcluster import DevCluster
from memq.devcluster.broker_process import BrokerProcess
from memq.storage.naming import parse_key
from tests.support.cluster import topic_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def as_broker(config: MemqConfig, broker_id: str) -> MemqConfig:
    return dataclasses.replace(config, broker=dataclasses.replace(config.broker, broker_id=broker_id, port=0))


async def test_sigkilled_broker_is_skipped_and_sends_with_default_retries_succeed(
        devcluster: DevCluster, unique_name: Callable[[str], str], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    topic = unique_name("failover")
    config = devcluster.config(topics=[topic_config(topic, batch_ms=20)])
    doomed = BrokerProcess(as_broker(config, "f1"), tmp_path).start()
    survivor = BrokerProcess(as_broker(config, "f2"), tmp_path).start()
    caplog.set_level(logging.INFO, logger="memq.client.producer")
    try:
        # default retries (5) and backoff; both brokers host the topic (static config)
        async with Producer(ProducerConfig(brokers=f"{doomed.url},{survivor.url}")) as p:
            futures: list[asyncio.Future[list[Delivery]]] = []
            for i in range(120):                      # ~100 Messages/s spread over both brokers
                futures.append(await p.send_many(topic, [b"v-%d-%d" % (i, j) for j in range(20)]))
                await asyncio.sleep(0.01)
                if i == 40:
                    doomed.kill()
            under_load = [d for f in futures for d in await f]   # raises if any send failed
            assert sum(d.count for d in under_load) == 120 * 20

            caplog.clear()
            started = time.monotonic()
            after: list[Delivery] = []
            for i in range(30):                       # one at a time: each picks a broker afresh
                after.extend(await (await p.send_many(topic, [b"after-%d" % i])))
            elapsed = time.monotonic() - started
    finally:
        doomed.kill()
        survivor.stop()
    retries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("retrying")]
    assert retries == [], f"sends after the kill still tried the dead broker: {retries[:3]}"
    assert {parse_key(d.key).broker_id for d in after} == {"f2"}
    assert elapsed < 15, f"30 sequential sends took {elapsed:.1f}s"
