"""Driver-side planning: which batch objects a query reads, split into Spark InputPartitions.

Notifications are small (a pointer per batch object), so the driver reads the requested
notification ranges itself: that prunes objects by time before any task starts, and lets
tasks be balanced by object bytes rather than by offset counts.

De-duplication (option dropDuplicates, on by default). A producer's retry can be stored twice,
by two brokers, in two objects notified on any two read partitions; the copies are stored
close in time (within the producer's delivery timeout). So with dropDuplicates the planner
orders the objects of all read partitions by creation time and cuts that one sequence into
byte-balanced tasks (rather than a task per read partition), and each task drops a Message
(producer id, epoch, sequence) it saw before, in bounded memory (`SequenceTracker`, as the
Consumer). A read of up to MIN_TASK_BYTES is one task: every copy is caught. Larger reads
are spread over every core (`split`), and there, as across a stream's micro-batches, copies
on either side of a task boundary are not caught: rows carry MESSAGE_ID_COLUMNS for an exact `dropDuplicates(list(MESSAGE_ID_COLUMNS))`
(in a stream, `dropDuplicatesWithinWatermark`), which costs a shuffle. Notifications carry no
Message ids, so the driver cannot do better without reading the objects.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
import uuid
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from pyspark.sql.datasource import InputPartition

from memq.client.reader import DataLossPolicy, notifications_expired
from memq.errors import NotifyError, StorageError, UnknownTopicError
from memq.notify import NotificationConsumer, NotificationRecord
from memq.storage import ObjectLocation, make_storage
from spark_source.options import SourceOptions

log = logging.getLogger("memq.spark")

TARGET_PARTITION_BYTES = 128 * 1024 * 1024  # like spark.sql.files.maxPartitionBytes
# A task's own start (S3 client, fetch thread) is worth ~this many bytes of reading; it also
# keeps reads up to this size one task, where de-duplication catches every copy.
MIN_TASK_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class BatchRef:
    """One batch object to read, and where it sits in the notification log (None in s3list mode)."""

    partition: int | None
    offset: int | None
    location: ObjectLocation
    size: int
    min_timestamp_ms: int | None = None
    max_timestamp_ms: int | None = None
    crc32c: int | None = None
    created_ms: int = 0         # when the broker created the batch (0 if unknown: s3list)
    start: int = 0              # where the batch starts in its object (a part of a shared object)
    kafka_range: tuple[int, int] | None = None   # a compacted part: its survivors of Kafka offsets [lo, hi)
    records: int = 0            # the records the notification counts
    base: int | None = None     # a dense topic: the offset of the batch's record 0 (rows: base + index)
    span: tuple[int, int] | None = None   # a dense topic: the record offsets [lo, hi) its rows are cut to

    @property
    def offsets(self) -> tuple[int, int] | None:
        """The first and last `offset` column value of its rows (None in s3list mode; a dense
        compacted part, with a span and no base: its span's)."""
        if self.offset is None:
            return None
        if self.base is None:
            return (self.offset, self.offset) if self.span is None else (self.span[0], self.span[1] - 1)
        return (self.base, self.base + self.records - 1)


@dataclass(frozen=True)
class Bounds:
    """Row bounds from options and pushed-down filters; offsets inclusive, timestamps [start, end)."""

    partitions: frozenset[int] | None = None
    min_offset: int | None = None
    max_offset: int | None = None
    start_ms: int | None = None
    end_ms: int | None = None

    def keeps(self, ref: BatchRef) -> bool:
        """False only if no row of `ref` can be within the bounds."""
        if ref.partition is not None:
            if self.partitions is not None and ref.partition not in self.partitions:
                return False
            offsets = ref.offsets
            if self.min_offset is not None and offsets is not None and offsets[1] < self.min_offset:
                return False
            if self.max_offset is not None and offsets is not None and offsets[0] > self.max_offset:
                return False
        if self.start_ms is not None and ref.max_timestamp_ms is not None and ref.max_timestamp_ms < self.start_ms:
            return False
        if self.end_ms is not None and ref.min_timestamp_ms is not None and ref.min_timestamp_ms >= self.end_ms:
            return False
        return True


class MemqPartition(InputPartition):
    """A Spark task's share: batch objects read in order."""

    def __init__(self, refs: Sequence[BatchRef]) -> None:
        super().__init__(len(refs))
        self.refs = tuple(refs)


def split(groups: Iterable[Sequence[BatchRef]], min_partitions: int | None,
          cores: int | None = None) -> list[MemqPartition]:
    """Cut each group (one read partition's range) into contiguous chunks of similar bytes.

    The read is shared out by bytes into a task per core (`cores`, else this machine's CPU
    count: Spark's own count is not visible to a Python data source) as long as each keeps
    MIN_TASK_BYTES, more when a task would exceed TARGET_PARTITION_BYTES, at least
    `minPartitions`, and at least one per group.
    """
    groups = [list(g) for g in groups if g]
    total = sum(r.size for g in groups for r in g) or 1
    slots = cores or os.cpu_count() or 1
    want = max(math.ceil(total / TARGET_PARTITION_BYTES), min(slots, math.ceil(total / MIN_TASK_BYTES)),
               min_partitions or 1)
    out: list[MemqPartition] = []
    for g in groups:
        size = sum(r.size for r in g)
        n = max(math.ceil(size / TARGET_PARTITION_BYTES), round(want * size / total))
        out.extend(_cut(g, max(1, min(n, len(g)))))
    return out


def plan_tasks(groups: Iterable[Sequence[BatchRef]], min_partitions: int | None,
               drop_duplicates: bool, cores: int | None = None) -> list[MemqPartition]:
    """Tasks for the groups (one per read partition): `split` as they are, or, to de-duplicate,
    as one sequence in creation order, so the copies of a retried Message meet in one task. A
    part notified twice (a broker publishes a notification again when the first one's delivery
    was unknown: both may land) is read once."""
    if not drop_duplicates:
        return split(groups, min_partitions, cores)
    merged = sorted((r for g in groups for r in g), key=lambda r: (r.created_ms, r.partition or 0, r.offset or 0))
    parts: set[tuple[ObjectLocation, int]] = set()
    unique: list[BatchRef] = []
    for r in merged:
        if (r.location, r.start) not in parts:
            parts.add((r.location, r.start))
            unique.append(r)
    return split([unique], min_partitions, cores)


def _cut(refs: Sequence[BatchRef], n: int) -> list[MemqPartition]:
    """`n` contiguous chunks of `refs` with roughly equal bytes."""
    size = sum(r.size for r in refs)
    chunks: list[MemqPartition] = []
    current: list[BatchRef] = []
    acc = 0
    for r in refs:
        current.append(r)
        acc += r.size
        if len(chunks) < n - 1 and acc >= size * (len(chunks) + 1) / n:
            chunks.append(MemqPartition(current))
            current = []
    if current:
        chunks.append(MemqPartition(current))
    return chunks


# An offset at or past the end of any partition: an `OffsetSpec` resolved against it names
# "the end" (latest) without asking Kafka where the end is.
OPEN_END = (1 << 63) - 1


class NotificationLog:
    """The notification topic seen from the driver: bounds per partition and range reads.

    One consumer does it all, in a few round trips whatever the partition count: the first
    offsets in one ListOffsets request, and the ends by fetching each partition to its end in
    one pass (tansu 0.6 answers "latest" short, see `NotificationConsumer.watermarks`; a fetch
    tells the true end). It fetches without long-polling (1 ms), and only during a pass.
    """

    def __init__(self, opts: SourceOptions, consumer: NotificationConsumer | None = None) -> None:
        self.opts = opts
        kafka = opts.config.kafka
        self.timeout_s = kafka.request_timeout_ms / 1000
        try:
            self.consumer = consumer or NotificationConsumer(
                kafka, opts.notification_topic, group_id=f"memq-spark-{uuid.uuid4().hex}",
                fetch_wait_ms=1, partition_eof=True)   # 0: tansu 0.6 never answers
            try:
                self.num_partitions = len(self.consumer.partitions())
            except BaseException:
                self.consumer.close()
                raise
        except UnknownTopicError as e:
            raise UnknownTopicError(f"topic {opts.topic}: no notification topic {opts.notification_topic} "
                                    f"on Kafka {kafka.bootstrap_servers} ({e})") from e
        except NotifyError as e:
            raise NotifyError(f"topic {opts.topic}: Kafka {kafka.bootstrap_servers} failed: {e}") from e

    def partitions(self) -> list[int]:
        return list(range(self.num_partitions))

    def lows(self) -> dict[int, int]:
        """The first retained notification offset of each partition."""
        return self.consumer.list_offsets(self.partitions())

    def highs(self) -> dict[int, int]:
        """The next notification offset of each partition (where the log ends now)."""
        tails = self.consumer.list_offsets(self.partitions(), latest=True)
        return self._scan(tails, dict.fromkeys(tails))[1]

    def watermarks(self) -> dict[int, tuple[int, int]]:
        lows, highs = self.lows(), self.highs()
        return {p: (lows[p], highs[p]) for p in lows}

    def offsets_for_times(self, ts_ms: int) -> dict[int, int]:
        return self.consumer.offsets_for_times(ts_ms)

    def check_start(self, partition: int, start: int, low: int) -> int:
        """Where reading `partition` can start: `low` if `start` expired (or fail on data loss)."""
        if start >= low:
            return start
        DataLossPolicy(skip=not self.opts.fail_on_data_loss, logger=log,
                       hint="set failOnDataLoss=false to skip them").handle(
            notifications_expired(self.opts.topic, self.opts.notification_topic, partition, start, low))
        return low

    def read(self, ranges: Mapping[int, tuple[int, int | None]], *, exact: bool = False) -> dict[int, list[BatchRef]]:
        """The batch objects named by notifications [start, end) of each partition, `start` at
        or after the partition's first offset. The end is at most where the partition ends when
        the read gets there (None: there, a snapshot); with `exact`, ending before it is an error."""
        todo = {p: (s, e) for p, (s, e) in ranges.items() if e is None or e > s}
        out: dict[int, list[BatchRef]] = {p: [] for p in ranges}
        if not todo:
            return out
        # a fetch past the end gets no answer (tansu), so a start past the broker's "latest"
        # is fetched from there: at most its last record batch more
        tails = self.consumer.list_offsets(todo, latest=True)
        records, ends = self._scan({p: min(s, tails[p]) for p, (s, _) in todo.items()},
                                   {p: e for p, (_, e) in todo.items()})
        short = {p: (ends[p], e) for p, (_, e) in todo.items() if exact and e is not None and ends[p] < e}
        if short:
            raise NotifyError(f"topic {self.opts.topic}: {self.opts.notification_topic} ends before the "
                              f"planned offsets (partition: (end, planned) {short}): was it recreated?")
        for p, (start, _) in todo.items():
            out[p] = [_batch_ref(r) for r in records[p] if r.offset >= start]
        return out

    def _scan(self, begins: dict[int, int],
              stops: dict[int, int | None]) -> tuple[dict[int, list[NotificationRecord]], dict[int, int]]:
        """Fetch each partition from `begins[p]` up to `stops[p]` or its end, whichever comes
        first (None: its end, as the first fetch there finds it). Returns the records read and
        where each partition's read ended."""
        stops = dict(stops)
        records: dict[int, list[NotificationRecord]] = {p: [] for p in begins}
        at = dict(begins)     # next offset to read

        def left() -> list[int]:
            return [p for p, stop in stops.items() if stop is None or at[p] < stop]

        self.consumer.assign(begins)
        try:
            deadline = time.monotonic() + self.timeout_s
            while todo := left():
                wanted = min(10_000, sum(10_000 if (stop := stops[p]) is None else stop - at[p] for p in todo))
                got = self.consumer.poll(min(1.0, self.timeout_s), wanted)
                for p, end in self.consumer.ends_reached().items():   # before the records: one may be past it
                    stops[p] = end if (stop := stops[p]) is None else min(stop, end)
                for r in got:
                    stop = stops.get(r.partition)
                    if stop is None or r.offset < stop:
                        at[r.partition] = r.offset + 1
                        records[r.partition].append(r)
                for p, position in self.consumer.position(todo).items():
                    at[p] = max(at[p], position or 0)
                if got:
                    deadline = time.monotonic() + self.timeout_s
                elif time.monotonic() > deadline and (todo := left()):
                    raise NotifyError(f"topic {self.opts.topic}: no notifications from "
                                      f"{self.opts.notification_topic} partitions {todo} within "
                                      f"{self.timeout_s:.0f}s (kafka.request.timeout.ms)")
        finally:
            self.consumer.unassign()
        return records, {p: min(at[p], stop) for p, stop in stops.items() if stop is not None}

    def close(self) -> None:
        self.consumer.close()


def _batch_ref(rec: NotificationRecord) -> BatchRef:
    n = rec.notification
    return BatchRef(rec.partition, rec.offset, ObjectLocation(n.bucket, n.key), n.size, n.min_timestamp_ms,
                    n.max_timestamp_ms, n.crc32c, n.created_ms, n.offset, records=n.logmessage_count)


def list_objects(opts: SourceOptions, start_ms: int | None, end_ms: int | None) -> list[BatchRef]:
    """s3list mode: the topic's objects with a key time near [start_ms, end_ms), oldest first.

    Key times are when the broker stored the batch, so the range is widened by
    `s3list.slackMs`; rows are cut to the exact range when read.
    """
    lo = 0 if start_ms is None else max(0, start_ms - opts.s3list_slack_ms)
    hi = (1 << 62) if end_ms is None else end_ms + opts.s3list_slack_ms

    async def run() -> list:
        storage = make_storage(opts.config)
        try:
            return await storage.list_topic(opts.topic, lo, hi)
        finally:
            await storage.close()

    try:
        infos = asyncio.run(run())
    except StorageError as e:
        raise StorageError(f"topic {opts.topic}: listing {describe_storage(opts)} failed: {e}") from e
    return [BatchRef(None, None, info.location, info.size) for info in infos]


def describe_storage(opts: SourceOptions) -> str:
    """Where batches live, for error messages."""
    if opts.config.storage.kind == "file":
        return f"directory {opts.config.storage.root_dir}"
    return f"S3 {opts.config.s3.endpoint_url or 'AWS'} bucket {opts.config.s3.bucket}"
