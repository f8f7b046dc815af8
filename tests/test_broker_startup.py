"""A starting broker accepts no connection until its configured topics are open: a client (or a
process manager polling /healthz) that got in earlier was told the topic is unknown."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import pytest

from memq.broker.server import Broker
from memq.config import BrokerConfig, MemqConfig, StorageConfig, TopicConfig
from memq.devcluster.process import free_port
from memq.errors import NotifyError
from memq.notify import KafkaTopic
from tests.support.inproc import NullPublisher


class GatedAdmin:
    """Creating a notification topic waits until the test opens the gate (a slow Kafka admin)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.created: list[str] = []

    def create_topics(self, topics: Sequence[KafkaTopic]) -> dict[str, str]:
        assert self.gate.wait(10), "test never opened the gate"
        self.created.extend(t.name for t in topics)
        return {}


async def test_no_connection_is_accepted_before_configured_topics_are_open(tmp_path: Path) -> None:
    port = free_port()
    config = MemqConfig(storage=StorageConfig(kind="file", root_dir=str(tmp_path)),
                        broker=BrokerConfig(port=port), topics=(TopicConfig("t1"),))
    admin = GatedAdmin()
    broker = Broker(config, publisher=NullPublisher(), admin=admin)
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


class RecordingAdmin:
    """Records each create_topics request; topics named in `failing` cannot be created."""

    def __init__(self, failing: frozenset[str] = frozenset()) -> None:
        self.requests: list[list[str]] = []
        self.failing = failing

    def create_topics(self, topics: Sequence[KafkaTopic]) -> dict[str, str]:
        self.requests.append([t.name for t in topics])
        return {t.name: f"cannot create Kafka topic {t.name!r}: boom" for t in topics if t.name in self.failing}


async def test_a_governed_broker_answers_starting_until_it_hosts_its_assignment(tmp_path: Path) -> None:
    config = MemqConfig(storage=StorageConfig(kind="file", root_dir=str(tmp_path)), broker=BrokerConfig(port=0))
    admin = RecordingAdmin()
    broker = Broker(config, publisher=NullPublisher(), admin=admin)
    url = await broker.start(ready=False)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
            async with s.get(url + "/healthz") as resp:
                body = await resp.json()
                assert resp.status == 503 and body["status"] == "starting" and "assigned" in body["reason"]
            await broker.add_topics([TopicConfig(f"t{i}") for i in range(300)])
            broker.set_ready()
            async with s.get(url + "/healthz") as resp:
                assert resp.status == 200 and len((await resp.json())["topics"]) == 300
        assert admin.requests == [[f"memq.dev.t{i}" for i in range(300)]]   # one Kafka request for all
    finally:
        await broker.stop()


async def test_a_topic_whose_notification_topic_fails_does_not_keep_the_others_out(tmp_path: Path) -> None:
    config = MemqConfig(storage=StorageConfig(kind="file", root_dir=str(tmp_path)), broker=BrokerConfig(port=0))
    admin = RecordingAdmin(failing=frozenset({"memq.dev.bad"}))
    broker = Broker(config, publisher=NullPublisher(), admin=admin)
    await broker.start()
    try:
        with pytest.raises(NotifyError, match="cannot host 1 topics.*'memq.dev.bad': boom"):
            await broker.add_topics([TopicConfig("a"), TopicConfig("bad"), TopicConfig("c")])
        assert broker.processor("a") and broker.processor("c") and broker.processor("bad") is None
        admin.failing = frozenset()
        await broker.add_topics([TopicConfig("a"), TopicConfig("bad"), TopicConfig("c")])   # the next reconcile
        assert broker.processor("bad") and admin.requests[-1] == ["memq.dev.bad"]
    finally:
        await broker.stop()


def test_a_broker_process_collects_garbage_less_often() -> None:
    # each Message allocates a few tracked objects that live about batch_ms: at Python's default
    # threshold (700) the collector ran every few ms, ~20% of a busy broker's CPU
    import gc

    from memq.broker.__main__ import GC_YOUNG_THRESHOLD, tune_gc
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *before[1:]) and GC_YOUNG_THRESHOLD > before[0]
    finally:
        gc.set_threshold(*before)
