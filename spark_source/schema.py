"""The table a memq topic reads as: Spark's Kafka source schema, adapted to batches on S3."""

from __future__ import annotations

from dataclasses import dataclass
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
# A LogMessage as an Arrow struct, fields in its tuple order.
_LOG_TYPE = pa.struct([("value", pa.binary()), ("key", pa.binary()), ("headers", _HEADER_TYPE),
                       ("timestamp_ms", pa.int64()), ("message_id", pa.binary())])


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
    # One C pass converts the LogMessage tuples; its children are the columns (no transpose).
    value, key, headers, ts_ms, _ = pa.array(logs, _LOG_TYPE).flatten()
    producer_ids = np.repeat(np.array([_signed64(p) for p, _ in messages], dtype=np.int64),
                             [len(msgs) for _, msgs in messages])
    columns = [
        key,
        value,
        pa.repeat(ctx.topic, n),
        pa.nulls(n, pa.int32()) if ctx.partition is None else pa.array(np.full(n, ctx.partition, np.int32)),
        pa.nulls(n, pa.int64()) if ctx.offset is None else pa.array(np.full(n, ctx.offset, np.int64)),
        pa.array(np.arange(n, dtype=np.int32)),
        pc.multiply(ts_ms, 1000).cast(ARROW_SCHEMA.field("timestamp").type),
        headers,
        pa.repeat(ctx.bucket, n),
        pa.repeat(ctx.key, n),
        pa.array(producer_ids),
    ]
    batch = pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
    if start_ms is None and end_ms is None:
        return batch
    keep = pc.and_(pc.greater_equal(ts_ms, start_ms if start_ms is not None else np.iinfo(np.int64).min),
                   pc.less(ts_ms, end_ms if end_ms is not None else np.iinfo(np.int64).max))
    return batch.filter(keep)
