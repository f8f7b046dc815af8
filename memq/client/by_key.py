"""One key's latest value in a compacted topic, without scanning it (`memq get`, `Consumer.get`).

Per read partition: the plain tail (the partition log model's `tail_note` on: notifications from
the manifest's `end`, `memq.log.model`) newest first, at most
`max_tail_notes` of them (the tail is what compaction has not reached: short while compaction
keeps up); then, if the key is not there, the compacted parts' key indexes, newest part first
(`memq.compaction.read.PartReader`: one ranged GET for a part's header and index, kept, then
the one Message the index names). A tail longer than the bound without the key is refused with
ConsumerError rather than answered from the older parts (which could be stale).

Every partition is asked: the writers' partitioners place a key (memq's Producer and Java's
clients hash it alike, librdkafka's default partitioner does not), so a key written by clients that
disagree sits in two; the record with the newest timestamp over the partitions wins. Kafka offsets as a Kafka reader sees them:
on a topic with dense offsets a tail record's is counted from where the prefix's manifest says the
tail starts (0 before a first compaction, while notification 0 is kept), -1 (unknown) when the
lookup did not read every tail notification.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memq.compaction.manifest import Manifest, ManifestCache, ManifestPointers
from memq.compaction.parts import Survivor, plain_survivors
from memq.compaction.read import PartReader
from memq.errors import ConsumerError
from memq.kafka_api.offsets import first_offset
from memq.kafka_api.dense import Checkpoint, PartitionBases
from memq.log.model import PartitionLog
from memq.notify import NotificationConsumer, NotificationRecord
from memq.storage import ObjectLocation

from .consumer_record import batch_pointer
from .reader import FetchLoop, verify

#: Plain-tail notifications `get` reads per partition at most before the compacted parts.
MAX_TAIL_NOTES = 1000


@dataclass(frozen=True, slots=True)
class KeyValue:
    """A key's latest record: `value` None when it was deleted (a tombstone not yet dropped)."""

    key: bytes
    value: bytes | None
    timestamp_ms: int
    partition: int
    offset: int                    # its Kafka offset
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def deleted(self) -> bool:
        return self.value is None


@dataclass(frozen=True, slots=True)
class _Partition:
    """What a lookup reads of one partition: its manifest and tail notifications (newest last),
    `whole` unless the tail is longer than the bound."""

    partition: int
    manifest: Manifest | None
    tail: Sequence[NotificationRecord]
    whole: bool
    bases: PartitionBases | None = None   # a dense topic's tail offsets, when countable


class KeyLookup:
    """Looks keys up in one topic: `notes` reads its notification topic (assigned, no group),
    `fetch` GETs objects, `pointers` names the compacted prefixes (None: no ZooKeeper, the tail alone)."""

    def __init__(self, topic: str, read_partitions: int, notes: NotificationConsumer, fetch: FetchLoop,
                 pointers: ManifestPointers | None, *, max_tail_notes: int = MAX_TAIL_NOTES, dense: bool = False) -> None:
        self.topic = topic
        self._dense = dense
        self._partitions = read_partitions
        self._notes = notes
        self._fetch = fetch
        self._pointers = pointers
        self._max_tail = max_tail_notes
        self._manifests = ManifestCache(fetch)
        self._parts = PartReader(fetch)

    def close(self) -> None:
        self._notes.close()

    def get(self, key: bytes, timeout_s: float = 10.0) -> KeyValue | None:
        """The key's latest record (a tombstone: `deleted`), None when no record has the key."""
        partitions = [self._partition(p, timeout_s) for p in range(self._partitions)]
        found = [f for p in partitions if (f := self._fetch.run(self._find(p, key), timeout_s)) is not None]
        return max(found, key=lambda f: (f.timestamp_ms, f.offset), default=None)

    def _partition(self, partition: int, timeout_s: float) -> _Partition:
        pointer = None if self._pointers is None else self._pointers.get(self.topic, partition)
        manifest = None if pointer is None else self._fetch.run(self._manifests.load(pointer), timeout_s)
        low, high = self._notes.watermarks(partition)
        end = PartitionLog(manifest, low=low, high=high).tail_note
        start = max(end, high - self._max_tail)
        tail = self._read_notes(partition, start, high, timeout_s) if start < high else []
        bases = None
        if self._dense and start == end and (manifest is not None or end == 0):
            bases = PartitionBases(Checkpoint(end, manifest.tail_offset if manifest is not None else 0))
            bases.add((r.offset, r.notification.logmessage_count) for r in tail)
        return _Partition(partition, manifest, tail, start == end, bases)

    def _read_notes(self, partition: int, start: int, high: int, timeout_s: float) -> list[NotificationRecord]:
        self._notes.assign({partition: start})
        out: list[NotificationRecord] = []
        at = start
        try:
            for _ in range(max(1, int(timeout_s / 0.2))):
                for r in self._notes.poll(0.2):
                    if r.partition == partition and at <= r.offset < high:
                        out.append(r)
                        at = r.offset + 1
                if at >= high:
                    return out
        finally:
            self._notes.unassign()
        raise ConsumerError(f"topic {self.topic} read partition {partition}: notifications {at}..{high - 1} "
                            f"not read within {timeout_s:g} s")

    async def _find(self, p: _Partition, key: bytes) -> KeyValue | None:
        for rec in reversed(p.tail):
            first = (-1 if p.bases is None else p.bases.base(rec.offset)) if self._dense else first_offset(rec.offset)
            hit = await self._in_plain(rec, key, first)
            if hit is not None:
                return _value(p.partition, hit if first >= 0 else hit._replace(offset=-1))
        if not p.whole:
            raise ConsumerError(f"topic {self.topic} read partition {p.partition}: key not in the newest "
                                f"{len(p.tail)} notifications of its plain tail, which is longer (compaction is "
                                "behind): not answered from older data")
        if p.manifest is None:
            return None
        hit = await self._parts.get(p.manifest, key)
        return None if hit is None else _value(p.partition, hit)

    async def _in_plain(self, rec: NotificationRecord, key: bytes, first: int) -> Survivor | None:
        ptr = batch_pointer(self.topic, rec)
        n = rec.notification
        obj = await self._fetch.get_range(ObjectLocation(n.bucket, n.key), n.offset, n.size)
        verify(ptr, obj)
        found = None
        for s in await self._fetch.cpu(plain_survivors, first, obj):
            if s.key == key:
                found = s
        return found


def _value(partition: int, s: Survivor) -> KeyValue:
    return KeyValue(s.key, s.value, s.timestamp_ms, partition, s.offset, s.headers)

