"""The broker's feed of the partition log model (`memq.log.model`): the one place its doors get a
partition's log start, high watermark and segments from.

A `PartitionLog` is pure; what it is built from is read here, over the core's read path
(`Reads`): the compacted prefix's manifest (`Reads.manifest`), the DeleteRecords start (the
cluster metadata's `TopicMetadata.log_start`), the notification watermarks (as the partition's
tail last saw them, or asked of Kafka) and where the last record a reader gets is (`Reads.end`:
a notification and a record count, without the copies a reader does not get; the model's offset
scheme makes it an offset). The Kafka door's Fetch, ListOffsets,
OffsetForLeaderEpoch and DeleteRecords ask `BrokerCore.logs`, so no family reaches into another.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Protocol

from memq.compaction.manifest import Manifest
from memq.errors import MemqError
from memq.format.metadata import TopicMetadata
from memq.log.model import SPARSE, PartitionLog, moved_start
from memq.notify.consumer import NotificationRecord

from .bases import Bases

log = logging.getLogger(__name__)

#: How long the current log waits to read the partition's last notification (its record count).
LATEST_WAIT_S = 2.0


class LogReads(Protocol):
    """What the feed reads, of the core's read path (`memq.broker.reads.Reads`)."""

    async def manifest(self, topic: str, partition: int) -> Manifest | None: ...
    def watermarks_seen(self, notification_topic: str, partition: int) -> tuple[int, int] | None: ...
    def last_seen(self, notification_topic: str, partition: int) -> NotificationRecord | None: ...
    async def watermarks(self, notification_topic: str, partition: int) -> tuple[int, int]: ...
    async def notes(self, notification_topic: str, partition: int, offset: int, wait_s: float
                    ) -> list[NotificationRecord]: ...
    async def end(self, notification_topic: str, partition: int, last: NotificationRecord) -> tuple[int, int]: ...


class Logs:
    """Partition logs as this broker reads them (`BrokerCore.logs`); a dense topic's offsets
    through its partitions' counted bases (`bases`)."""

    def __init__(self, reads: LogReads, bases: Bases) -> None:
        self._reads = reads
        self.bases = bases

    async def started(self, topic: TopicMetadata, partition: int, high: int | None = None) -> PartitionLog:
        """The log as the cluster metadata says it: DeleteRecords' start, and its offset scheme
        (a dense topic's counted to notification `high`, `Bases.scheme`; no I/O for a sparse one)."""
        scheme = await self.bases.scheme(topic, partition, high)
        return PartitionLog(moved=moved_start(topic.log_start, partition, scheme), scheme=scheme)

    async def counted(self, plog: PartitionLog, topic: TopicMetadata, partition: int,
                      notes: list[NotificationRecord]) -> None:
        """A read brought `notes`: a dense topic counts them (their records' offsets)."""
        if plog.scheme is not SPARSE:
            await self.bases.counted(topic, partition, notes)

    async def opened(self, plog: PartitionLog, topic: TopicMetadata, partition: int, peer: object) -> PartitionLog:
        """`plog` with its compacted prefix (the topic's current manifest), no Kafka call."""
        if "compact" not in topic.cleanup_policy:
            return plog
        return dataclasses.replace(plog, manifest=await self._manifest(topic, partition, peer))

    async def read_to(self, plog: PartitionLog, topic: TopicMetadata, partition: int, note: int, index: int,
                      peer: object) -> PartitionLog:
        """`plog` with its notifications after a Fetch read up to (`note`, `index`): as the
        partition's tail saw them (no Kafka call), asked of Kafka when a compacted prefix was read
        alone (the tail's end not known here)."""
        ntopic = topic.notification_topic
        marks = self._reads.watermarks_seen(ntopic, partition)
        if marks is None and plog.manifest is not None:
            try:
                low, high = await self._reads.watermarks(ntopic, partition)
                return dataclasses.replace(plog, low=low, high=high,
                                           last_end=await self._last_end(plog, ntopic, partition, low, high))
            except MemqError as e:
                log.warning("Kafka fetch of %s[%d] from %s: watermarks: %s", topic.name, partition, peer, e)
                return dataclasses.replace(plog, high=note)
        low, high = marks if marks is not None else (-1, note)
        high = max(high, note + (1 if index else 0), 0)
        if plog.scheme is not SPARSE:
            await self.bases.scheme(topic, partition, high)   # the tail may have seen further meanwhile
        last_end = await self._end(plog, ntopic, partition, high, self._reads.last_seen(ntopic, partition))
        return PartitionLog(plog.manifest, plog.moved, low, high, last_end, plog.scheme)   # per Fetch: no replace()

    async def current(self, topic: TopicMetadata, partition: int, peer: object, *, end: bool = True) -> PartitionLog:
        """The log as the notification Kafka has it now (ListOffsets, DeleteRecords,
        OffsetForLeaderEpoch); `end`: read its last notification too (the high watermark's
        exact end). MemqError when Kafka fails."""
        low, high = await self._reads.watermarks(topic.notification_topic, partition)
        plog = await self.opened(await self.started(topic, partition, high), topic, partition, peer)
        plog = dataclasses.replace(plog, low=low, high=high)
        if end:
            plog = dataclasses.replace(plog, last_end=await self._last_end(plog, topic.notification_topic, partition,
                                                                           low, high))
        return plog

    async def _last_end(self, plog: PartitionLog, ntopic: str, partition: int, low: int, high: int) -> int | None:
        """The end of the partition's last notification's part, reading that notification."""
        if plog.manifest is not None and high <= plog.manifest.end:
            return None   # the prefix ends it: no plain part to read
        last = None
        if high > low:
            notes = await self._reads.notes(ntopic, partition, high - 1, LATEST_WAIT_S)
            last = notes[0] if notes else None
        return await self._end(plog, ntopic, partition, high, last)

    async def _end(self, plog: PartitionLog, ntopic: str, partition: int, high: int,
                   last: NotificationRecord | None) -> int | None:
        """Just after the last record a reader gets of `last`'s part when it is the partition's
        last (so a reader that read everything has no lag and is at the end, even when the last
        part ends in dropped copies); None when it is not known."""
        if last is None or last.offset != high - 1 or (plog.manifest is not None and high <= plog.manifest.end):
            return None
        try:
            note, count = await self._reads.end(ntopic, partition, last)
        except MemqError as e:   # its part unreadable now: the end as its notification counts it
            log.info("Kafka high watermark of %s[%d]: %s", ntopic, partition, e)
            note, count = last.offset, last.notification.logmessage_count
        return plog.scheme.end_of(note, count)

    async def _manifest(self, topic: TopicMetadata, partition: int, peer: object) -> Manifest | None:
        """The current manifest of a compacted topic's partition (None: not compacted, or not yet, or
        its manifest unreadable now: then the plain tail alone is read, as before any compaction)."""
        if "compact" not in topic.cleanup_policy:
            return None
        try:
            return await self._reads.manifest(topic.name, partition)
        except MemqError as e:
            log.warning("Kafka read of %s[%d] from %s: no compacted prefix: %s", topic.name, partition, peer, e)
            return None
