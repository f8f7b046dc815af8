"""Executor-side reading: batch objects through memq's one BatchReader, decoded straight to Arrow
columns (`memq.format.columns`: no LogMessage per record, whatever the codec)."""

from __future__ import annotations

import itertools
import logging
from functools import partial
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from memq.client.positions import SequenceTracker
from memq.client.reader import BatchPointer, BatchReader, DataLossPolicy, read_in_order
from memq.errors import StorageError
from memq.format import BatchHeader, MessageHeader
from memq.format.columns import Columns, decode_batch_columns
from spark_source.compacted import decode_part, part_rows
from spark_source.options import SourceOptions
from spark_source.plan import BatchRef, Bounds, describe_storage
from spark_source.schema import ARROW_SCHEMA, BatchContext, log_fields, to_record_batch, typed_schema
from spark_source.typed_rows import raw_columns, typed_batch

log = logging.getLogger("memq.spark")


def pointer(topic: str, ref: BatchRef) -> BatchPointer:
    """The reader's view of a planned batch: size always, CRC32C and position when notified."""
    return BatchPointer(topic, ref.location, ref.size, ref.crc32c, ref.partition, ref.offset, ref.start)


def _arrow(opts: SourceOptions, schema: pa.Schema, ref: BatchRef, bounds: Bounds, seen: SequenceTracker | None,
           decoded: tuple[BatchHeader, list[tuple[MessageHeader, Columns]]]) -> pa.RecordBatch | None:
    """The object's rows within `bounds`, without Messages `seen` before in this task; None if
    its header rules them all out. Runs in the reader's one CPU worker: `seen` needs no lock."""
    header, messages = decoded
    if (bounds.start_ms is not None and header.max_timestamp_ms < bounds.start_ms) or \
            (bounds.end_ms is not None and header.min_timestamp_ms >= bounds.end_ms):
        return None
    keep = None if seen is None else [not seen.seen(h.producer_id, h.epoch, h.sequence) for h, _ in messages]
    ctx = BatchContext(opts.topic, ref.partition, ref.offset, ref.location.bucket, ref.location.key, base=ref.base)
    rows = None
    if ref.base is not None and ref.span is not None:   # a dense range's first or last part: cut to its offsets
        offsets = ref.base + np.arange(sum(len(m) for _, m in messages), dtype=np.int64)
        rows = (offsets >= ref.span[0]) & (offsets < ref.span[1])
    if opts.typed is None:
        return to_record_batch(ctx, messages, bounds.start_ms, bounds.end_ms, keep, schema, rows)
    raw = to_record_batch(ctx, messages, bounds.start_ms, bounds.end_ms, keep, raw_columns(schema), rows)
    return typed_batch(opts, opts.typed, raw, schema)


def _part(opts: SourceOptions, schema: pa.Schema, ref: BatchRef, bounds: Bounds, decoded: Any) -> pa.RecordBatch:
    """A compacted part's rows (typed as `_arrow`'s when the read is)."""
    if opts.typed is None:
        return part_rows(opts, schema, ref, bounds.start_ms, bounds.end_ms, decoded)
    raw = part_rows(opts, raw_columns(schema), ref, bounds.start_ms, bounds.end_ms, decoded)
    return typed_batch(opts, opts.typed, raw, schema)


def _output_schema(opts: SourceOptions) -> pa.Schema:
    """The Arrow schema of the batches a read yields (Spark checks them against it)."""
    full = ARROW_SCHEMA if opts.typed is None else to_arrow_schema(typed_schema(opts.typed.arrow()), timezone="UTC")
    return pa.schema([full.field(c) for c in opts.columns]) if opts.columns else full


def data_loss_policy(opts: SourceOptions) -> DataLossPolicy:
    return DataLossPolicy(skip=not opts.fail_on_data_loss, logger=log,
                          hint="set failOnDataLoss=false to skip it")


def read_partition(opts: SourceOptions, refs: Sequence[BatchRef], bounds: Bounds) -> Iterator[pa.RecordBatch]:
    """RecordBatches of the rows of `refs` within `bounds`, one per object, in order.

    Objects are verified (size, and CRC32C when a notification names it) and decoded to
    Arrow in the reader's worker. A missing or corrupt object raises DataLossError, or is
    skipped with a warning on the `memq.spark` logger when failOnDataLoss=false. With
    dropDuplicates (the default) a Message seen before in this task is dropped (see plan.py
    for how copies are planned into one task). A compacted part (`BatchRef.kafka_range`) is
    read by a reader of its own (`compacted.decode_part`), made for the first one.
    """
    schema = _output_schema(opts)
    fields = log_fields(schema if opts.typed is None else raw_columns(schema),
                        timed=bounds.start_ms is not None or bounds.end_ms is not None)
    reader = BatchReader(opts.config, opts.fetch_concurrency, decode=partial(decode_batch_columns, fields=fields))
    parts: BatchReader | None = None
    cc = opts.config.consumer     # the de-duplication memory of a Consumer (consumer.dedup_*)
    seen = SequenceTracker(cc.dedup_max_producers, cc.dedup_window) if opts.drop_duplicates else None
    try:
        for compacted, run in itertools.groupby(refs, key=lambda r: r.kafka_range is not None):
            if compacted and parts is None:
                parts = BatchReader(opts.config, opts.fetch_concurrency, decode=decode_part)
            build: Callable[[BatchRef], Callable[[Any], pa.RecordBatch | None]] = (
                (lambda ref: partial(_part, opts, schema, ref, bounds)) if compacted
                else (lambda ref: partial(_arrow, opts, schema, ref, bounds, seen)))
            batches = ((pointer(opts.topic, ref), build(ref)) for ref in run)
            for batch in read_in_order(parts if compacted and parts is not None else reader, batches,
                                       opts.fetch_concurrency, data_loss_policy(opts)):
                if batch is not None and batch.num_rows:
                    yield batch
    except StorageError as e:   # not data loss: the store failed; never skipped
        raise type(e)(f"topic {opts.topic}: {describe_storage(opts)}: {e}") from e
    finally:
        if parts is not None:
            parts.close()
        reader.close()
