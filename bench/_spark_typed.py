"""`python -m bench spark`'s typed case: the same number of rows as Avro values framed with a
registered schema (a broker in this process serves the registry), read with
`valueFormat=registry` into typed columns, against a Parquet copy of the same typed rows.

Quick mode times the executors' work in this process (every task of the plan, CPU seconds)
against pyarrow reading the Parquet copy (`task_typed_vs_parquet_file`), and the same rows as
Protobuf and as JSON Schema values read by the whole-batch decoders against the per-record path
they replace (`task_typed_protobuf_vs_per_record`, `task_typed_json_vs_per_record`); full mode
times a Spark query over the typed columns against the same query on the Parquet copy
(`typed_vs_parquet`, goal >= 0.5). All check every row was read and sum the ids.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from google.protobuf import message_factory

from memq.client.schemas import SchemaClient
from memq.config import MemqConfig, ProducerConfig
from memq.format import LogMessage
from memq.schema.protobuf_rules import parse as parse_protobuf
from tests.support.inproc import broker_in_thread

SCHEMA = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"}, {"name": "amount", "type": "double"},
    {"name": "note", "type": ["null", "string"], "default": None}]}


# the same rows as Protobuf (proto3: an absent `note` reads as "") and as JSON Schema values
PROTO = """syntax = "proto3";
package bench;
message Order { int64 id = 1; string name = 2; double amount = 3; optional string note = 4; }
"""
JSON_SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"},
                                                "amount": {"type": "number"}, "note": {"type": ["null", "string"]}}}
REGISTERED = {"AVRO": json.dumps(SCHEMA), "PROTOBUF": PROTO, "JSON": json.dumps(JSON_SCHEMA)}


def _row(i: int) -> dict[str, Any]:
    return {"id": i, "name": f"customer-{i % 1000}", "amount": i * 0.5, "note": None if i % 3 else f"note {i}"}


def _values(fmt: str, schema_id: int, n: int) -> list[bytes]:
    head = b"\0" + schema_id.to_bytes(4, "big")
    if fmt == "JSON":
        return [head + json.dumps(_row(i), separators=(",", ":")).encode() for i in range(n)]
    if fmt == "PROTOBUF":
        schema = parse_protobuf(PROTO)
        cls = message_factory.GetMessageClass(schema.pool().FindMessageTypeByName("bench.Order"))
        return [head + b"\0" + cls(**{k: v for k, v in _row(i).items() if v is not None}).SerializeToString()
                for i in range(n)]
    parsed = fastavro.parse_schema(SCHEMA)
    out = []
    for i in range(n):
        buf = io.BytesIO()
        buf.write(head)
        fastavro.schemaless_writer(buf, parsed, _row(i))
        out.append(buf.getvalue())
    return out


@contextmanager
def typed_topic(config: MemqConfig, connection: dict[str, str], n: int, per_batch: int,
                formats: Sequence[str] = ("AVRO",)) -> Iterator[dict[str, dict[str, str]]]:
    """A topic of `n` framed values per format (AVRO, PROTOBUF, JSON), and each one's typed read
    options (the registry's broker running)."""
    with broker_in_thread(config) as url:
        yield {fmt: _typed_topic(config, connection, n, per_batch, fmt, url) for fmt in formats}


def _typed_topic(config: MemqConfig, connection: dict[str, str], n: int, per_batch: int, fmt: str,
                 url: str) -> dict[str, str]:
    from bench.spark import store_batches

    topic = f"bench-spark-typed-{fmt.lower()}-{uuid.uuid4().hex[:6]}"
    sid = int(SchemaClient(ProducerConfig(brokers=url)).call(
        "POST", f"/subjects/{topic}-value/versions", {"schema": REGISTERED[fmt], "schemaType": fmt})["id"])
    values = _values(fmt, sid, n)
    base = 1_700_000_000_000
    batches = [[LogMessage(v, b"key-%08d" % (i + j), (), base + i + j, None) for j, v in enumerate(values[i:i + per_batch])]
               for i in range(0, n, per_batch)]
    t = time.perf_counter()
    asyncio.run(store_batches(config, topic, batches, partitions=4))
    print(f"wrote {n} typed ({fmt}) messages: {time.perf_counter() - t:.1f}s", flush=True)
    return {"topic": topic, **connection, "valueFormat": "registry", "schema.registry.url": url}


def _aggregate(values: Sequence[pa.StructArray] | Sequence[pa.RecordBatch]) -> tuple[int, int]:
    """(rows, sum of ids), touching every column as the Spark query does."""
    rows = ids = 0
    for v in values:
        cols = {n: v.field(n) for n in ("id", "name", "amount")} if isinstance(v, pa.StructArray) else \
            {n: v.column(n) for n in ("id", "name", "amount")}
        rows += len(cols["id"])
        ids += pc.sum(cols["id"]).as_py() or 0
        pc.sum(pc.utf8_length(cols["name"]))
        pc.max(cols["amount"])
    return rows, ids


def tasks_read(options: dict[str, str], per_record: bool = False) -> tuple[float, int, int, list[pa.RecordBatch]]:
    """(CPU seconds, rows, id sum, the typed rows as flat batches): every task of the plan in this
    process; `per_record`: every value decoded value by value (the path the whole-batch decoders
    replace), for a before/after in one run."""
    from pyspark.sql.types import StructType

    from spark_source import typed_rows
    from spark_source.datasource import MemqDataSource

    source = MemqDataSource(options)
    reader = source.reader(StructType([source.schema()["value"]]))
    tasks = reader.partitions()
    decode = typed_rows.decode_values
    if per_record:
        typed_rows.decode_values = partial(decode, per_record=True)   # type: ignore[assignment]
    try:
        t = time.process_time()
        values = [b.column("value") for task in tasks for b in reader.read(task)]
        rows, ids = _aggregate(values)
        secs = time.process_time() - t
    finally:
        typed_rows.decode_values = decode
    flat = [pa.RecordBatch.from_arrays(v.flatten(), names=[f.name for f in v.type]) for v in values]
    return secs, rows, ids, flat


def parquet_file_read(path: str) -> tuple[float, int, int]:
    t = time.process_time()
    table = pq.read_table(path, columns=["id", "name", "amount"], use_threads=False)
    rows, ids = _aggregate(table.to_batches())
    return time.process_time() - t, rows, ids


def write_parquet(batches: list[pa.RecordBatch], path: str) -> None:
    pq.write_table(pa.Table.from_batches(batches), path)


def _query(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.agg(F.count("*").alias("n"), F.sum("id").alias("ids"), F.sum(F.length("name")).alias("l"),
                  F.max("amount").alias("a")).collect()[0]


_VALUE: dict[str, Any] = {}     # topic → the typed read's `value` field, asked of the registry once


def _typed(spark: Any, options: dict[str, str]) -> Any:
    """The typed read with a read schema of its `value` column alone (as the plain case names
    its three columns): the executors build no other column."""
    from pyspark.sql.types import StructType

    if options["topic"] not in _VALUE:
        _VALUE[options["topic"]] = spark.read.format("memq").options(**options).load().schema["value"]
    schema = StructType([_VALUE[options["topic"]]])
    return spark.read.format("memq").options(**options).schema(schema).load().select("value.*")


def spark_read(spark: Any, options: dict[str, str]) -> tuple[float, int, int]:
    t = time.perf_counter()
    row = _query(_typed(spark, options))
    return time.perf_counter() - t, row.n, row.ids


def spark_parquet_copy(spark: Any, options: dict[str, str], path: str) -> None:
    _typed(spark, options).write.mode("overwrite").parquet(path)


def spark_parquet_read(spark: Any, path: str) -> tuple[float, int, int]:
    t = time.perf_counter()
    row = _query(spark.read.parquet(path))
    return time.perf_counter() - t, row.n, row.ids
