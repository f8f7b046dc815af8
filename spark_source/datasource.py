"""The "memq" DataSource: batch and streaming reads of a memq topic, and writes into memq."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Iterable, Iterator, List

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from memq.client.dense_offsets import CountedOffsets
from memq.compaction.manifest import Manifest
from spark_source.compacted import Prefixes, read_ranges
from spark_source.dense import dense_ranges, driver_offsets, first_offsets, record_offsets
from spark_source.options import EARLIEST, LATEST, OffsetSpec, SourceOptions, parse_options
from spark_source.plan import OPEN_END, Bounds, MemqPartition, NotificationLog, list_objects, plan_tasks, split
from spark_source.read import read_partition
from spark_source.schema import SCHEMA, projection, typed_schema
from spark_source.write import MemqStreamWriter, MemqWriter, parse_sink_options

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


class MemqDataSource(DataSource):
    """`spark.read.format("memq")` / `spark.readStream.format("memq")`; options in docs/guides/spark.md."""

    @classmethod
    def name(cls) -> str:
        return "memq"

    def schema(self) -> StructType:
        typed = self._parsed().typed
        return SCHEMA if typed is None else typed_schema(typed.arrow())

    def _parsed(self) -> SourceOptions:
        """The options, parsed once: a typed read's schema is asked of the registry once, so the
        schema Spark plans with is the one the executors decode into."""
        parsed = getattr(self, "_opts", None)
        if parsed is None:
            parsed = self._opts = parse_options(self.options)
        return parsed

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = _projected(self._parsed(), schema)
        return MemqPushdownReader(opts) if opts.push_filters else MemqBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MemqStreamReader(_projected(self._parsed(), schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return MemqWriter(parse_sink_options(self.options, schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return MemqStreamWriter(parse_sink_options(self.options, schema, overwrite))


def _projected(opts: SourceOptions, schema: StructType) -> SourceOptions:
    """`.schema("key binary, value binary, timestamp timestamp")` reads only those columns."""
    base = SCHEMA if opts.typed is None else typed_schema(opts.typed.arrow())
    return dataclasses.replace(opts, columns=tuple(projection(schema, base).names))


class MemqBatchReader(DataSourceReader):
    """Reads [startingOffsets, endingOffsets) and [startingTimestamp, endingTimestamp)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.bounds = Bounds(start_ms=opts.starting_timestamp_ms, end_ms=opts.ending_timestamp_ms)

    def partitions(self) -> List[InputPartition]:
        opts, bounds = self.opts, self.bounds
        if opts.mode == "s3list":
            refs = list_objects(opts, bounds.start_ms, bounds.end_ms)
            return list(split([refs], opts.min_partitions))
        nlog = NotificationLog(opts)
        prefixes = Prefixes(opts)
        dense = driver_offsets(opts)
        try:
            lows = nlog.lows()
            wanted = [p for p in lows if bounds.partitions is None or p in bounds.partitions]
            manifests = prefixes.manifests(wanted)
            ranges: dict[int, tuple[int, int | None]] = {}
            for p, low in first_offsets(dense, {p: lows[p] for p in wanted}, manifests).items():
                # resolved against an open end: "latest" (or past it) reads to the end the read finds
                start = opts.starting.resolve(p, low, OPEN_END, default=EARLIEST) if opts.starting else low
                end = opts.ending.resolve(p, low, OPEN_END, default=LATEST)
                if bounds.min_offset is not None:
                    start = max(start, bounds.min_offset)
                if bounds.max_offset is not None:
                    end = min(end, bounds.max_offset + 1)
                if start < min(end, OPEN_END):
                    ranges[p] = (start, None if end >= OPEN_END else end)
            groups = (read_ranges(nlog, ranges, lows, manifests) if dense is None
                      else dense_ranges(nlog, dense, ranges, lows, manifests))
        finally:
            prefixes.close()
            nlog.close()
        return list(plan_tasks(([r for r in g if bounds.keeps(r)] for _, g in sorted(groups.items())),
                               opts.min_partitions, opts.drop_duplicates))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, MemqPartition):   # Spark's stand-in when the plan has no partition
            return iter(())
        return read_partition(self.opts, partition.refs, self.bounds)


def _micros(value: object) -> int | None:
    """Spark's timestamp literal as microseconds since the epoch (naive = UTC)."""
    if not isinstance(value, dt.datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return (value - _EPOCH) // dt.timedelta(microseconds=1)


class MemqPushdownReader(MemqBatchReader):
    """Also takes Spark's filters on partition, offset and timestamp (exactly, so Spark drops them).

    Needs `spark.sql.python.filterPushdown.enabled=true`; `spark_source.register()` sets it.
    """

    def pushFilters(self, filters: List[Filter]) -> Iterable[Filter]:
        for f in filters:
            bounds = self._absorb(f)
            if bounds is None:
                yield f
            else:
                self.bounds = bounds

    def _absorb(self, f: Filter) -> Bounds | None:
        """Bounds narrowed by `f`, or None if `f` is not one memq applies exactly."""
        b = self.bounds
        column = f.attribute if isinstance(f, (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan,
                                                LessThanOrEqual, In)) else ()
        if column == ("partition",) and self.opts.mode == "notifications":
            if isinstance(f, EqualTo) and isinstance(f.value, int):
                wanted = {f.value}
            elif isinstance(f, In) and all(isinstance(v, int) for v in f.value):
                wanted = set(f.value)
            else:
                return None
            return dataclasses.replace(b, partitions=frozenset(wanted if b.partitions is None
                                                               else wanted & b.partitions))
        value = getattr(f, "value", None)   # every comparison Filter has one; Filter itself does not
        if column == ("offset",) and self.opts.mode == "notifications" and isinstance(value, int):
            lo, hi = {EqualTo: (value, value), GreaterThan: (value + 1, None),
                      GreaterThanOrEqual: (value, None), LessThan: (None, value - 1),
                      LessThanOrEqual: (None, value)}.get(type(f), (None, None))
            if lo is None and hi is None:
                return None
            return dataclasses.replace(
                b, min_offset=lo if b.min_offset is None else max(b.min_offset, lo if lo is not None else b.min_offset),
                max_offset=hi if b.max_offset is None else min(b.max_offset, hi if hi is not None else b.max_offset))
        if column == ("timestamp",) and (us := _micros(getattr(f, "value", None))) is not None:
            floor_ms, ceil_ms = us // 1000, -(-us // 1000)   # rows are whole milliseconds
            start, end = {EqualTo: (ceil_ms, floor_ms + 1), GreaterThan: (floor_ms + 1, None),
                          GreaterThanOrEqual: (ceil_ms, None), LessThan: (None, ceil_ms),
                          LessThanOrEqual: (None, floor_ms + 1)}.get(type(f), (None, None))
            if start is None and end is None:
                return None
            return dataclasses.replace(
                b, start_ms=start if b.start_ms is None else max(b.start_ms, start if start is not None else b.start_ms),
                end_ms=end if b.end_ms is None else min(b.end_ms, end if end is not None else b.end_ms))
        return None


def rate_limit(start: dict[int, int], latest: dict[int, int], max_offsets: int) -> dict[int, int]:
    """At most `max_offsets` notifications past `start`, shared fairly across partitions."""
    avail = {p: latest[p] - start[p] for p in latest}
    end = dict(start)
    left = max_offsets
    for i, p in enumerate(sorted(avail, key=lambda q: (avail[q], q))):
        take = min(avail[p], left // (len(avail) - i))
        end[p] = start[p] + take
        left -= take
    return end


class MemqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are `{"<read partition>": next notification offset}`, on a dense topic
    `{"<partition>": next record offset}` (Kafka's).

    `maxOffsetsPerTrigger` caps the notifications (= batch objects, not messages) per
    micro-batch, on a dense topic the records (as Kafka's source does). Kafka and brokers are
    only asked on the driver, lazily: Spark also pickles this reader to executors, which only
    call `read`.
    """

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._nlog: NotificationLog | None = None
        self._prefixes: Prefixes | None = None
        self._target: dict[int, int] | None = None
        self._dense: CountedOffsets | None = None

    @property
    def dense(self) -> CountedOffsets | None:
        """A dense topic's counted offsets (None: sparse)."""
        if self._dense is None:
            self._dense = driver_offsets(self.opts)
        return self._dense

    @property
    def nlog(self) -> NotificationLog:
        if self._nlog is None:
            self._nlog = NotificationLog(self.opts)
        return self._nlog

    @property
    def prefixes(self) -> Prefixes:
        if self._prefixes is None:
            self._prefixes = Prefixes(self.opts)
        return self._prefixes

    def _lows(self) -> tuple[dict[int, int], dict[int, Manifest]]:
        """Each partition's first kept notification, and its compacted prefix's manifest if any."""
        lows = self.nlog.lows()
        return lows, self.prefixes.manifests(list(lows))

    def initialOffset(self) -> dict:
        marks = self.nlog.watermarks()
        if self.opts.starting is None and self.opts.starting_timestamp_ms is not None:
            found = self.nlog.offsets_for_times(self.opts.starting_timestamp_ms)
            notes = {p: found.get(p, high) if found.get(p, -1) >= 0 else high for p, (_, high) in marks.items()}
            return {str(p): o for p, o in record_offsets(self.dense, notes).items()}
        spec = self.opts.starting or OffsetSpec("latest")
        starts = first_offsets(self.dense, {p: low for p, (low, _) in marks.items()},
                               self.prefixes.manifests(list(marks)))
        highs = record_offsets(self.dense, {p: high for p, (_, high) in marks.items()})
        return {str(p): spec.resolve(p, starts[p], highs[p], default=EARLIEST) for p in marks}

    def _latest(self) -> dict[int, int]:
        return record_offsets(self.dense, self.nlog.highs())

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        latest = self._target if self._target is not None else self._latest()
        lows = first_offsets(self.dense, *self._lows()) if set(map(str, latest)) - set(start) else {}
        begin = {p: int(start[str(p)]) if str(p) in start else lows[p] for p in latest}
        latest = {p: max(latest[p], begin[p]) for p in latest}
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(begin, latest, limit.max_rows)
        return {str(p): o for p, o in sorted(latest.items())}

    def reportLatestOffset(self) -> dict:
        return {str(p): o for p, o in sorted(self._latest().items())}

    def partitions(self, start: dict, end: dict) -> List[InputPartition]:
        lows, manifests = self._lows()
        ranges: dict[int, tuple[int, int | None]] = {}
        for key, stop in end.items():
            p = int(key)
            begin = int(start[key]) if key in start else first_offsets(self.dense, {p: lows.get(p, 0)}, manifests)[p]
            if begin < stop:
                ranges[p] = (begin, int(stop))
        kept = {p: lows.get(p, 0) for p in ranges}
        groups = (read_ranges(self.nlog, ranges, kept, manifests, exact=True) if self.dense is None
                  else dense_ranges(self.nlog, self.dense, ranges, kept, manifests, exact=True))
        return list(plan_tasks((g for _, g in sorted(groups.items())), self.opts.min_partitions,
                               self.opts.drop_duplicates))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, MemqPartition):   # as the batch reader's
            return iter(())
        return read_partition(self.opts, partition.refs, Bounds())

    def commit(self, end: dict) -> None:
        """Nothing to do: Spark's checkpoint holds the offsets; memq keeps no reader state."""

    def stop(self) -> None:
        if self._nlog is not None:
            self._nlog.close()
            self._nlog = None
        if self._prefixes is not None:
            self._prefixes.close()
            self._prefixes = None
