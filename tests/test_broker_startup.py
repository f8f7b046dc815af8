"""A starting broker accepts no connection until its configured topics are open: a client (or a
process manager polling /healthz) that got in earlier was told the topic is unknown."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import aiohttp
import pytest

from memq.broker import Broker
from memq.config import BrokerConfig, MemqConfig, StorageConfig, TopicConfig
from memq.devcluster.process import free_port
from inproc import NullPublisher


class GatedAdmin:
    """Creating a notification topic waits until the test opens the gate (a slow Kafka admin)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.created: list[str] = []

    def create_topic(self, name: str, partitions: int) -> None:
        assert self.gate.wait(10), "test never opened the gate"
        self.created.append(name)


async def test_no_connection_is_accepted_before_configured_topics_are_open(tmp_path: Path) -> None:
    port = free_port()
    config = MemqConfig(storage=StorageConfig(kind="file", root_dir=str(tmp_path)),
                        broker=BrokerConfig(port=port), topics=(TopicConfig("t1"),))
    admin = GatedAdmin()
    broker = Broker(config, publisher=NullPublisher(), admin=admin)   # type: ignore[arg-type]
    starting = asyncio.create_task(broker.start())
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
            await asyncio.sleep(0.3)
            assert not starting.done()
            with pytest.raises(aiohttp.ClientConnectionError):   # refused: not "topic unknown"
                await s.get(f"http://127.0.0.1:{port}/healthz")
            admin.gate.set()
            url = await asyncio.wait_for(starting, 10)
            async with s.get(url + "/v1/metadata") as resp:
                assert "t1" in (await resp.json())["topics"]
        assert admin.created == ["memq.dev.t1"]
    finally:
        admin.gate.set()
        await asyncio.wait_for(starting, 10)
        await broker.stop()
