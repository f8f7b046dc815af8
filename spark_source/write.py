"""The "memq" sink: `df.write.format("memq")` and `df.writeStream.format("memq")`.

Columns as Spark's Kafka sink: `value` (binary or string, required), `key`, `headers`
(array<struct<key: string, value: binary>>), `timestamp`, and `topic` per row (else the
`topic` option). Each task writes its rows through memq's Producer at ack=all (option `acks`)
and reports in its commit message what it wrote; a failed send fails the task with memq's error.

No duplicates on replay: a task's producer id is derived from (query id, partition) and its
epoch from the micro-batch id, and its Messages are cut by size alone (no linger timer, flushed
before the in-flight budget could force a seal), so a replayed micro-batch or a retried task
re-sends the same Messages under the same (producer id, epoch, sequence), which readers'
de-duplication drops. This holds when the rows reach the task in the same order on replay (any
deterministic plan, e.g. straight from a replayable source); a batch write gets a random id.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from memq.client.cluster import resolve_topic
from memq.client.producer import Producer
from memq.config import MemqConfig, ProducerConfig, load_config
from memq.errors import ConfigError, InvalidInputError
from memq.format import LogMessage

COLUMNS = frozenset({"value", "key", "headers", "timestamp", "topic"})
BATCH_ID_KEY = "streaming.sql.batchId"   # Spark's local properties in a micro-batch's tasks
QUERY_ID_KEY = "sql.streaming.queryId"
NO_LINGER_MS = 24 * 3_600_000            # Messages are sealed by size or by flush, never by a timer


@dataclass(frozen=True)
class SinkOptions:
    producer: ProducerConfig
    topic: str | None


@dataclass(frozen=True)
class Written(WriterCommitMessage):
    """What one task wrote: records and Messages acked, per topic, and the producer id used."""

    partition: int
    producer_id: int
    records: int
    messages: int


def parse_sink_options(options: Mapping[str, str], schema: StructType, overwrite: bool = False) -> SinkOptions:
    """Broker URLs from `memq.broker` or the config file (`memq.config`, else $MEMQ_CONFIG);
    `acks` 0/1/all; the columns and the topic (known to the brokers) checked here, on the driver,
    before any task runs."""
    if overwrite:
        raise ConfigError("memq sink: a topic is append-only; use mode('append')")
    names = {f.name for f in schema.fields}
    if "value" not in names:
        raise ConfigError(f"memq sink: the DataFrame needs a 'value' column (has {sorted(names)})")
    unknown = names - COLUMNS
    if unknown:
        raise ConfigError(f"memq sink: unknown columns {sorted(unknown)}; allowed: {sorted(COLUMNS)}")
    topic = options.get("topic")
    if not topic and "topic" not in names:
        raise ConfigError("memq sink: set option topic, or give each row a 'topic' column")
    path = options.get("memq.config") or os.environ.get("MEMQ_CONFIG")
    config = load_config(path, env={}) if path else MemqConfig()
    brokers = options.get("memq.broker") or config.producer.brokers
    if not brokers:
        raise ConfigError("memq sink: no broker: set option memq.broker, or memq.config with producer.brokers")
    acks = {"0": "0", "1": "1", "all": "all", "-1": "all"}.get(str(options.get("acks", "all")).lower())
    if acks is None:
        raise ConfigError(f"memq sink: option acks {options.get('acks')!r} is not 0, 1 or all")
    producer = dataclasses.replace(config.producer, brokers=str(brokers), ack=acks,   # type: ignore[arg-type]
                                   linger_ms=NO_LINGER_MS)
    if topic:   # fail on the driver, at once: a task's Producer would retry an unknown topic until max_block_ms
        resolve_topic(dataclasses.replace(config, producer=producer), topic, brokers=str(brokers),
                      timeout_s=producer.request_timeout_ms / 1000)
    return SinkOptions(producer, topic or None)


def task_identity() -> tuple[int, int, int]:
    """(partition, producer id, epoch) of this task: derived from the streaming query id and the
    micro-batch id when there are some, random otherwise."""
    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    query = ctx.getLocalProperty(QUERY_ID_KEY) if ctx is not None else None
    batch = ctx.getLocalProperty(BATCH_ID_KEY) if ctx is not None else None
    if query is None or batch is None:
        return partition, random.getrandbits(64), 0
    digest = hashlib.blake2b(f"{query}/{partition}".encode(), digest_size=8).digest()
    return partition, int.from_bytes(digest, "big"), int(batch) % 2 ** 32


async def write_batches(options: SinkOptions, batches: Iterator[pa.RecordBatch], producer_id: int,
                        epoch: int) -> tuple[int, int]:
    """Send every row; (records, Messages) acked. Flushes before the in-flight budget is half
    used, so Messages are cut by size only (deterministic for the same rows)."""
    budget = options.producer.max_in_flight_bytes // 2
    records = 0
    messages: set[tuple[str, int]] = set()
    pending: list[asyncio.Future] = []
    buffered = 0
    async with Producer(options.producer, producer_id=producer_id, epoch=epoch) as producer:
        for batch in batches:
            for topic, part in _by_topic(batch, options.topic):
                values = part.column("value").to_pylist()
                size = sum(map(len, values))
                if buffered and buffered + size > budget:
                    await producer.flush()
                    buffered = 0
                if None in values:
                    raise InvalidInputError(f"memq sink: a row for topic {topic} has a null value")
                keys = part.column("key").to_pylist() if "key" in part.schema.names else None
                if "headers" in part.schema.names or "timestamp" in part.schema.names:
                    pending.append(await producer.send_batch(topic, _log_messages(part, values, keys)))
                else:   # the fast path: no per-record Python objects
                    pending.append(await producer.send_many(topic, values, keys=keys))
                buffered += size
                records += len(values)
        await producer.flush()
        for fut in pending:
            for d in await fut:
                messages.add((d.topic, d.sequence))
    return records, len(messages)


def _by_topic(batch: pa.RecordBatch, default: str | None) -> Iterator[tuple[str, pa.Table]]:
    table = pa.Table.from_batches([batch])
    table = table.set_column(table.schema.get_field_index("value"), "value", _binary(table.column("value")))
    if "key" in table.schema.names:
        table = table.set_column(table.schema.get_field_index("key"), "key", _binary(table.column("key")))
    if "topic" not in table.schema.names:
        assert default is not None
        yield default, table
        return
    for topic in table.column("topic").unique().to_pylist():
        name = topic or default
        if not name:
            raise ConfigError("memq sink: a row has no topic and option topic is not set")
        yield name, table.filter(pc.equal(table.column("topic"), topic)) if topic else \
            table.filter(pc.is_null(table.column("topic")))


def _log_messages(part: pa.Table, values: list[bytes], keys: list[bytes | None] | None) -> list[LogMessage]:
    n = len(values)
    headers = part.column("headers").to_pylist() if "headers" in part.schema.names else [None] * n
    stamps = (pc.cast(part.column("timestamp"), pa.timestamp("ms", tz="UTC")).cast(pa.int64()).to_pylist()
              if "timestamp" in part.schema.names else [None] * n)
    return [LogMessage(value=v, key=k, headers=tuple((h["key"], h["value"] or b"") for h in hs or ()),
                       timestamp_ms=t or 0)
            for v, k, hs, t in zip(values, keys or [None] * n, headers, stamps)]


def _binary(column: pa.ChunkedArray) -> pa.ChunkedArray:
    return column.cast(pa.binary()) if pa.types.is_string(column.type) else column


def write_task(options: SinkOptions, iterator: Iterator[pa.RecordBatch]) -> Written:
    """One task's write, batch or streaming: its ids (task_identity), its rows, what was acked."""
    partition, producer_id, epoch = task_identity()
    records, messages = asyncio.run(write_batches(options, iterator, producer_id, epoch))
    return Written(partition, producer_id, records, messages)


class MemqWriter(DataSourceArrowWriter):
    """Batch write: each task sends its rows at the configured ack level."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        return write_task(self.options, iterator)


class MemqStreamWriter(DataSourceStreamArrowWriter):
    """Streaming write: ids from (query id, partition) and the micro-batch id, so a replay
    re-sends the same Messages (dropped by readers' de-duplication)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        return write_task(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass   # every record was acked before its task returned: nothing to finish

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass   # acked records stay; a replay re-sends them under the same ids
