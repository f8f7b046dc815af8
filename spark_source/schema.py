"""The table a memq topic reads as: Spark's Kafka source schema, adapted to batches on S3."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
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

from memq.format import LogMessage

SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),   # read partition; null in s3list mode
    StructField("offset", LongType()),         # notification offset; null in s3list mode
    StructField("index", IntegerType()),       # position of the LogMessage in its batch
    StructField("timestamp", TimestampType()),
    StructField("headers", ArrayType(StructType([
        StructField("key", StringType()),
        StructField("value", BinaryType()),
    ]))),
    StructField("bucket", StringType()),
    StructField("objectKey", StringType()),
    StructField("producerId", LongType()),     # the u64 id's bits as a signed 64-bit value
])
# Spark checks read()'s RecordBatches against exactly this Arrow schema.
ARROW_SCHEMA: pa.Schema = to_arrow_schema(SCHEMA, timezone="UTC")
_HEADER_TYPE = ARROW_SCHEMA.field("headers").type


@dataclass(frozen=True, slots=True)
class BatchContext:
    """The per-object columns: where the batch came from."""

    topic: str
    partition: int | None
    offset: int | None
    bucket: str
    key: str


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= (1 << 63) else value


def to_record_batch(ctx: BatchContext, messages: Sequence[tuple[int, Sequence[LogMessage]]],
                    start_ms: int | None = None, end_ms: int | None = None) -> pa.RecordBatch:
    """Columns for one batch object; `messages` = (producer id, LogMessages) per Message.

    Rows outside [start_ms, end_ms) (message timestamp) are dropped.
    """
    logs = [m for _, msgs in messages for m in msgs]
    n = len(logs)
    values, keys, headers_per_row, stamps, _ = zip(*logs) if n else ((),) * 5
    producer_ids = np.repeat(np.array([_signed64(p) for p, _ in messages], dtype=np.int64),
                             [len(msgs) for _, msgs in messages])
    header_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, headers_per_row), dtype=np.int32, count=n), out=header_offsets[1:])
    flat = list(chain.from_iterable(headers_per_row))
    header_keys, header_values = zip(*flat) if flat else ((), ())
    headers = pa.ListArray.from_arrays(
        pa.array(header_offsets),
        pa.StructArray.from_arrays([pa.array(header_keys, pa.string()), pa.array(header_values, pa.binary())],
                                   fields=list(_HEADER_TYPE.value_type)),
        type=_HEADER_TYPE)
    ts_ms = np.fromiter(stamps, dtype=np.int64, count=n)
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.repeat(ctx.topic, n),
        pa.nulls(n, pa.int32()) if ctx.partition is None else pa.array(np.full(n, ctx.partition, np.int32)),
        pa.nulls(n, pa.int64()) if ctx.offset is None else pa.array(np.full(n, ctx.offset, np.int64)),
        pa.array(np.arange(n, dtype=np.int32)),
        pa.array(ts_ms * 1000, ARROW_SCHEMA.field("timestamp").type),
        headers,
        pa.repeat(ctx.bucket, n),
        pa.repeat(ctx.key, n),
        pa.array(producer_ids),
    ]
    batch = pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
    if start_ms is None and end_ms is None:
        return batch
    ts = pa.array(ts_ms)
    keep = pc.and_(pc.greater_equal(ts, start_ms if start_ms is not None else np.iinfo(np.int64).min),
                   pc.less(ts, end_ms if end_ms is not None else np.iinfo(np.int64).max))
    return batch.filter(keep)
