"""A TopicProcessor under test: storage whose PUTs can be held or failed, a publisher in
memory, Messages to append, and the harness that ties them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from tests.support.appending import append
from memq.broker.metrics import BrokerMetrics
from memq.broker.processor import TopicProcessor
from memq.config import TopicConfig
from memq.errors import NotifyError, StorageError
from memq.format import Codec, LogMessage, Notification, encode_message
from memq.format.wire import Ack, AckLevel
from memq.storage import FileStorageHandler, ObjectLocation
from tests.support.inproc import OneByOne


class GatedStorage:
    """The file handler, with PUTs that can be held at a gate or made to fail."""

    def __init__(self, root: Path) -> None:
        self.inner = FileStorageHandler(str(root), cluster="test")
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail = False
        self.puts: list[ObjectLocation] = []
        self.deleted: list[ObjectLocation] = []
        self.active = 0
        self.max_active = 0
        self.throttled_share = 0.0    # what `pressure` reports

    async def put_batch(self, topic: str, data: Any, **kw: Any) -> ObjectLocation:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await self.gate.wait()
            if self.fail:
                raise StorageError("injected: bucket unavailable")
            loc = await self.inner.put_batch(topic, data, **kw)
            self.puts.append(loc)
            return loc
        finally:
            self.active -= 1

    async def get(self, loc: ObjectLocation) -> bytes:
        return await self.inner.get(loc)

    async def delete(self, loc: ObjectLocation) -> None:
        self.deleted.append(loc)
        await self.inner.delete(loc)

    def pressure(self) -> float:
        return self.throttled_share


class MemoryPublisher(OneByOne):
    def __init__(self) -> None:
        self.sent: list[tuple[str, Notification]] = []
        self.fail = False

    async def publish(self, kafka_topic: str, n: Notification) -> tuple[int, int]:
        if self.fail:
            raise NotifyError("injected: kafka down")
        self.sent.append((kafka_topic, n))
        return 0, len(self.sent) - 1


def message(seq: int, n: int = 3, size: int = 100) -> bytes:
    recs = [LogMessage(bytes([seq % 256]) * size, key=b"k%d" % i, timestamp_ms=1000 + seq) for i in range(n)]
    return encode_message(recs, producer_id=42, epoch=1, sequence=seq, codec=Codec.NONE)


class Harness:
    def __init__(self, tmp_path: Path, busy_wait_s: float = 0.2, **topic: Any) -> None:
        self.storage = GatedStorage(tmp_path)
        self.publisher = MemoryPublisher()
        self.acks: list[Ack] = []
        self.metrics = BrokerMetrics("b1")
        cfg = TopicConfig(name="t1", **{"batch_ms": 10_000, "batch_bytes": 1 << 20, "max_message_bytes": 1 << 20, **topic})
        self.proc = TopicProcessor(cfg, cluster="test", broker_id="b1", storage=self.storage,  # type: ignore[arg-type]
                                   publisher=self.publisher, metrics=self.metrics, busy_wait_s=busy_wait_s)

    async def append(self, seq: int, ack: AckLevel = AckLevel.ALL, *, seal: bool = False, **kw: Any) -> Ack | None:
        data = message(seq, **kw)
        return await append(self.proc, data, seq, ack, self.acks.append, seal=seal)

    async def wait_acks(self, n: int, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.acks) < n:
                await asyncio.sleep(0.005)


def good_message(seq: int, size: int = 10) -> bytes:
    return encode_message([LogMessage(b"v" * size)], producer_id=7, epoch=0, sequence=seq, codec=Codec.NONE)
