"""The Consumer's reading of a compacted topic's prefix (`memq.compaction`).

A read partition of a compacted topic is a compacted prefix (notifications [0, end), held by the
parts its manifest lists) and the plain tail from notification `end`. When the Consumer's next
notification of a partition lies below `end` (a group reading from earliest, or a reader that
compaction overtook), `Prefix.enter` turns the rest of the prefix from there into one
`CompactedRecord` per part, to be fetched and handed over like batches, and the Consumer moves
its notification position to `end`. Each part's Kafka records keep their original offsets:
a record's (offset, index) is its Kafka offset split (`kafka_api.offsets`); a tombstone's value
is None. Positions stay notification offsets: a part hands over as its last survivor's
notification, the prefix's last part as `end - 1`, so a commit after it is `end`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from memq.compaction.manifest import Manifest, ManifestCache, ManifestPointers
from memq.compaction.parts import PartRef, Survivor, message_survivors
from memq.errors import ObjectNotFoundError
from memq.format import MessageHeader, Notification, decode_batch_header, decode_message_header
from memq.kafka_api.offsets import first_offset, split_offset
from memq.notify import NotificationRecord
from memq.storage import ObjectLocation

from .consumer_record import DecodedBatch, MessageRecords
from .reader import BatchPointer, FetchLoop, verify

COMPACTOR = "compactor"   # broker id of a compacted part's stand-in notification


@dataclass(frozen=True, slots=True)
class CompactedRecord(NotificationRecord):
    """A compacted part standing in the Consumer's queue for a notification: its survivors at
    or after Kafka offset `start`."""

    part: PartRef = dataclasses.field(default=None)   # type: ignore[assignment]  # always given
    start: int = 0


class Prefix:
    """A compacted topic's prefixes, read through `pointers` (ZooKeeper) and `fetch` (storage)."""

    def __init__(self, topic: str, pointers: ManifestPointers, fetch: FetchLoop, timeout_s: float = 30.0) -> None:
        self.topic = topic
        self._pointers = pointers
        self._fetch = fetch
        self._manifests = ManifestCache(fetch)
        self._timeout_s = timeout_s

    def manifest(self, partition: int) -> Manifest | None:
        """The partition's current manifest (None before its first compaction)."""
        pointer = self._pointers.get(self.topic, partition)
        return None if pointer is None else self._fetch.run(self._manifests.load(pointer), self._timeout_s)

    def enter(self, partition: int, note: int) -> tuple[list[NotificationRecord], int] | None:
        """(stand-in records of the parts to read from notification `note` on, where the plain
        tail starts) when `note` is below the partition's compacted end; None when it is not."""
        m = self.manifest(partition)
        if m is None or note >= m.end:
            return None
        start = first_offset(note)
        parts = m.parts_from(start)
        out: list[NotificationRecord] = []
        for i, p in enumerate(parts):
            last_note = m.end - 1 if i == len(parts) - 1 else split_offset(p.last_offset)[0]
            out.append(CompactedRecord(partition, last_note, p.max_timestamp_ms, _notification(self.topic, p),
                                       p, max(start, p.first_offset)))
        return out, m.end

    async def load(self, rec: CompactedRecord) -> DecodedBatch:
        """The part's survivors from `rec.start` as the Consumer hands records over."""
        p = rec.part
        ptr = BatchPointer(self.topic, p.location, p.size, p.crc32c, rec.partition, rec.offset)
        try:
            obj = await self._fetch.get_range(p.location, 0, p.size)
        except ObjectNotFoundError as e:
            raise ptr.lost(f"(compacted part) is missing: {e}") from e
        verify(ptr, obj)
        return await self._fetch.cpu(_decoded, self.topic, rec, obj)


def _notification(topic: str, p: PartRef) -> Notification:
    return Notification(v=2, topic=topic, bucket=p.bucket, key=p.key, size=p.size, header_size=p.header_size,
                        message_count=0, logmessage_count=p.records, min_timestamp_ms=p.min_timestamp_ms,
                        max_timestamp_ms=p.max_timestamp_ms, crc32c=p.crc32c, broker_id=COMPACTOR, attempt=0,
                        created_ms=0)


def _decoded(topic: str, rec: CompactedRecord, obj: bytes) -> DecodedBatch:
    """Survivors at or after `rec.start` in runs of consecutive Kafka offsets, each run one
    MessageRecords (a record's offset and index are its Kafka offset split). A run's header is
    its Message's, numbered by the run's first Kafka offset, its producer id told apart per
    partition (`_partition_producer`: Kafka offsets repeat across a topic's partitions), so
    de-duplication (by producer id, epoch, sequence, per topic) never takes one run for another."""
    header = decode_batch_header(obj)
    loc = rec.part.location
    out: DecodedBatch = []
    for lo, hi in header.message_ranges:
        msg = memoryview(obj)[lo:hi]
        mh = decode_message_header(msg)
        run: list[Survivor] = []
        for s in message_survivors(msg):
            if s.offset < rec.start:
                continue
            if run and (s.offset != run[-1].offset + 1 or split_offset(s.offset)[0] != split_offset(run[0].offset)[0]):
                out.append(_run(topic, rec.partition, mh, run, loc))
                run = []
            run.append(s)
        if run:
            out.append(_run(topic, rec.partition, mh, run, loc))
    return out


def _run(topic: str, partition: int, mh: MessageHeader, run: list[Survivor], loc: ObjectLocation
         ) -> tuple[MessageHeader, MessageRecords]:
    note, index = split_offset(run[0].offset)
    producer_id = _partition_producer(mh.producer_id, partition)
    header = dataclasses.replace(mh, producer_id=producer_id, sequence=run[0].offset, count=len(run))
    logs = [(s.value, s.key, s.headers, s.timestamp_ms, None) for s in run]
    return header, MessageRecords(logs, index, (topic, partition, note), (producer_id, mh.epoch, run[0].offset, loc))


_MIX = 0x9E3779B97F4A7C15   # 2^64 / golden ratio: partitions' ids spread over the u64 space


def _partition_producer(producer_id: int, partition: int) -> int:
    """A compacted run's producer id in `partition`: the Message's in partition 0, told apart in
    the others (one memq Producer writes every partition of a compacted topic, placed by key)."""
    return producer_id ^ (partition * _MIX & 0xFFFFFFFFFFFFFFFF)
