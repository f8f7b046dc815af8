"""The Producer without a server: a fake `Router` and a fake broker `Connection` (and its
`Connector`) that answers each frame as the test scripts it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from memq.client.producer import Producer
from memq.config import ProducerConfig
from memq.errors import UnknownTopicError
from memq.format.wire import Ack, AckCode, decode_request


class FakeRouter:
    """A `Router` over a fixed map of topic -> broker URLs; records the brokers that failed."""

    def __init__(self, topics: dict[str, list[str]], frame_limit: int = 0,
                 partitions: dict[str, int] | None = None, compacted: frozenset[str] = frozenset()) -> None:
        """`partitions`: topics' read partitions (keyed records placed over them; 1 if not named),
        `compacted`: topics whose records need keys."""
        self.topics = topics
        self.placed = partitions or {}
        self.compacted = compacted
        self.failed: list[str] = []
        self.limit = frame_limit

    async def brokers_for(self, topic: str) -> list[str]:
        if topic not in self.topics:
            raise UnknownTopicError(topic)
        return self.topics[topic]

    async def next_broker(self, topic: str) -> str:
        return (await self.brokers_for(topic))[0]

    def broker_failed(self, url: str) -> None:
        self.failed.append(url)

    def broker_ok(self, url: str) -> None:
        pass

    def can_fail_over(self, topic: str) -> bool:
        return True

    def redirect(self, topic: str, brokers: tuple[str, ...]) -> None:
        pass

    def forget(self, topic: str) -> None:
        pass

    def frame_limit(self, url: str) -> int:
        return self.limit

    def partitions(self, topic: str) -> int:
        return self.placed.get(topic, 1)

    def keys_required(self, topic: str) -> bool:
        return topic in self.compacted


class FakeBroker:
    """Answers each frame with `answers` in turn (the last one repeats); None: never answers."""

    def __init__(self, answers: Sequence[AckCode | None]) -> None:
        self.answers = answers
        self.frames: list[bytes] = []
        self.url = "http://fake"
        self.closed = False
        self.too_large = False
        self.on_ack: Callable[[Ack], None] = lambda ack: None

    async def connect(self, url: str, on_ack: Callable[[Ack], None], on_lost: object) -> FakeBroker:
        self.on_ack = on_ack
        return self

    async def send(self, frame: bytes | bytearray) -> None:
        self.frames.append(bytes(frame))
        request_id = decode_request(self.frames[-1]).request_id
        code = self.answers[min(len(self.frames), len(self.answers)) - 1]
        if code is None:
            return
        ack = Ack(request_id, True) if code == AckCode.OK else Ack(request_id, False, code, "no")
        asyncio.get_running_loop().call_soon(self.on_ack, ack)

    async def close(self) -> None:
        self.closed = True


def producer(broker: FakeBroker, frame_limit: int = 0, partitions: dict[str, int] | None = None,
             compacted: frozenset[str] = frozenset(), **config: Any) -> Producer:
    """A Producer of topic "t" on `broker` alone, with short linger and backoff; `partitions`,
    `compacted`: topics' read partitions and which are compacted (FakeRouter); `config`: other settings."""
    pc = ProducerConfig(brokers="http://fake", linger_ms=1, retry_backoff_ms=1, **config)
    return Producer(pc, router=FakeRouter({"t": [broker.url]}, frame_limit, partitions, compacted),
                    connector=broker.connect)
