"""GroupWriter: one storage group's shared objects on a broker.

The topics of a storage group are sealed together: when one topic's batch must go (its size,
count, age, latency-budget or flush seal, decided by its `TopicProcessor`), the writer takes
the filling batch of every member topic with it and stores them as one object, each batch a
self-contained part at its own byte range. One PUT then serves every topic of the group, so a
broker's objects (and PUTs, and their CPU) follow its groups, not its topics. The writer then
publishes every part's notification at once (each on its topic's notification topic) through
the broker's publish path (`memq.broker.publish`: its retries, its metrics), and hands
each member topic one `Outcome` for its batch; the topic acks its own Messages. The writer
knows its members only as `Member`s: the dependency runs processor -> group, never back.

A group named "" is a topic's own: one member, objects under the topic's key. A member hands
over a `Fill`: a batch per read partition its producers wrote to, each a part of the object
published to its partition, so parts of several partitions share an object as parts of several
topics do, and objects (PUTs) follow seals, not partitions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from memq.clock import Clock, SystemClock
from memq.config import TopicConfig
from memq.format import NOTIFICATION_VERSION, Notification, encode_batch, object_crc32c
from memq.format.message import Buffer, MessageHeader
from memq.format.wire import AckCode
from memq.storage import ObjectLocation, StorageHandler
from memq.storage.naming import parse_key

from .batch import Batch, Failed, Fill, Outcome, Stored
from .metrics import BrokerMetrics
from .publish import PublishPath

log = logging.getLogger(__name__)


class Member(Protocol):
    """What a writer needs of a member topic (a `TopicProcessor`)."""

    @property
    def name(self) -> str: ...

    @property
    def notification_topic(self) -> str: ...

    def take(self) -> Fill | None:
        """The filling batches, sealed, for the object being stored (None if empty)."""

    def track(self, task: asyncio.Task[None]) -> None:
        """The task storing a fill of this member (its `close` waits for it)."""

    def settle(self, fill: Fill, outcomes: Sequence[Outcome]) -> None:
        """What became of each batch of `fill` (in order): ack or fail its Messages, then free the
        fill's slot. Called exactly once per fill."""


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


def notification(topic: str, batch: Batch, loc: ObjectLocation, part: Part, *, created_ms: int, attempt: int,
                 broker_id: str) -> Notification:
    """The notification of `batch` of `topic`, stored as `part` of the object at `loc`."""
    headers = batch.headers
    return Notification(
        v=NOTIFICATION_VERSION, topic=topic, bucket=loc.bucket, key=loc.key, size=part.size,
        header_size=part.header_size, message_count=len(headers), logmessage_count=batch.logcount,
        min_timestamp_ms=min(h.min_timestamp_ms for h in headers),
        max_timestamp_ms=max(h.max_timestamp_ms for h in headers),
        crc32c=part.crc32c, broker_id=broker_id, attempt=attempt, created_ms=created_ms, offset=part.offset)


class ReadFill(Protocol):
    """What the read path is told of each part this broker writes (`memq.broker.reads.Reads`)."""

    def wants(self, topic: str) -> bool:
        """Whether readers at the tail read `topic` through this broker: then its parts are kept."""

    def stored(self, loc: ObjectLocation, offset: int, part: bytes) -> None:
        """A part just stored (its object, offset and bytes): the read cache's fill on write."""

FLUSH_GATHER_S = 0.002
"""How long a flush's seal waits for the same flush's Messages to other topics of the group."""

STRETCH_PER_SHARE = 10.0
"""While the store throttles a share s of requests, time seals wait (1 + 10 s) x batch_ms: at
S3's 30% SlowDown, 4x fewer PUTs (and reader GETs), more than the 1 / 0.7 its retries add."""
MAX_THROTTLED_AGE_S = 2.0
"""The longest a throttled store stretches a batch's age (unless batch_ms is longer): well under
a producer's request timeout, so a stretched batch still acks in time."""


def throttled_age_s(batch_ms: int, pressure: float) -> float:
    """How old a batch grows before its time seal while the store throttles `pressure` (0 to 1)."""
    base = batch_ms / 1000
    return min(base * (1.0 + STRETCH_PER_SHARE * pressure), max(base, MAX_THROTTLED_AGE_S))


class GroupWriter:
    """Seals and stores the objects of one storage group (or of one topic, group "")."""

    def __init__(self, group: str, *, storage: StorageHandler, path: PublishPath, broker_id: str,
                 metrics: BrokerMetrics, clock: Clock | None = None, reads: ReadFill | None = None) -> None:
        """`path`: the broker's publish path; `reads`: told of each part just stored (Kafka
        readers want it next)."""
        self.group = group
        self._reads = reads
        self._storage = storage
        self._path = path
        self._broker_id = broker_id
        self._clock = clock or SystemClock()
        self._members: dict[str, Member] = {}   # by topic
        self._m_objects = metrics.group_objects.labels(group)
        self._soon: asyncio.Handle | None = None

    @property
    def members(self) -> list[str]:
        return list(self._members)

    def join(self, member: Member) -> None:
        self._members[member.name] = member

    def leave(self, member: Member) -> None:
        if self._members.get(member.name) is member:
            del self._members[member.name]

    def batch_age_s(self, batch_ms: int) -> float:
        """How old a member's batch grows before its time seal: `batch_ms`, stretched while the
        storage reports throttling, so a throttled store gets fewer, larger PUTs (size and flush
        seals are unchanged: memory stays bounded by batch_bytes per slot)."""
        return throttled_age_s(batch_ms, self._storage.pressure())

    async def store_apart(self, topic: str, messages: Sequence[memoryview],
                          headers: Sequence[MessageHeader]) -> Notification:
        """`topic`'s Messages stored now as an object of their own, its notification NOT published:
        a transaction's records, published at its commit (`memq.broker.txn`). Raises on a storage failure."""
        created_ms = int(self._clock.time() * 1000)
        batch = Batch(-1, messages=list(messages), headers=list(headers), logcount=sum(h.count for h in headers))
        chunks = encode_batch(batch.messages, batch.headers, broker_id=self._broker_id, created_ms=created_ms)
        first = headers[0]
        loc = await self._storage.put_batch(topic, chunks, first_request_id=first.producer_id ^ first.sequence,
                                            timestamp_ms=created_ms, broker_id=self._broker_id, group="")
        (part,) = layout([chunks])
        if self._reads is not None and self._reads.wants(topic):
            self._reads.stored(loc, part.offset, b"".join(chunks))
        return notification(topic, batch, loc, part, created_ms=created_ms, attempt=parse_key(loc.key).attempt,
                            broker_id=self._broker_id)

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
        fills = [(m, f) for m in list(self._members.values()) if (f := m.take()) is not None]
        if not fills:
            return
        task = asyncio.get_running_loop().create_task(self._store(fills), name=f"store-{self.group or fills[0][0].name}")
        for m, _ in fills:
            m.track(task)

    async def _store(self, fills: list[tuple[Member, Fill]]) -> None:
        parts = [(m, b) for m, f in fills for b in f.batches.values()]   # in the order settle takes them
        outcomes: list[Outcome] | None = None
        try:
            outcomes = await self._outcomes(parts)
        except Exception as e:   # a bug here must fail these batches only, never the broker
            log.exception("storing an object of %s failed", [m.name for m, _ in fills])
            outcomes = [Failed(AckCode.STORAGE, f"storing batch of topic {m.name} failed: {e}") for m, _ in parts]
        finally:
            if outcomes is None:   # cancelled: the batches' slots must still be freed
                outcomes = [Failed(AckCode.CLOSING, f"storing batch of topic {m.name} was cancelled")
                            for m, _ in parts]
            at = 0
            for m, f in fills:
                n = len(f.batches)
                m.settle(f, outcomes[at:at + n])
                at += n

    async def _outcomes(self, parts: list[tuple[Member, Batch]]) -> list[Outcome]:
        """Store the members' batches as one object and publish each part: an outcome per part."""
        clock = self._clock
        created_ms = int(clock.time() * 1000)
        encoded = [encode_batch(b.messages, b.headers, broker_id=self._broker_id, created_ms=created_ms)
                   for _, b in parts]
        first = parts[0][1].headers[0]
        t0 = clock.monotonic()
        try:
            loc = await self._storage.put_batch(
                parts[0][0].name, [c for chunks in encoded for c in chunks],
                first_request_id=first.producer_id ^ first.sequence, timestamp_ms=created_ms,
                broker_id=self._broker_id, group=self.group)
        except Exception as e:   # a storage failure must fail these batches only, never the broker
            topics = ", ".join(m.name for m, _ in parts)
            return [Failed(AckCode.STORAGE, f"storing batch of topic {m.name} failed (one object with {topics}): {e}")
                    for m, _ in parts]
        put_s = clock.monotonic() - t0
        self._m_objects.inc()
        attempt = parse_key(loc.key).attempt
        placed = layout(encoded)
        if self._reads is not None:
            for chunks, part, (m, _) in zip(encoded, placed, parts):
                if self._reads.wants(m.name):
                    self._reads.stored(loc, part.offset, b"".join(chunks))
        notes = [notification(m.name, b, loc, part, created_ms=created_ms, attempt=attempt, broker_id=self._broker_id)
                 for (m, b), part in zip(parts, placed)]
        t0 = clock.monotonic()
        lanes = [b.partition for _, b in parts]
        # A publish that timed out may have landed: failing its batch would make the producer resend
        # the Messages, stored and announced a second time. The path publishes the same pointer again
        # (for `broker.notify_retry_ms`) while the Messages stay held: a resend waits for this outcome
        # instead of being stored again, and the busy slot pushes back on producers while Kafka is away.
        published = await self._path.publish([(m.notification_topic, note) for (m, _), note in zip(parts, notes)],
                                             lanes)
        notify_s = clock.monotonic() - t0
        return [Stored(note, result, put_s, notify_s) for note, result in zip(notes, published)]


class GroupWriters:
    """A broker's writers, one per storage group, made on first use."""

    def __init__(self, *, storage: StorageHandler, path: PublishPath, broker_id: str,
                 metrics: BrokerMetrics, clock: Clock | None = None, reads: ReadFill | None = None) -> None:
        self._reads = reads
        self._storage = storage
        self._path = path
        self._broker_id = broker_id
        self._metrics = metrics
        self._clock = clock
        self._writers: dict[str, GroupWriter] = {}

    def writer(self, topic: TopicConfig) -> GroupWriter:
        """The writer of `topic`'s group; a topic with group "" gets a writer of its own."""
        if not topic.storage_group:
            return self._new("")
        w = self._writers.get(topic.storage_group)
        if w is None:
            w = self._writers[topic.storage_group] = self._new(topic.storage_group)
        return w

    def _new(self, group: str) -> GroupWriter:
        return GroupWriter(group, storage=self._storage, path=self._path, broker_id=self._broker_id,
                           metrics=self._metrics, clock=self._clock, reads=self._reads)
