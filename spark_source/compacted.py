"""A compacted topic's prefix in the source's reads (`memq.compaction`).

A read partition of a compacted topic is its compacted prefix (notifications [0, end), held by
the parts its manifest lists) and the plain tail from notification `end`. The driver reads each
partition's manifest pointer in ZooKeeper (uncached: once per plan) and the manifest it names
(this is Spark's feed of the partition log model, `memq.log.model`); the model then turns a range
of notifications [start, stop) into its segments: the parts holding survivors of offsets
[start's first, min(stop, end)'s first) and, past `end`, the plain notifications. Reading from
earliest (the model's `start_note`) so gives each key's latest value plus the tail. On a dense
topic the range is of record offsets, entered by offset as a broker's Fetch does
(`spark_source.dense`). A part is decoded by compaction's one decoder
(`memq.compaction.parts.decode_part`), as memq's Consumer decodes it, and its survivors made
columns here. A survivor's row keeps the columns a plain read gives it: `offset` its notification
offset, `index` its place in that notification's part (both from its original Kafka offset; on a
dense topic `offset` is that record offset, `index` its place among the part's survivors), a
tombstone's `value` null.

Ranges read from different manifests (a stream's micro-batches while compaction runs) still
give every key's latest value: a key's latest record survives every later compaction.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Collection, Mapping, Sequence

import numpy as np
import pyarrow as pa

from memq.compaction.manifest import Manifest, ManifestCache, ManifestPointer, ManifestPointers
from memq.compaction import parts
from memq.compaction.parts import Survivor
from memq.format import BatchHeader, MessageHeader
from memq.format.codec import Compressors
from memq.governor.registry import Registry
from memq.log.model import PartitionLog, Segments
from memq.storage import make_storage
from spark_source.options import SourceOptions
from spark_source.plan import BatchRef, NotificationLog
from spark_source.schema import ARROW_SCHEMA, BatchContext, to_record_batch


class Prefixes:
    """The driver's view of a topic's compacted prefixes: ZooKeeper (connected on first use) and
    the manifests. Without ZooKeeper, or for a topic known not to compact, there are none."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._registry: Registry | None = None
        self._manifests: dict[str, Manifest] = {}     # the last plan's, by key: a stream plans again and again

    @property
    def enabled(self) -> bool:
        return self.opts.compacted is not False and self.opts.config.zookeeper.enabled

    def manifests(self, partitions: Collection[int]) -> dict[int, Manifest]:
        """The current manifest of each of `partitions` that has one."""
        if not self.enabled or not partitions:
            return {}
        if self._registry is None:
            self._registry = Registry(self.opts.config.zookeeper, self.opts.config.cluster.name).start()
        pointers = ManifestPointers(self._registry)
        found = {p: ptr for p in partitions if (ptr := pointers.read(self.opts.topic, p)) is not None}
        return asyncio.run(self._load(found)) if found else {}

    async def _load(self, pointers: Mapping[int, ManifestPointer]) -> dict[int, Manifest]:
        known = {p: self._manifests[ptr.key] for p, ptr in pointers.items() if ptr.key in self._manifests}
        if len(known) < len(pointers):
            storage = make_storage(self.opts.config)
            try:
                cache = ManifestCache(storage)
                known |= {p: await cache.load(ptr) for p, ptr in pointers.items() if p not in known}
            finally:
                await storage.close()
        self._manifests = {pointers[p].key: m for p, m in known.items()}
        return known

    def close(self) -> None:
        if self._registry is not None:
            self._registry.close()
            self._registry = None


def earliest(lows: Mapping[int, int], manifests: Mapping[int, Manifest]) -> dict[int, int]:
    """Where each partition's log starts, in notifications (the model's `start_note`): 0 where a
    compacted prefix holds what came before the first notification Kafka still keeps."""
    return {p: PartitionLog(manifests.get(p), low=low).start_note for p, low in lows.items()}


def prefix_refs(segments: Segments, partition: int, lo: int, hi: int | None = None, *,
                dense: bool = False) -> list[BatchRef]:
    """The compacted parts of `segments`, each to read its survivors of Kafka offsets [lo, hi)
    (hi None: its segment's stop); on a dense topic the same span is the rows' `offset` range."""
    refs = []
    for seg in segments.parts:
        stop = seg.stop if hi is None else min(seg.stop, hi)
        if seg.start < stop:
            refs.append(BatchRef(partition, seg.first_note, seg.part.location, seg.part.size, seg.part.min_timestamp_ms,
                                 seg.part.max_timestamp_ms, seg.part.crc32c, kafka_range=(lo, stop),
                                 span=(lo, stop) if dense else None))
    return refs


def part_refs(m: Manifest, partition: int, start: int, stop: int) -> list[BatchRef]:
    """The parts of `m` holding survivors of notifications [start, stop) (stop <= m.end), in order."""
    plog = PartitionLog(m)
    return prefix_refs(plog.segments_from_note(start, stop), partition, plog.scheme.start_of(start))


def read_ranges(nlog: NotificationLog, ranges: Mapping[int, tuple[int, int | None]], lows: Mapping[int, int],
                manifests: Mapping[int, Manifest], *, exact: bool = False) -> dict[int, list[BatchRef]]:
    """The batches of notifications [start, stop) of each partition (stop None: the end), as the
    partition log's segments: a compacted prefix's parts below its `end`, then the plain
    notifications, whose start is checked against the log's first notification (the first one
    Kafka keeps, `lows`; `NotificationLog.check_start`)."""
    prefix: dict[int, list[BatchRef]] = {}
    plain: dict[int, tuple[int, int | None]] = {}
    for p, (start, stop) in ranges.items():
        plog = PartitionLog(manifests.get(p), low=lows[p])
        segments = plog.segments_from_note(start, stop)
        if segments.in_prefix:
            prefix[p] = prefix_refs(segments, p, plog.scheme.start_of(start))
        if segments.tail is not None:
            plain[p] = (nlog.check_start(p, segments.tail.note, plog.first_note), stop)
    groups = nlog.read(plain, exact=exact)
    return {p: prefix.get(p, []) + groups.get(p, []) for p in ranges}


class SurvivorColumns:
    """One part Message's survivors as the LogMessage columns a row is built from (Arrow on
    first use), and their Kafka offsets."""

    def __init__(self, survivors: Sequence[Survivor]) -> None:
        self.survivors = survivors
        self.offsets = np.fromiter((s.offset for s in survivors), dtype=np.int64, count=len(survivors))

    def __len__(self) -> int:
        return len(self.survivors)

    def column(self, name: str) -> pa.Array:
        s = self.survivors
        if name == "key":
            return pa.array([r.key for r in s], pa.binary())
        if name == "value":
            return pa.array([r.value for r in s], pa.binary())
        if name == "timestamp_ms":
            return pa.array([r.timestamp_ms for r in s], pa.int64())
        if name == "headers":
            return pa.array([[{"key": k, "value": v} for k, v in r.headers] for r in s],
                            ARROW_SCHEMA.field("headers").type)
        raise KeyError(f"no column {name} in a compacted part")


def decode_part(obj: bytes, *, compressors: Compressors | None = None
                ) -> tuple[BatchHeader, list[tuple[MessageHeader, SurvivorColumns]]]:
    """A compacted part's Batch (verified by the reader) as columns per Message (`parts.decode_part`).
    Each Message's header takes its first survivor's Kafka offset as sequence: with the
    compactor's producer id, rows' MESSAGE_ID_COLUMNS then tell every survivor apart."""
    header, messages = parts.decode_part(obj)
    out = []
    for mh, survivors in messages:
        columns = SurvivorColumns(survivors)
        if len(columns):
            mh = dataclasses.replace(mh, sequence=int(columns.offsets[0]))
        out.append((mh, columns))
    return header, out


def part_rows(opts: SourceOptions, schema: pa.Schema, ref: BatchRef, start_ms: int | None, end_ms: int | None,
              decoded: tuple[BatchHeader, list[tuple[MessageHeader, SurvivorColumns]]]) -> pa.RecordBatch:
    """The part's rows of survivors within `ref.kafka_range` and [start_ms, end_ms)."""
    assert ref.kafka_range is not None
    _, messages = decoded
    lo, hi = ref.kafka_range
    offsets = np.concatenate([c.offsets for _, c in messages]) if messages else np.empty(0, np.int64)
    ctx = BatchContext(opts.topic, ref.partition, ref.offset, ref.location.bucket, ref.location.key, offsets,
                       dense=opts.dense)
    return to_record_batch(ctx, messages, start_ms, end_ms, schema=schema, rows=(offsets >= lo) & (offsets < hi))
