"""The Consumer's reading of a compacted topic's prefix (`memq.compaction`): its feed of the
partition log model (`memq.log.model`) and the reading of the parts it names.

A read partition of a compacted topic is a compacted prefix (notifications [0, end), held by the
parts its manifest lists) and the plain tail from notification `end`. When the Consumer's next
notification of a partition lies below `end` (a group reading from earliest, or a reader that
compaction overtook), `Prefix.enter` asks the partition's log (its manifest through the
Consumer's `ManifestPointers`, its DeleteRecords start from the metadata) for the segments from
there: one `PartRead` per part, fetched and handed over in the Consumer's queue beside the
notifications, and the tail's start, where the Consumer moves its notification position. Each
part's records keep their original offsets: a record's (offset, index) is its offset's position
(the model's offset scheme); a tombstone's value is None. Positions stay notification offsets: a
part hands over as its segment's `last_note` (the prefix's last part as `end - 1`), so a commit
after it is `end`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from memq.compaction.manifest import Manifest, ManifestCache, ManifestPointers
from memq.compaction.parts import Survivor, decode_part
from memq.errors import ObjectNotFoundError
from memq.format import MessageHeader
from memq.log.model import OffsetScheme, PartitionLog, PartSegment, TopicLogs
from memq.storage import ObjectLocation

from .consumer_record import DecodedBatch, MessageRecords
from .reader import BatchPointer, FetchLoop, verify


@dataclass(frozen=True, slots=True)
class PartRead:
    """A compacted part in the Consumer's queue, beside the notifications: a segment of the
    partition's log, handed over as notification `offset` (its segment's last)."""

    partition: int
    segment: PartSegment

    @property
    def offset(self) -> int:
        return self.segment.last_note

    @property
    def timestamp_ms(self) -> int:
        return self.segment.part.max_timestamp_ms

    @property
    def size(self) -> int:
        return self.segment.part.size


class Prefix:
    """A compacted topic's prefixes, read through `pointers` (ZooKeeper) and `fetch` (storage);
    `logs`: the partitions' logs as the metadata gives them (DeleteRecords' starts)."""

    def __init__(self, topic: str, pointers: ManifestPointers, fetch: FetchLoop, logs: TopicLogs,
                 timeout_s: float = 30.0) -> None:
        self.topic = topic
        self._pointers = pointers
        self._fetch = fetch
        self._manifests = ManifestCache(fetch)
        self._logs = logs
        self._timeout_s = timeout_s

    def manifest(self, partition: int) -> Manifest | None:
        """The partition's current manifest (None before its first compaction)."""
        pointer = self._pointers.get(self.topic, partition)
        return None if pointer is None else self._fetch.run(self._manifests.load(pointer), self._timeout_s)

    def log(self, partition: int) -> PartitionLog:
        """The partition's log with its current compacted prefix."""
        return dataclasses.replace(self._logs.partition(partition), manifest=self.manifest(partition))

    def enter(self, partition: int, note: int) -> tuple[list[PartRead], int] | None:
        """(the parts to read from notification `note` on, where the plain tail starts) when
        `note` is in the partition's compacted prefix; None when it is not."""
        segments = self.log(partition).by_notes(self.topic, partition).segments_from_note(note)
        if not segments.in_prefix:
            return None
        assert segments.tail is not None
        return [PartRead(partition, s) for s in segments.parts], segments.tail.note

    async def load(self, rec: PartRead) -> DecodedBatch:
        """The part's survivors from its segment's start as the Consumer hands records over."""
        p = rec.segment.part
        ptr = BatchPointer(self.topic, p.location, p.size, p.crc32c, rec.partition, rec.offset)
        try:
            obj = await self._fetch.get_range(p.location, 0, p.size)
        except ObjectNotFoundError as e:
            raise ptr.lost(f"(compacted part) is missing: {e}") from e
        verify(ptr, obj)
        return await self._fetch.cpu(_decoded, self.topic, rec, self._logs.partition(rec.partition).scheme, obj)


def _decoded(topic: str, rec: PartRead, scheme: OffsetScheme, obj: bytes) -> DecodedBatch:
    """Survivors at or after the segment's start in runs of consecutive offsets of one
    notification, each run one MessageRecords (a record's offset and index are its offset's
    position). A run's header is its Message's, numbered by the run's first offset, its producer
    id told apart per partition (`_partition_producer`: offsets repeat across a topic's
    partitions), so de-duplication (by producer id, epoch, sequence, per topic) never takes one
    run for another."""
    loc = rec.segment.part.location
    position_of = scheme.position_of
    out: DecodedBatch = []
    for mh, survivors in decode_part(obj, rec.segment.start)[1]:
        run: list[Survivor] = []
        last = note = -1
        for s in survivors:
            o = s.offset
            if run and (o != last + 1 or position_of(o)[0] != note):
                out.append(_run(topic, rec.partition, mh, run, loc, scheme))
                run = []
            if not run:
                note = position_of(o)[0]
            run.append(s)
            last = o
        if run:
            out.append(_run(topic, rec.partition, mh, run, loc, scheme))
    return out


def _run(topic: str, partition: int, mh: MessageHeader, run: list[Survivor], loc: ObjectLocation,
         scheme: OffsetScheme) -> tuple[MessageHeader, MessageRecords]:
    note, index = scheme.position_of(run[0].offset)
    producer_id = _partition_producer(mh.producer_id, partition)
    header = dataclasses.replace(mh, producer_id=producer_id, sequence=run[0].offset, count=len(run))
    logs = [(s.value, s.key, s.headers, s.timestamp_ms, None) for s in run]
    return header, MessageRecords(logs, index, (topic, partition, note), (producer_id, mh.epoch, run[0].offset, loc))


_MIX = 0x9E3779B97F4A7C15   # 2^64 / golden ratio: partitions' ids spread over the u64 space


def _partition_producer(producer_id: int, partition: int) -> int:
    """A compacted run's producer id in `partition`: the Message's in partition 0, told apart in
    the others (one memq Producer writes every partition of a compacted topic, placed by key)."""
    return producer_id ^ (partition * _MIX & 0xFFFFFFFFFFFFFFFF)
