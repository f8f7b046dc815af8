"""GroupWriter: one storage group's shared objects on a broker.

The topics of a storage group are sealed together: when one topic's batch must go (its size,
count, age, latency-budget or flush seal, decided by its `TopicProcessor`), the writer takes
the filling batch of every member topic with it and stores them as one object, each batch a
self-contained part at its own byte range. One PUT then serves every topic of the group, so a
broker's objects (and PUTs, and their CPU) follow its groups, not its topics. The writer then
publishes every part's notification at once (each on its topic's notification topic), and each
topic acks its own Messages (`TopicProcessor.announced`).

A group named "" is a topic's own: one member, objects under the topic's key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from memq.config import TopicConfig
from memq.errors import NotifyError
from memq.format import Notification, encode_batch, object_crc32c
from memq.format.message import Buffer
from memq.format.wire import AckCode
from memq.storage import StorageHandler
from memq.storage.naming import parse_key

from .metrics import BrokerMetrics

if TYPE_CHECKING:
    from .processor import TopicProcessor, _Batch

log = logging.getLogger(__name__)


class Publisher(Protocol):
    """Where a writer publishes an object's notifications (`memq.notify.NotificationPublisher`)."""

    async def publish_many(self, notes: Sequence[tuple[str, Notification]]) -> list[tuple[int, int] | NotifyError]: ...


@dataclass(frozen=True, slots=True)
class Part:
    """Where one topic's batch sits in a stored object, and what it must look like."""

    offset: int
    size: int
    crc32c: int
    header_size: int


def layout(encoded: Sequence[Sequence[Buffer]]) -> list[Part]:
    """The parts of an object made of `encoded` batches (each a list of chunks) back to back."""
    parts: list[Part] = []
    offset = 0
    for chunks in encoded:
        size = sum(len(c) for c in chunks)
        parts.append(Part(offset, size, object_crc32c(chunks), len(chunks[0])))
        offset += size
    return parts


FLUSH_GATHER_S = 0.002
"""How long a flush's seal waits for the same flush's Messages to other topics of the group."""


class GroupWriter:
    """Seals and stores the objects of one storage group (or of one topic, group "")."""

    def __init__(self, group: str, *, storage: StorageHandler, publisher: Publisher, broker_id: str,
                 metrics: BrokerMetrics) -> None:
        self.group = group
        self._storage = storage
        self._publisher = publisher
        self._broker_id = broker_id
        self._members: dict[str, TopicProcessor] = {}
        self._m_objects = metrics.group_objects.labels(group)
        self._soon: asyncio.Handle | None = None

    @property
    def members(self) -> list[str]:
        return list(self._members)

    def join(self, processor: TopicProcessor) -> None:
        self._members[processor.config.name] = processor

    def leave(self, processor: TopicProcessor) -> None:
        if self._members.get(processor.config.name) is processor:
            del self._members[processor.config.name]

    def seal_soon(self) -> None:
        """A producer flushed: seal `FLUSH_GATHER_S` from now, so the flush's other Messages (one
        per topic, sent together) join this object instead of sealing one object each."""
        if not self.group:
            self.seal()          # a topic's own objects: nothing to gather
        elif self._soon is None:
            self._soon = asyncio.get_running_loop().call_later(FLUSH_GATHER_S, self.seal)

    def seal(self) -> None:
        """A member's batch must go: store every member's filling batch now, as one object."""
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        parts = [(p, b) for p in list(self._members.values()) if (b := p.take()) is not None]
        if not parts:
            return
        task = asyncio.get_running_loop().create_task(self._store(parts), name=f"store-{self.group or parts[0][0].config.name}")
        for p, _ in parts:
            p.track(task)

    async def _store(self, parts: list[tuple[TopicProcessor, _Batch]]) -> None:
        try:
            created_ms = int(time.time() * 1000)
            encoded = [encode_batch(b.messages, b.headers, broker_id=self._broker_id, created_ms=created_ms)
                       for _, b in parts]
            first = parts[0][1].headers[0]
            t0 = time.monotonic()
            try:
                loc = await self._storage.put_batch(
                    parts[0][0].config.name, [c for chunks in encoded for c in chunks],
                    first_request_id=first.producer_id ^ first.sequence, timestamp_ms=created_ms,
                    broker_id=self._broker_id, group=self.group)
            except Exception as e:   # a storage failure must fail these batches only, never the broker
                topics = ", ".join(p.config.name for p, _ in parts)
                for p, b in parts:
                    p.failed(b, AckCode.STORAGE, f"storing batch of topic {p.config.name} failed "
                                                 f"(one object with {topics}): {e}")
                return
            put_s = time.monotonic() - t0
            self._m_objects.inc()
            attempt = parse_key(loc.key).attempt
            notes = [p.notification(b, loc, part, created_ms, attempt) for (p, b), part in zip(parts, layout(encoded))]
            t0 = time.monotonic()
            published: list[tuple[int, int] | NotifyError]
            try:
                published = await self._publisher.publish_many(
                    [(p.notification_topic, note) for (p, _), note in zip(parts, notes)])
            except Exception as e:   # a publisher bug must fail these batches only, never the broker
                published = [NotifyError(str(e))] * len(parts)
            notify_s = time.monotonic() - t0
            for (p, b), note, result in zip(parts, notes, published):
                p.announced(b, note, result, put_s, notify_s)
        finally:
            for p, b in parts:
                p.finished(b)


class GroupWriters:
    """A broker's writers, one per storage group, made on first use."""

    def __init__(self, *, storage: StorageHandler, publisher: Publisher, broker_id: str,
                 metrics: BrokerMetrics) -> None:
        self._storage = storage
        self._publisher = publisher
        self._broker_id = broker_id
        self._metrics = metrics
        self._writers: dict[str, GroupWriter] = {}

    def writer(self, topic: TopicConfig) -> GroupWriter:
        """The writer of `topic`'s group; a topic with group "" gets a writer of its own."""
        if not topic.storage_group:
            return GroupWriter("", storage=self._storage, publisher=self._publisher, broker_id=self._broker_id,
                               metrics=self._metrics)
        w = self._writers.get(topic.storage_group)
        if w is None:
            w = self._writers[topic.storage_group] = GroupWriter(
                topic.storage_group, storage=self._storage, publisher=self._publisher, broker_id=self._broker_id,
                metrics=self._metrics)
        return w
