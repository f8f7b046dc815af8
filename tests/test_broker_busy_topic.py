"""A topic with no free batch slot does not stall the other topics of the same produce
connection: its requests wait aside, in order, while the connection goes on (in-process
broker over a real WebSocket; one topic's PUTs held at a gate)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from memq.broker.server import Broker
from memq.broker.doors.websocket import MAX_PARKED_BYTES
from memq.config import BrokerConfig, MemqConfig, StorageConfig, TopicConfig
from memq.format.wire import Ack, AckLevel, RequestFlag, decode_acks, encode_request
from memq.storage import FileStorageHandler, ObjectLocation
from tests.support.inproc import NullAdmin, NullPublisher
from tests.support.processor import good_message


class SlowTopicStorage(FileStorageHandler):
    """File storage whose PUTs for one topic wait at a gate."""

    def __init__(self, root: Path, slow: str) -> None:
        super().__init__(str(root), cluster="test")
        self.slow = slow
        self.gate = asyncio.Event()

    async def put_batch(self, topic: str, data: Any, **kw: Any) -> ObjectLocation:
        if topic == self.slow:
            await self.gate.wait()
        return await super().put_batch(topic, data, **kw)


async def receive_acks(ws: aiohttp.ClientWebSocketResponse, into: dict[int, Ack]) -> None:
    async for msg in ws:
        if msg.type == aiohttp.WSMsgType.BINARY:
            into.update((a.id, a) for a in decode_acks(msg.data))


@asynccontextmanager
async def slow_topic_broker(tmp_path: Path, **topic: Any) -> AsyncIterator[tuple[Broker, SlowTopicStorage]]:
    """A broker with topics "slow" (PUTs held at the storage's gate) and "fast", two slots each."""
    topics = [TopicConfig(name, batch_ms=20, ring_slots=2, storage_group="", **topic) for name in ("slow", "fast")]
    config = MemqConfig(topics=topics, storage=StorageConfig(kind="file", root_dir=str(tmp_path)),
                        broker=BrokerConfig(port=0, busy_wait_ms=30_000))
    storage = SlowTopicStorage(tmp_path, "slow")
    broker = Broker(config, storage=storage, publisher=NullPublisher(), admin=NullAdmin())
    await broker.start()
    try:
        yield broker, storage
    finally:
        storage.gate.set()
        await broker.stop()


async def until(predicate: Any, timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_a_topic_waiting_for_a_slot_does_not_stall_the_connection_s_other_topics(tmp_path: Path) -> None:
    acks: dict[int, Ack] = {}
    async with slow_topic_broker(tmp_path) as (broker, storage):
        async with aiohttp.ClientSession() as s, s.ws_connect(broker.url + "/v1/produce") as ws:
            reader = asyncio.create_task(receive_acks(ws, acks))
            for rid in (1, 2):   # each fills and seals a batch whose PUT waits: both slots busy
                await ws.send_bytes(encode_request(rid, AckLevel.LEADER, "slow", good_message(rid), RequestFlag.SEAL))
            await until(lambda: {1, 2} <= acks.keys(), 5)
            for rid in (3, 4):   # no slot: these wait, in order
                await ws.send_bytes(encode_request(rid, AckLevel.ALL, "slow", good_message(rid)))
            await ws.send_bytes(encode_request(5, AckLevel.LEADER, "fast", good_message(5)))
            await until(lambda: 5 in acks, 5)       # served while "slow" still has no slot
            assert acks[5].ok and not {3, 4} & acks.keys()
            storage.gate.set()
            await until(lambda: {3, 4} <= acks.keys(), 10)
            reader.cancel()
        assert acks[3].ok and acks[4].ok and acks[3].key == acks[4].key
        assert (acks[3].index, acks[4].index) == (0, 1)    # appended in the order they came


async def test_a_connection_stops_reading_once_its_waiting_requests_fill_their_budget(tmp_path: Path) -> None:
    """Waiting aside is bounded: past MAX_PARKED_BYTES the connection reads nothing more, and
    the fast topic's request behind them waits too (TCP pushes back, as before)."""
    size = 1024 * 1024 - 200
    acks: dict[int, Ack] = {}
    async with slow_topic_broker(tmp_path, max_message_bytes=1 << 20) as (broker, storage):
        async with aiohttp.ClientSession() as s, s.ws_connect(broker.url + "/v1/produce") as ws:
            reader = asyncio.create_task(receive_acks(ws, acks))
            for rid in (1, 2):
                await ws.send_bytes(encode_request(rid, AckLevel.LEADER, "slow", good_message(rid), RequestFlag.SEAL))
            await until(lambda: {1, 2} <= acks.keys(), 5)
            waiting = MAX_PARKED_BYTES // size + 1      # one more than fits aside
            for rid in range(10, 10 + waiting):
                await ws.send_bytes(encode_request(rid, AckLevel.LEADER, "slow", good_message(rid, size=size)))
            await ws.send_bytes(encode_request(5, AckLevel.LEADER, "fast", good_message(5)))
            # the broker moves on: another connection's requests, sent after 5, are read and acked
            async with s.ws_connect(broker.url + "/v1/produce") as other:
                for rid in (6, 7):
                    await other.send_bytes(encode_request(rid, AckLevel.LEADER, "fast", good_message(rid)))
                    async with asyncio.timeout(5):
                        reply = await other.receive()
                    assert [a.id for a in decode_acks(reply.data)] == [rid]
            assert 5 not in acks                        # behind the request that did not fit
            storage.gate.set()
            await until(lambda: 5 in acks and len(acks) == 3 + waiting, 20)
            reader.cancel()
        assert all(a.ok for a in acks.values())
