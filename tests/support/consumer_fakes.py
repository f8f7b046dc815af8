"""Typed in-process fakes for the Consumer and its parts: objects in a dict, notifications in a
list, a clock stepped by hand, recorders for commits and audit. No server, no process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from memq.client.consumer import Consumer
from memq.errors import ObjectNotFoundError
from memq.format import (NOTIFICATION_VERSION, LogMessage, Notification, decode_message_header, encode_batch,
                         encode_message, object_crc32c)
from memq.notify import NotificationRecord
from memq.storage import ObjectLocation


class MemorySource:
    """An ObjectSource over a dict (what a StorageHandler is to the reader)."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects

    async def get(self, loc: ObjectLocation) -> bytes:
        try:
            return self.objects[loc.key]
        except KeyError:
            raise ObjectNotFoundError(f"no object {loc.key}") from None

    async def get_range(self, loc: ObjectLocation, start: int, length: int) -> bytes:
        return (await self.get(loc))[start:start + length]

    async def close(self) -> None:
        pass


class CountingSource(MemorySource):
    """A MemorySource counting its ranged GETs; each waits `delay_s` (so concurrent readers
    can join one load in flight)."""

    def __init__(self, objects: dict[str, bytes], delay_s: float = 0.0) -> None:
        super().__init__(objects)
        self.gets = 0
        self.delay_s = delay_s

    async def get_range(self, loc: ObjectLocation, start: int, length: int) -> bytes:
        self.gets += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return await super().get_range(loc, start, length)


class FakeNotifications:
    """A NotificationSource over a list of records on one partition; records commits."""

    def __init__(self, records: list[NotificationRecord]) -> None:
        self.records = records
        self.at = 0
        self.commits: list[dict[int, int]] = []
        self.closed = False
        self.on_revoke: Callable[[list[int]], None] | None = None

    def subscribe(self, on_assign: Callable[[list[int]], None] | None = None,
                  on_revoke: Callable[[list[int]], None] | None = None) -> None:
        """Assigns partition 0 at once; `on_revoke` is kept for the test to call (a rebalance)."""
        self.on_revoke = on_revoke
        if on_assign:
            on_assign([0])

    def assignment(self) -> list[int]:
        return [0]

    def poll(self, timeout_s: float, max_records: int = 500) -> list[NotificationRecord]:
        out = self.records[self.at:self.at + max_records]
        self.at += len(out)
        return out

    def seek(self, partition: int, offset: int) -> None:
        self.at = offset

    def position(self, partitions: Iterable[int] | None = None) -> dict[int, int | None]:
        return {0: self.at}

    def commit(self, offsets: Mapping[int, int], asynchronous: bool = False) -> None:
        self.commits.append(dict(offsets))

    def committed(self, partitions: Iterable[int]) -> dict[int, int | None]:
        return {0: self.commits[-1][0] if self.commits else None}

    def watermarks(self, partition: int) -> tuple[int, int]:
        return 0, len(self.records)

    def offsets_for_times(self, ts_ms: int) -> dict[int, int]:
        return {0: 0}

    def close(self) -> None:
        self.closed = True


def batch(key: str, messages: list[tuple[int, int, list[LogMessage]]], offset: int,
          objects: dict[str, bytes], partition: int = 0) -> NotificationRecord:
    """Store a batch of (producer id, sequence, records) Messages under `key`; its notification."""
    msgs = [encode_message(recs, producer_id=pid, epoch=0, sequence=seq) for pid, seq, recs in messages]
    headers = [decode_message_header(m) for m in msgs]
    chunks = encode_batch(msgs, headers, broker_id="t", created_ms=1)
    objects[key] = b"".join(chunks)
    note = Notification(v=NOTIFICATION_VERSION, topic="t", bucket="b", key=key, size=len(objects[key]),
                        header_size=len(chunks[0]), message_count=len(msgs),
                        logmessage_count=sum(h.count for h in headers), min_timestamp_ms=1, max_timestamp_ms=9,
                        crc32c=object_crc32c(chunks), broker_id="t", attempt=0, created_ms=1)
    return NotificationRecord(partition, offset, int(time.time() * 1000), note)   # published now: inside retention


def recs(*values: str) -> list[LogMessage]:
    return [LogMessage(v.encode(), None, (), 5) for v in values]


def values(c: Consumer, batches: int) -> list[bytes]:
    """The values of the next `batches` polls."""
    return [bytes(r.value) for _ in range(batches) for r in c.poll(5)]


@dataclass
class CommitRecorder:
    """A CommitLog that records each commit, or fails with `fail` when set."""

    commits: list[tuple[dict[int, int], bool]] = field(default_factory=list)
    fail: Exception | None = None

    def commit(self, offsets: Mapping[int, int], asynchronous: bool = False) -> None:
        if self.fail is not None:
            raise self.fail
        self.commits.append((dict(offsets), asynchronous))


@dataclass(frozen=True)
class Consumed:
    """One `ConsumedSink.consumed` call."""

    topic: str
    group: str
    producer_id: int
    sequence: int
    count: int
    consumed_ms: int


@dataclass
class SinkRecorder:
    """A ConsumedSink keeping what it was told."""

    calls: list[Consumed] = field(default_factory=list)

    def consumed(self, *, topic: str, group: str, producer_id: int, epoch: int, sequence: int,
                 count: int, digest: int, created_ms: int, consumed_ms: int) -> None:
        self.calls.append(Consumed(topic, group, producer_id, sequence, count, consumed_ms))
