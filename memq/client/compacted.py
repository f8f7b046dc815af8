"""The Consumer's reading of a compacted topic's prefix (`memq.compaction`): its feed of the
partition log model (`memq.log.model`) and the reading of the parts it names.

A read partition of a compacted topic is a compacted prefix (notifications [0, end), held by the
parts its manifest lists) and the plain tail from notification `end`. When the Consumer's next
notification of a partition lies below `end` (a group reading from earliest, a position committed
or sought inside the prefix, or a reader that compaction overtook), `Prefix.enter` asks the
partition's log (its manifest through the Consumer's `ManifestPointers`, its DeleteRecords start
from the metadata) for the segments from that record's offset, as a broker's Kafka Fetch does: one
`PartRead` per part, fetched and handed over in the Consumer's queue beside the notifications, and
the tail's start, where the Consumer moves its notification position. Each part's records keep
their original offsets: on a sparse topic a record's (offset, index) is its offset's position; on
a dense one (`offsets`: the Consumer's counted record offsets) its offset is its record offset.
A tombstone's value is None. Positions stay notification offsets: a part hands over as its
segment's `last_note` (the notification of its last survivor; the prefix's last part as
`end - 1`), so a commit after it resumes at the next one's survivors, and after the prefix at `end`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from memq.compaction.manifest import Manifest, ManifestCache, ManifestPointers
from memq.compaction.parts import Survivor, decode_part
from memq.errors import ObjectNotFoundError
from memq.format import MessageHeader
from memq.log.model import SPARSE, PartitionLog, PartSegment, TopicLogs
from memq.storage import ObjectLocation

from .consumer_record import DecodedBatch, MessageRecords
from .dense_offsets import CountedOffsets
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
                 timeout_s: float = 30.0, offsets: CountedOffsets | None = None) -> None:
        self.topic = topic
        self._offsets = offsets
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
        """The partition's log in the topic's offsets with its current compacted prefix."""
        plog = (self._logs.partition(partition) if self._offsets is None
                else self._logs.in_scheme(partition, self._offsets.scheme(partition)))
        return dataclasses.replace(plog, manifest=self.manifest(partition))

    def enter(self, partition: int, note: int, index: int = 0) -> tuple[list[PartRead], int] | None:
        """(the parts to read from record `index` of notification `note` on, where the plain tail
        starts) when `note` is in the partition's compacted prefix; None when it is not. The
        beginning (0, 0) is offset 0 in either scheme, whatever retention left to count."""
        plog = self.log(partition)
        if plog.manifest is None or note >= plog.manifest.end:
            return None
        segments = plog.segments(plog.scheme.offset_of(note, index) if note or index else 0)
        assert segments.in_prefix and segments.tail is not None
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
        return await self._fetch.cpu(_decoded, self.topic, rec, self._offsets is not None, obj)


def _decoded(topic: str, rec: PartRead, dense: bool, obj: bytes) -> DecodedBatch:
    """Survivors at or after the segment's start in runs of consecutive offsets (on a sparse
    topic, of one notification), each run one MessageRecords. A run's header is its Message's,
    numbered by the run's first offset, its producer id told apart per partition
    (`_partition_producer`: offsets repeat across a topic's partitions), so de-duplication (by
    producer id, epoch, sequence, per topic) never takes one run for another."""
    loc, start = rec.segment.part.location, rec.segment.start
    out: DecodedBatch = []
    read = 0   # survivors of the part before the run: a dense record's index is its place among them

    def note_of(o: int) -> int:
        return 0 if dense else SPARSE.position_of(o)[0]

    for mh, survivors in decode_part(obj)[1]:
        run: list[Survivor] = []
        last = note = -1
        for s in survivors:
            o = s.offset
            if o < start:
                read += 1
                continue
            if run and (o != last + 1 or note_of(o) != note):
                out.append(_run(topic, rec, mh, run, loc, read if dense else None))
                read += len(run)
                run = []
            note = note_of(o)
            run.append(s)
            last = o
        if run:
            out.append(_run(topic, rec, mh, run, loc, read if dense else None))
            read += len(run)
    return out


def _run(topic: str, rec: PartRead, mh: MessageHeader, run: list[Survivor], loc: ObjectLocation,
         read: int | None) -> tuple[MessageHeader, MessageRecords]:
    """One run as MessageRecords: on a sparse topic at its first offset's position (notification,
    index); on a dense one (`read`: survivors before it in the part) at its record offsets."""
    first = run[0].offset
    producer_id = _partition_producer(mh.producer_id, rec.partition)
    header = dataclasses.replace(mh, producer_id=producer_id, sequence=first, count=len(run))
    logs = [(s.value, s.key, s.headers, s.timestamp_ms, None) for s in run]
    tail = (producer_id, mh.epoch, first, loc)
    if read is None:
        note, index = SPARSE.position_of(first)
        return header, MessageRecords(logs, index, (topic, rec.partition, note), tail)
    return header, MessageRecords(logs, read, (topic, rec.partition, rec.offset), tail, base=first - read)


_MIX = 0x9E3779B97F4A7C15   # 2^64 / golden ratio: partitions' ids spread over the u64 space


def _partition_producer(producer_id: int, partition: int) -> int:
    """A compacted run's producer id in `partition`: the Message's in partition 0, told apart in
    the others (one memq Producer writes every partition of a compacted topic, placed by key)."""
    return producer_id ^ (partition * _MIX & 0xFFFFFFFFFFFFFFFF)
