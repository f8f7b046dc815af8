"""The table a memq topic reads as: Spark's Kafka source schema, adapted to batches on S3."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from memq.errors import ConfigError
from memq.format import MessageHeader
from memq.format.batch import MAX_PART_LOGMESSAGES, PART_RECORD_BITS
from memq.format.columns import Columns, concat_column

SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),   # read partition; null in s3list mode
    StructField("offset", LongType()),         # notification offset (dense topics: the record's); null in s3list
    StructField("index", IntegerType()),       # position of the LogMessage in its batch
    StructField("timestamp", TimestampType()),
    StructField("headers", ArrayType(StructType([
        StructField("key", StringType()),
        StructField("value", BinaryType()),
    ]))),
    StructField("bucket", StringType()),
    StructField("objectKey", StringType()),
    StructField("producerId", LongType()),     # the u64 id's bits as a signed 64-bit value
    StructField("producerEpoch", LongType()),
    StructField("sequence", LongType()),       # the Message's sequence (u64 bits, signed)
    StructField("messageIndex", IntegerType()),  # position of the LogMessage in its Message
])
# A LogMessage's identity across copies of its Message (a producer's retry stored twice).
MESSAGE_ID_COLUMNS = ("producerId", "producerEpoch", "sequence", "messageIndex")
# Spark checks read()'s RecordBatches against exactly this Arrow schema.
ARROW_SCHEMA: pa.Schema = to_arrow_schema(SCHEMA, timezone="UTC")
_HEADER_TYPE = ARROW_SCHEMA.field("headers").type
# A LogMessage's fields as Arrow types.
_LOG_TYPES = {"value": pa.binary(), "key": pa.binary(), "headers": _HEADER_TYPE, "timestamp_ms": pa.int64()}
# The LogMessage field each column is built from (the other columns come from headers and the object).
_LOG_FIELD = {"key": "key", "value": "value", "timestamp": "timestamp_ms", "headers": "headers"}


@dataclass(frozen=True, slots=True)
class BatchContext:
    """The per-object columns: where the batch came from. A compacted part's rows each have
    their own `offset` and `index`: those of their original Kafka offset (`kafka_offsets`; on a
    dense topic, `dense`, the offset itself, the index its place among the part's survivors). On a
    dense topic a plain batch's row's `offset` is its record offset, `base` + its index."""

    topic: str
    partition: int | None
    offset: int | None
    bucket: str
    key: str
    kafka_offsets: np.ndarray | None = None
    base: int | None = None
    dense: bool = False


def log_fields(schema: pa.Schema, timed: bool) -> frozenset[str]:
    """The LogMessage fields `to_record_batch` reads for `schema` (and timestamps to cut rows
    by time when `timed`): the only ones a decoder need convert."""
    return frozenset(_LOG_FIELD[n] for n in schema.names if n in _LOG_FIELD) | (
        {"timestamp_ms"} if timed else frozenset())


# Typed reads (valueFormat=registry): `value` is the read schema's struct, and these columns follow.
TYPED_EXTRA = (("valueSchemaId", pa.int32()), ("valueError", pa.string()), ("rawValue", pa.binary()))


def typed_schema(value: pa.StructType) -> StructType:
    """The source's schema for a typed read whose values are `value`."""
    fields = [pa.field(f.name, value) if f.name == "value" else f for f in ARROW_SCHEMA]
    return from_arrow_schema(pa.schema(fields + [pa.field(n, t) for n, t in TYPED_EXTRA]))


def projection(schema: StructType, base: StructType = SCHEMA) -> pa.Schema:
    """The Arrow schema for a user-given read schema: a subset of `base`'s columns (any order),
    each with its type there; anything else is a ConfigError naming the column."""
    known = {f.name: f for f in base.fields}
    for f in schema.fields:
        if f.name not in known:
            raise ConfigError(f"memq source: schema column {f.name!r} is not one of {', '.join(known)}")
        if f.dataType != known[f.name].dataType:
            raise ConfigError(f"memq source: schema column {f.name!r} is {f.dataType.simpleString()}, "
                              f"the source gives {known[f.name].dataType.simpleString()}")
    return to_arrow_schema(StructType([known[f.name] for f in schema.fields]), timezone="UTC")


class _LogColumns:
    """Arrow columns of LogMessage fields over an object's Messages, each built on first use
    (`Columns` converts a field only when asked): a query converts only the fields it reads
    (a msgpack body's headers, lists of tuples, cost as much as the other fields together)."""

    def __init__(self, messages: Sequence[tuple[MessageHeader, Columns]]) -> None:
        self._messages = messages
        self._built: dict[str, pa.Array] = {}

    def __call__(self, field: str) -> pa.Array:
        if field not in self._built:
            self._built[field] = _as(concat_column([cols for _, cols in self._messages], field), _LOG_TYPES[field])
        return self._built[field]


def _as(array: pa.Array, typ: pa.DataType) -> pa.Array:
    return array if array.type == typ else array.cast(typ)


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= (1 << 63) else value


def to_record_batch(ctx: BatchContext, messages: Sequence[tuple[MessageHeader, Columns]],
                    start_ms: int | None = None, end_ms: int | None = None,
                    keep: Sequence[bool] | None = None, schema: pa.Schema = ARROW_SCHEMA,
                    rows: np.ndarray | None = None) -> pa.RecordBatch:
    """Columns for one batch object; `messages` = (header, its columns) per Message. Only the
    columns of `schema` (a projection of ARROW_SCHEMA) are built: what Spark does not ask for
    it need not convert, which is most of a read's time.

    Rows outside [start_ms, end_ms) (message timestamp) are dropped, the rows of Messages
    whose `keep` is False (duplicates), and those `rows` (a mask, if given) rules out; `index`
    stays the LogMessage's place in the object.
    """
    n = sum(len(msgs) for _, msgs in messages)
    log_column = _LogColumns(messages)
    counts = np.array([len(msgs) for _, msgs in messages], dtype=np.int32)
    build: dict[str, Callable[[], pa.Array]] = {
        "key": lambda: log_column("key"),
        "value": lambda: log_column("value"),
        "topic": lambda: pa.repeat(ctx.topic, n),
        "partition": lambda: pa.nulls(n, pa.int32()) if ctx.partition is None
        else pa.array(np.full(n, ctx.partition, np.int32)),
        "offset": lambda: pa.nulls(n, pa.int64()) if ctx.offset is None else pa.array(
            (ctx.kafka_offsets if ctx.dense else ctx.kafka_offsets >> PART_RECORD_BITS) if ctx.kafka_offsets is not None
            else np.full(n, ctx.offset, np.int64) if ctx.base is None else ctx.base + np.arange(n, dtype=np.int64)),
        "index": lambda: pa.array(np.arange(n, dtype=np.int32) if ctx.kafka_offsets is None or ctx.dense
                                  else (ctx.kafka_offsets & (MAX_PART_LOGMESSAGES - 1)).astype(np.int32)),
        "timestamp": lambda: pc.multiply(log_column("timestamp_ms"), 1000).cast(ARROW_SCHEMA.field("timestamp").type),
        "headers": lambda: log_column("headers"),
        "bucket": lambda: pa.repeat(ctx.bucket, n),
        "objectKey": lambda: pa.repeat(ctx.key, n),
        "producerId": lambda: pa.array(np.repeat(np.array([_signed64(h.producer_id) for h, _ in messages],
                                                          dtype=np.int64), counts)),
        "producerEpoch": lambda: pa.array(np.repeat(np.array([h.epoch for h, _ in messages], dtype=np.int64), counts)),
        "sequence": lambda: pa.array(np.repeat(np.array([_signed64(h.sequence) for h, _ in messages],
                                                        dtype=np.int64), counts)),
        "messageIndex": lambda: pa.array(np.arange(n, dtype=np.int32)
                                         - np.repeat(np.cumsum(counts, dtype=np.int32) - counts, counts)),
    }
    columns = [build[f.name]() for f in schema]
    batch = pa.RecordBatch.from_arrays(columns, schema=schema)
    mask = None if keep is None or all(keep) else pa.array(np.repeat(np.array(keep, dtype=bool), counts))
    if rows is not None and not rows.all():
        mask = pa.array(rows) if mask is None else pc.and_(mask, pa.array(rows))
    if start_ms is not None or end_ms is not None:
        ts_ms = log_column("timestamp_ms")
        in_time = pc.and_(pc.greater_equal(ts_ms, start_ms if start_ms is not None else np.iinfo(np.int64).min),
                          pc.less(ts_ms, end_ms if end_ms is not None else np.iinfo(np.int64).max))
        mask = in_time if mask is None else pc.and_(mask, in_time)
    return batch if mask is None else batch.filter(mask)
