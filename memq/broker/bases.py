"""Dense offsets on the broker: each dense partition's bases (`memq.kafka_api.dense`), counted from its
notification log over the read path, checkpointed where the cluster keeps its state.

A partition is counted once per broker (the first time a reader asks), from the oldest stored
checkpoint at or after the first retained notification (a compacted partition's manifest is one:
the offset where its tail starts, `Manifest.dense_tail`): back to that notification, forward to
the end; then, as readers read on, from the notifications their reads bring. Each multiple of
`CHECKPOINT_EVERY` counted is stored (ZooKeeper: `Registry.save_offset_checkpoint`; memory for a
broker without ZooKeeper, which alone numbers its topics), so the next cold reader counts at most
that many notifications past one. Sparse topics (`TopicConfig.offsets`) get `SPARSE`, no I/O.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from memq.compaction.manifest import Manifest
from memq.errors import MemqError, OffsetUnknownError
from memq.format.metadata import TopicMetadata
from memq.kafka_api.dense import CHECKPOINT_EVERY, Checkpoint, DenseScheme, PartitionBases, kept
from memq.log.model import SPARSE, OffsetScheme
from memq.notify.consumer import NotificationRecord

log = logging.getLogger(__name__)

#: How often a broker counts the dense partitions it hosts (`Counting`): well within any retention
#: worth the name, so checkpoints land before the notifications they follow expire.
COUNT_EVERY_S = 60.0


class CheckpointStore(Protocol):
    """Where a dense partition's checkpoints are kept (`memq.governor.registry.Registry`). Blocking."""

    def offset_checkpoints(self, topic: str, partition: int) -> tuple[Checkpoint, ...]: ...
    def save_offset_checkpoint(self, topic: str, partition: int, new: Checkpoint, low: int) -> None: ...


class MemoryCheckpoints:
    """Checkpoints of a broker without ZooKeeper (it alone serves its topics)."""

    def __init__(self) -> None:
        self._points: dict[tuple[str, int], tuple[Checkpoint, ...]] = {}

    def offset_checkpoints(self, topic: str, partition: int) -> tuple[Checkpoint, ...]:
        return self._points.get((topic, partition), ())

    def save_offset_checkpoint(self, topic: str, partition: int, new: Checkpoint, low: int) -> None:
        self._points[topic, partition] = kept(self._points.get((topic, partition), ()), new, low)


class BaseReads(Protocol):
    """What the counting reads, of the core's read path (`memq.broker.reads.Reads`)."""

    def watermarks_seen(self, notification_topic: str, partition: int) -> tuple[int, int] | None: ...
    async def watermarks(self, notification_topic: str, partition: int) -> tuple[int, int]: ...
    async def notes_between(self, notification_topic: str, partition: int, start: int, end: int
                            ) -> list[NotificationRecord]: ...
    async def manifest(self, topic: str, partition: int) -> Manifest | None: ...


class Bases:
    """The dense partitions' bases this broker counted (`Logs` feeds them to the model)."""

    def __init__(self, reads: BaseReads, store: CheckpointStore) -> None:
        self._reads = reads
        self._store = store
        self._schemes: dict[tuple[str, int], DenseScheme] = {}
        self._cold: dict[tuple[str, int], asyncio.Future[DenseScheme]] = {}

    async def scheme(self, topic: TopicMetadata, partition: int, high: int | None = None) -> OffsetScheme:
        """The partition's offset scheme; a dense one counted to notification `high` (None: to the
        end as this broker's tail last saw it, else as Kafka has it). OffsetUnknownError when no
        checkpoint lies in the retained notifications; MemqError when Kafka fails."""
        if topic.offsets != "dense":
            return SPARSE
        key = (topic.name, partition)
        scheme = self._schemes.get(key)
        if scheme is None:
            scheme = await self._started(topic, partition)
        if high is None:
            marks = self._reads.watermarks_seen(topic.notification_topic, partition)
            if marks is None:
                marks = await self._reads.watermarks(topic.notification_topic, partition)
            scheme.bases.forget_before(marks[0])   # retention took them: no reader gets there
            high = marks[1]
        if high > scheme.bases.next:
            await self._count(topic, partition, scheme.bases,
                              await self._reads.notes_between(topic.notification_topic, partition,
                                                              scheme.bases.next, high))
        return scheme

    async def warm(self, topic: TopicMetadata, partition: int, high: int) -> DenseScheme | None:
        """The partition's dense scheme counted to notification `high` when this broker counts it
        already (a few notifications more: the tail has them); None when it does not: then its
        count starts in the background (a cold count is not for a producer's ack to wait on)."""
        key = (topic.name, partition)
        scheme = self._schemes.get(key)
        if scheme is None:
            if key not in self._cold:
                asyncio.ensure_future(self._started(topic, partition)).add_done_callback(_retrieved)
            return None
        if high > scheme.bases.next:
            await self.scheme(topic, partition, high)
        return scheme

    async def counted(self, topic: TopicMetadata, partition: int, notes: Sequence[NotificationRecord]) -> None:
        """Count the notifications a read brought (those before them first, if any were not counted)."""
        scheme = self._schemes.get((topic.name, partition))
        if scheme is None or not notes or notes[-1].offset < scheme.bases.next:
            return
        if notes[0].offset > scheme.bases.next:
            await self.scheme(topic, partition, notes[0].offset)
        await self._count(topic, partition, scheme.bases, notes)

    async def _started(self, topic: TopicMetadata, partition: int) -> DenseScheme:
        key = (topic.name, partition)
        pending = self._cold.get(key)
        if pending is None:
            pending = self._cold[key] = asyncio.ensure_future(self._catch_up(topic, partition))
            pending.add_done_callback(lambda _: self._cold.pop(key, None))
        return await asyncio.shield(pending)

    async def _catch_up(self, topic: TopicMetadata, partition: int) -> DenseScheme:
        """Count the retained notifications from a checkpoint: the oldest at or after the first
        retained one (back to it, then forward), or notification 0's when nothing expired yet."""
        ntopic = topic.notification_topic
        low, high = await self._reads.watermarks(ntopic, partition)
        points = await asyncio.to_thread(self._store.offset_checkpoints, topic.name, partition)
        if "compact" in topic.cleanup_policy:   # a compacted prefix's manifest says where its tail starts
            try:
                m = await self._reads.manifest(topic.name, partition)
            except MemqError as e:   # the stored checkpoints alone, as for any topic
                log.info("%s[%d]: no manifest to count dense offsets from: %s", topic.name, partition, e)
                m = None
            if m is not None and m.dense:
                points = tuple(sorted({*points, Checkpoint(m.end, m.tail_offset)}))
        usable = [p for p in points if low <= p.note <= high]
        if usable:
            at = usable[0]
        elif low <= 0:
            at = Checkpoint(0, 0)
        else:
            raise OffsetUnknownError(f"{topic.name}[{partition}]: no offset checkpoint among the retained "
                                     f"notifications [{low}, {high}) (stored: {list(points)[-3:]})")
        bases = PartitionBases(at)
        if at.note > low:
            bases.add_before([(n.offset, n.notification.logmessage_count)
                              for n in await self._reads.notes_between(ntopic, partition, low, at.note)])
        await self._count(topic, partition, bases, await self._reads.notes_between(ntopic, partition, at.note, high))
        log.info("%s[%d]: dense offsets counted from checkpoint %s: notifications [%d, %d)", topic.name, partition,
                 at, bases.first, bases.next)
        scheme = self._schemes[topic.name, partition] = DenseScheme(bases)
        return scheme

    async def _count(self, topic: TopicMetadata, partition: int, bases: PartitionBases,
                     notes: Sequence[NotificationRecord]) -> None:
        """Add `notes`, storing a checkpoint at each multiple of `CHECKPOINT_EVERY` passed."""
        before = bases.next
        bases.add((n.offset, n.notification.logmessage_count) for n in notes)
        for note in range((before // CHECKPOINT_EVERY + 1) * CHECKPOINT_EVERY, bases.next + 1, CHECKPOINT_EVERY):
            point = Checkpoint(note, bases.base(note))
            try:
                await asyncio.to_thread(self._store.save_offset_checkpoint, topic.name, partition, point, bases.first)
            except MemqError as e:   # the next one comes soon; a reader counts a little further meanwhile
                log.warning("%s[%d]: offset checkpoint %s not stored: %s", topic.name, partition, point, e)


def _retrieved(task: asyncio.Future[DenseScheme]) -> None:
    """A background count's failure is logged; the next reader or `Counting` tries again."""
    if not task.cancelled() and task.exception() is not None:
        log.info("dense offsets not counted in the background: %s", task.exception())


class Counting:
    """Keeps the dense partitions of the topics a broker hosts counted, every `COUNT_EVERY_S`, so
    their checkpoints are stored whether or not a reader reads them: else a partition no Kafka
    reader read for a whole retention period would keep no checkpoint in its retained notifications."""

    def __init__(self, bases: Bases, hosted: Callable[[], Iterable[TopicMetadata]]) -> None:
        self._bases = bases
        self._hosted = hosted
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(COUNT_EVERY_S)
            await self.count_all()

    async def count_all(self) -> None:
        """Count each hosted dense partition to its end (storing the checkpoints it passes)."""
        for topic in self._hosted():
            if topic.offsets != "dense":
                continue
            for partition in range(topic.read_partitions):
                try:
                    await self._bases.scheme(topic, partition)
                except MemqError as e:
                    log.warning("%s[%d]: dense offsets not counted: %s", topic.name, partition, e)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
