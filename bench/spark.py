"""Spark DataSource "memq" against a Parquet copy of the same rows and memq's own Consumer.

One DevCluster, the same N rows written three times the way brokers write them (batch objects
on S3, notifications on Kafka), one topic per body codec: Codec.ARROW (a producer with
`codec = "arrow"`), the default msgpack+zstd, and Codec.KAFKA (Kafka RecordBatches v2 with
zstd, as the Kafka listener stores a Kafka producer's batches: one per Message).

Full mode (1M rows): a Spark session (`--master`, default local[2]; started and warmed up
before timing) runs `count(*), sum(length(value)), sum(length(key)), max(timestamp)` with a
read schema of the three columns it reads; timed from `load()` (planning included) to the
collected result, best of three rounds (each reader once per round, in an order rotated
from round to round). Peers: the same query on a local Parquet copy of the same rows
(`vs_parquet` (Arrow bodies), `zstd_vs_parquet`, `kafka_vs_parquet` = Parquet seconds / memq
seconds), and one `memq.client.Consumer` iterating the msgpack+zstd topic, timed as `bench
consume` times it (`bench._cluster.read_memq`: from group assignment to the N-th record).
`vs_consumer` = consumer seconds / Spark seconds on that same default-codec topic, both in
the same rounds; it leans to the Consumer: its group join (~3 s on tansu) is left out while
Spark's planning is counted, and it sums only value lengths.

The ceiling of any Python DataSource, in the same rounds (`floor_s`, `floor_vs_parquet`): a
source that does no I/O and no decoding, its tasks yielding rows of the same shape (12-byte
keys, 100-byte values, timestamps) from Arrow batches built once per Python worker. What it
costs is Spark's alone: planning through a Python worker, task launch, Arrow batches handed
from Python to the JVM and turned into rows. `*_vs_floor` = floor seconds / memq seconds: how
much of the gap to Parquet is memq's.

Quick mode (200k rows) starts no Spark: at that size a Spark query is mostly job start-up
(planning, task launch: Spark took 0.80 s on Arrow bodies whose tasks take 0.2-0.4 s in-process,
and 6.4 s on the Parquet copy in one loaded run), so Spark-vs-Parquet ratios there measure
start-up and load. It times what is not start-up instead: the executor's work, every task of
the plan run in this process one after the other (`read_partition`: GETs, decode, Arrow
columns, the query's aggregates in Arrow), against pyarrow reading the same columns of the
Parquet copy single-threaded (`task_*_vs_parquet_file`), and the Consumer (`task_zstd_vs_consumer`,
its CPU from creation to close). Times there are this process's CPU seconds (every thread's,
not the S3 server's): on the shared 2-core machine the wall time of the same Parquet read
swung 6x from run to run.

The typed case (`bench/_spark_typed.py`): the same number of rows as Avro values framed with a
registered schema, read with `valueFormat=registry` into typed columns, against a Parquet copy of
the same typed rows (`typed_vs_parquet`, goal >= 0.5; quick: `task_typed_vs_parquet_file`).
Quick mode also reads the same rows as Protobuf and as JSON Schema values, through the
whole-batch decoders against the per-record path they replace, run once
(`task_typed_protobuf_vs_per_record`, `task_typed_json_vs_per_record`).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import memq
from bench import _spark_typed as spark_typed
from bench._cluster import read_memq
from bench._spark_typed import typed_topic
from memq.client.consumer import notification_topic
from memq.config import MemqConfig
from memq.format import (
    NOTIFICATION_VERSION,
    Codec,
    LogMessage,
    Notification,
    decode_message_header,
    encode_batch,
    encode_message,
    object_crc32c,
)
from memq.format.kafka_records import verify_kafka_batch
from memq.format.message import encode_kafka_message
from memq.notify import NotificationPublisher, TopicAdmin
from memq.storage import ObjectLocation, make_storage
from tests.support.kafka_frames import record_batch

PER_MESSAGE = 1_000
READ_SCHEMA = "key binary, value binary, timestamp timestamp"   # the columns `_query` reads
READ_COLUMNS = ("key", "value", "timestamp")
NAMES = {Codec.ARROW: "arrow", Codec.ZSTD: "zstd", Codec.KAFKA: "kafka"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", default="local[2]",
                        help="Spark master of the full run, e.g. local-cluster[2,1,1024] for executor JVMs")


@dataclass(frozen=True)
class Stored:
    """Where one written batch landed."""

    partition: int
    offset: int
    location: ObjectLocation
    count: int


def encode(records: Sequence[LogMessage], codec: Codec, producer_id: int, sequence: int) -> bytearray:
    """One Message as a memq producer (`codec`) or, for Codec.KAFKA, the Kafka listener
    (a Kafka producer's zstd RecordBatch, stored unchanged) writes it."""
    if codec is Codec.KAFKA:
        kb = record_batch(records, codec="zstd", producer_id=producer_id >> 1, epoch=0, base_sequence=0)
        return encode_kafka_message(kb, verify_kafka_batch(kb), producer_id=producer_id, epoch=0, sequence=sequence)[0]
    return encode_message(records, producer_id=producer_id, epoch=0, sequence=sequence, codec=codec)


Encoder = Callable[[Sequence[LogMessage], Codec, int, int], bytearray]


async def store_batches(config: MemqConfig, topic: str, batches: Sequence[Sequence[LogMessage]], *,
                        partitions: int, codec: Codec = Codec.ZSTD, encoder: Encoder = encode) -> list[Stored]:
    """Write each batch as a broker does (`encoder` per Message, PUT, notify) into `topic`'s
    notification topic."""
    kafka_topic = notification_topic(config, topic)
    TopicAdmin(config.kafka).create_topic(kafka_topic, partitions)
    storage = make_storage(config)
    publisher = NotificationPublisher(config.kafka, client_id=f"bench-{topic}")
    producer_id = random.getrandbits(63)
    out = []
    try:
        for seq, records in enumerate(batches):
            msgs = [encoder(records[j:j + PER_MESSAGE], codec, producer_id, seq * 1_000_000 + j)
                    for j in range(0, len(records), PER_MESSAGE)]
            headers = [decode_message_header(m) for m in msgs]
            created = max(h.max_timestamp_ms for h in headers)
            chunks = encode_batch(msgs, headers, broker_id="bench", created_ms=created)
            loc = await storage.put_batch(topic, chunks, first_request_id=producer_id ^ seq,
                                          timestamp_ms=created, broker_id="bench")
            note = Notification(
                v=NOTIFICATION_VERSION, topic=topic, bucket=loc.bucket, key=loc.key,
                size=sum(len(c) for c in chunks), header_size=len(chunks[0]), message_count=len(msgs),
                logmessage_count=len(records), min_timestamp_ms=min(h.min_timestamp_ms for h in headers),
                max_timestamp_ms=created, crc32c=object_crc32c(chunks), broker_id="bench", attempt=0,
                created_ms=created)
            p, off = await publisher.publish(kafka_topic, note)
            out.append(Stored(p, off, loc, len(records)))
    finally:
        publisher.close()
        await storage.close()
    return out


def _records(n: int, per_batch: int) -> list[list[LogMessage]]:
    rnd = random.Random(1)
    base = 1_700_000_000_000
    recs = [LogMessage(rnd.randbytes(100), b"key-%08d" % i, (("source", b"bench"),), base + i, None)
            for i in range(n)]
    return [recs[i:i + per_batch] for i in range(0, n, per_batch)]


def _query(df):  # type: ignore[no-untyped-def]
    """The timed query: every row through Spark, touching value, key and timestamp."""
    from pyspark.sql import functions as F

    return df.agg(F.count("*").alias("n"), F.sum(F.length("value")).alias("b"),
                  F.sum(F.length("key")).alias("k"), F.max("timestamp").alias("t")).collect()[0]


def _spark_read(spark, options: dict[str, str]) -> tuple[float, int, int]:  # type: ignore[no-untyped-def]
    """(seconds from `load()` (planning included) to the collected row, rows, value bytes).
    The read schema names the query's columns, as a Parquet read gets only those."""
    reader = spark.read.format("memq").options(**options).schema(READ_SCHEMA)
    t = time.perf_counter()
    row = _query(reader.load())
    return time.perf_counter() - t, row.n, row.b


def _parquet_copy(spark, options: dict[str, str], path: str) -> None:  # type: ignore[no-untyped-def]
    """The peer's input: the same rows (key, value, timestamp) as a local Parquet copy."""
    spark.read.format("memq").options(**options).schema(READ_SCHEMA).load().write.mode("overwrite").parquet(path)


def _parquet_read(spark, path: str) -> tuple[float, int, int]:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    row = _query(spark.read.parquet(path))
    return time.perf_counter() - t, row.n, row.b


def _floor_read(spark, rows: int, tasks: int) -> tuple[float, int, int]:  # type: ignore[no-untyped-def]
    """The same query on `bench.spark_floor`'s no-work source, as many tasks as memq's plan."""
    from bench.spark_floor import FloorDataSource

    t = time.perf_counter()
    row = _query(spark.read.format(FloorDataSource.name()).options(rows=str(rows), tasks=str(tasks)).load())
    return time.perf_counter() - t, row.n, row.b


def _aggregate(batches: Sequence[pa.RecordBatch]) -> tuple[int, int]:
    """The query's rows and value bytes, computed in Arrow (with its other aggregates, so the
    columns are touched as Spark touches them)."""
    rows = value_bytes = 0
    for b in batches:
        rows += b.num_rows
        value_bytes += pc.sum(pc.binary_length(b.column("value"))).as_py() or 0
        pc.sum(pc.binary_length(b.column("key")))
        pc.max(b.column("timestamp"))
    return rows, value_bytes


def _tasks_read(options: dict[str, str]) -> tuple[float, int, int, list[pa.RecordBatch]]:
    """(CPU seconds, rows, value bytes, batches): every task of the plan run here, one after
    another, as executors run them (planning excluded, as it is start-up)."""
    from pyspark.sql.types import StructType

    from spark_source import SCHEMA
    from spark_source.datasource import MemqDataSource

    reader = MemqDataSource(options).reader(StructType([SCHEMA[c] for c in READ_COLUMNS]))
    tasks = reader.partitions()
    t = time.process_time()
    batches = [b for task in tasks for b in reader.read(task)]
    rows, value_bytes = _aggregate(batches)
    return time.process_time() - t, rows, value_bytes, batches


def _parquet_file_read(path: str) -> tuple[float, int, int]:
    t = time.process_time()
    table = pq.read_table(path, columns=list(READ_COLUMNS), use_threads=False)
    rows, value_bytes = _aggregate(table.to_batches())
    return time.process_time() - t, rows, value_bytes


def _best(runs: list[tuple[float, int, int]], n: int, value_bytes: int, what: str) -> float:
    """The best time of `runs`, after checking each read every row and value byte."""
    for _, rows, got in runs:
        if (rows, got) != (n, value_bytes):
            raise RuntimeError(f"{what} read {rows} rows / {got} value bytes, want {n} / {value_bytes}")
    return min(r[0] for r in runs)


def _consumer(config: MemqConfig, topic: str, n: int, runs: list[tuple[float, int, int]]) -> float:
    c = read_memq(config, topic, n, timeout_s=300)
    runs.append((c.read_s, c.records, c.value_bytes))
    print(f"memq consumer (ZSTD bodies): {c.records} records in {c.read_s:.2f}s from assignment "
          f"({c.total_s:.2f}s with group join)", flush=True)
    return c.total_s


def _quick(config: MemqConfig, options: dict[Codec, dict[str, str]], topics: dict[Codec, str], n: int,
           value_bytes: int, typed_formats: dict[str, dict[str, str]]) -> dict:
    task_runs: dict[Codec, list[tuple[float, int, int]]] = {codec: [] for codec in topics}
    parquet_runs: list[tuple[float, int, int]] = []
    consumer_runs: list[tuple[float, int, int]] = []
    typed_runs: list[tuple[float, int, int]] = []
    typed_parquet_runs: list[tuple[float, int, int]] = []
    typed = typed_formats["AVRO"]
    others = {fmt: opts for fmt, opts in typed_formats.items() if fmt != "AVRO"}
    other_runs: dict[str, list[tuple[float, int, int]]] = {fmt: [] for fmt in others}
    per_record_runs: dict[str, list[tuple[float, int, int]]] = {fmt: [] for fmt in others}
    parquet = tempfile.mkdtemp(prefix="memq-bench-parquet-")
    try:
        for _ in range(3):   # best of three: the first run of each also pays this process's warm-up
            for codec, opts in options.items():
                secs, rows, got, batches = _tasks_read(opts)
                task_runs[codec].append((secs, rows, got))
                print(f"spark tasks in-process ({codec.name} bodies): {rows} rows in {secs:.2f} CPU s", flush=True)
                if codec is Codec.ZSTD and not parquet_runs:
                    pq.write_table(pa.Table.from_batches(batches).select(list(READ_COLUMNS)), f"{parquet}/copy.parquet")
            parquet_runs.append(_parquet_file_read(parquet))
            print(f"pyarrow on a local Parquet copy: {parquet_runs[-1][1]} rows in {parquet_runs[-1][0]:.2f} CPU s",
                  flush=True)
            secs, rows, ids, flat = spark_typed.tasks_read(typed)
            typed_runs.append((secs, rows, ids))
            if not typed_parquet_runs:
                spark_typed.write_parquet(flat, f"{parquet}-typed.parquet")
            typed_parquet_runs.append(spark_typed.parquet_file_read(f"{parquet}-typed.parquet"))
            print(f"spark tasks in-process (typed Avro values): {rows} rows in {secs:.2f} CPU s; pyarrow on their "
                  f"Parquet copy {typed_parquet_runs[-1][0]:.2f} CPU s", flush=True)
            for fmt, opts in others.items():
                secs, rows, ids, _ = spark_typed.tasks_read(opts)
                other_runs[fmt].append((secs, rows, ids))
                print(f"spark tasks in-process (typed {fmt} values): {rows} rows in {secs:.2f} CPU s", flush=True)
        for fmt, opts in others.items():   # the per-record path they replace: slower, and steadier; once
            secs, rows, ids, _ = spark_typed.tasks_read(opts, per_record=True)
            per_record_runs[fmt].append((secs, rows, ids))
            print(f"spark tasks in-process (typed {fmt} values, value by value): {rows} rows in {secs:.2f} CPU s",
                  flush=True)
        cpu = time.process_time()
        c = read_memq(config, topics[Codec.ZSTD], n, timeout_s=300)
        consumer_runs.append((time.process_time() - cpu, c.records, c.value_bytes))
        print(f"memq consumer (ZSTD bodies): {c.records} records in {consumer_runs[-1][0]:.2f} CPU s", flush=True)
    finally:
        shutil.rmtree(parquet, ignore_errors=True)
        Path(f"{parquet}-typed.parquet").unlink(missing_ok=True)
    p_time = _best(parquet_runs, n, value_bytes, "parquet")
    t = {codec: _best(runs, n, value_bytes, f"tasks ({codec.name})") for codec, runs in task_runs.items()}
    c_time = _best(consumer_runs, n, value_bytes, "consumer")
    ids = n * (n - 1) // 2
    typed_time = _best(typed_runs, n, ids, "typed tasks")
    typed_p_time = _best(typed_parquet_runs, n, ids, "typed parquet")
    other = {fmt.lower(): _best(runs, n, ids, f"typed {fmt} tasks") for fmt, runs in other_runs.items()}
    per_record = {fmt.lower(): _best(runs, n, ids, f"typed {fmt} tasks value by value")
                  for fmt, runs in per_record_runs.items()}
    return {"ratios": {f"task_{NAMES[c]}_vs_parquet_file": round(p_time / t[c], 3) for c in t}
            | {"task_zstd_vs_consumer": round(c_time / t[Codec.ZSTD], 3),
               "task_typed_vs_parquet_file": round(typed_p_time / typed_time, 3)}
            | {f"task_typed_{f}_vs_per_record": round(per_record[f] / other[f], 3) for f in other},
            "messages": n, **{f"task_{NAMES[c]}_cpu_s": round(t[c], 3) for c in t},
            "task_typed_cpu_s": round(typed_time, 3), "typed_parquet_file_cpu_s": round(typed_p_time, 3),
            **{f"task_typed_{f}_cpu_s": round(other[f], 3) for f in other},
            **{f"task_typed_{f}_per_record_cpu_s": round(per_record[f], 3) for f in per_record},
            "parquet_file_cpu_s": round(p_time, 3), "consumer_cpu_s": round(c_time, 3)}


def _full(config: MemqConfig, options: dict[Codec, dict[str, str]], topics: dict[Codec, str], n: int,
          value_bytes: int, master: str, typed: dict[str, str]) -> dict:
    from spark_source import local_session

    t = time.perf_counter()
    # Executor JVMs (local-cluster) start Python workers elsewhere: point them at this memq.
    here = str(Path(memq.__file__).resolve().parents[1])
    spark = local_session("memq-bench", master, {"spark.executorEnv.PYTHONPATH": here})
    from bench.spark_floor import FloorDataSource

    spark.dataSource.register(FloorDataSource)
    tasks = spark.sparkContext.defaultParallelism   # memq's plan: a task per core for 1M rows
    parquet = tempfile.mkdtemp(prefix="memq-bench-parquet-")
    spark_runs: dict[Codec, list[tuple[float, int, int]]] = {codec: [] for codec in topics}
    floor_runs: list[tuple[float, int, int]] = []
    parquet_runs: list[tuple[float, int, int]] = []
    consumer_runs: list[tuple[float, int, int]] = []
    consumer_totals: list[float] = []
    typed_runs: list[tuple[float, int, int]] = []
    typed_parquet_runs: list[tuple[float, int, int]] = []
    try:
        # warm-up: one object per read partition = 4 tasks, so every Python worker is started
        for opts in options.values():
            _spark_read(spark, {**opts, "endingOffsets": '{"0": 1, "1": 1, "2": 1, "3": 1}'})
        _floor_read(spark, n, tasks)   # builds each worker's batch
        print(f"spark session ready ({master}): {time.perf_counter() - t:.1f}s", flush=True)
        _parquet_copy(spark, options[Codec.ZSTD], parquet)
        spark_typed.spark_parquet_copy(spark, typed, f"{parquet}-typed")
        def spark_step(codec: Codec) -> None:
            spark_runs[codec].append(_spark_read(spark, options[codec]))
            print(f"spark datasource ({codec.name} bodies): {spark_runs[codec][-1][1]} rows in "
                  f"{spark_runs[codec][-1][0]:.2f}s", flush=True)

        def floor_step() -> None:
            floor_runs.append(_floor_read(spark, n, tasks))
            print(f"spark on a no-work Python DataSource: {floor_runs[-1][1]} rows in {floor_runs[-1][0]:.2f}s",
                  flush=True)

        def parquet_step() -> None:
            parquet_runs.append(_parquet_read(spark, parquet))
            print(f"spark on a local Parquet copy: {parquet_runs[-1][1]} rows in {parquet_runs[-1][0]:.2f}s",
                  flush=True)

        def typed_step() -> None:
            typed_runs.append(spark_typed.spark_read(spark, typed))
            typed_parquet_runs.append(spark_typed.spark_parquet_read(spark, f"{parquet}-typed"))
            print(f"spark on typed Avro values: {typed_runs[-1][1]} rows in {typed_runs[-1][0]:.2f}s; on their "
                  f"Parquet copy {typed_parquet_runs[-1][0]:.2f}s", flush=True)

        steps = [partial(spark_step, codec) for codec in options] + [
            floor_step, parquet_step, typed_step, lambda: consumer_totals.append(_consumer(config, topics[Codec.ZSTD], n, consumer_runs))]
        # Interleaved, so drift on a shared machine hits every reader alike, and rotated, so no
        # reader always follows the same one (the Consumer leaves read-ahead GETs to the S3 server).
        for r in range(3):
            for step in steps[r:] + steps[:r]:
                step()
    finally:
        spark.stop()
        shutil.rmtree(parquet, ignore_errors=True)
        shutil.rmtree(f"{parquet}-typed", ignore_errors=True)
    p_time = _best(parquet_runs, n, value_bytes, "parquet")
    typed_time = _best(typed_runs, n, n * (n - 1) // 2, "typed spark")
    typed_p_time = _best(typed_parquet_runs, n, n * (n - 1) // 2, "typed parquet")
    s = {codec: _best(runs, n, value_bytes, f"spark ({codec.name})") for codec, runs in spark_runs.items()}
    c_time = _best(consumer_runs, n, value_bytes, "consumer")
    f_time = _best(floor_runs, n, n * 100, "no-work source")
    return {"ratios": {"vs_parquet": round(p_time / s[Codec.ARROW], 3),
                       "zstd_vs_parquet": round(p_time / s[Codec.ZSTD], 3),
                       "kafka_vs_parquet": round(p_time / s[Codec.KAFKA], 3),
                       "vs_consumer": round(c_time / s[Codec.ZSTD], 3),
                       "floor_vs_parquet": round(p_time / f_time, 3),
                       "typed_vs_parquet": round(typed_p_time / typed_time, 3),
                       **{f"{NAMES[c]}_vs_floor": round(f_time / s[c], 3) for c in s}},
            "messages": n, "master": master, "floor_s": round(f_time, 3), "spark_s": round(s[Codec.ARROW], 3),
            "spark_zstd_bodies_s": round(s[Codec.ZSTD], 3), "spark_kafka_bodies_s": round(s[Codec.KAFKA], 3),
            "parquet_s": round(p_time, 3), "typed_s": round(typed_time, 3), "typed_parquet_s": round(typed_p_time, 3),
            "consumer_s": round(c_time, 3), "consumer_with_join_s": round(min(consumer_totals), 3),
            "spark_zstd_msgs_per_s": round(n / s[Codec.ZSTD]), "consumer_msgs_per_s": round(n / c_time)}


def run(quick: bool = False, master: str = "local[2]") -> dict:
    from memq.devcluster import DevCluster

    n = 200_000 if quick else 1_000_000
    per_batch = 20_000
    batches = _records(n, per_batch)
    value_bytes = sum(len(r.value) for b in batches for r in b)
    with DevCluster() as dc:
        config = dc.config(cluster="bench")
        suffix = uuid.uuid4().hex[:6]
        topics = {codec: f"bench-spark-{NAMES[codec]}-{suffix}" for codec in NAMES}
        for codec, topic in topics.items():
            t = time.perf_counter()
            asyncio.run(store_batches(config, topic, batches, partitions=4, codec=codec))
            print(f"wrote {n} messages in {n // per_batch} batches ({codec.name}): {time.perf_counter() - t:.1f}s",
                  flush=True)
        connection = {"kafka.bootstrap.servers": config.kafka.bootstrap_servers,
                      "cluster": config.cluster.name, "s3.endpoint": config.s3.endpoint_url or "",
                      "s3.bucket": config.s3.bucket, "s3.accessKeyId": config.s3.access_key_id or "",
                      "s3.secretAccessKey": config.s3.secret_access_key or ""}
        options = {codec: {"topic": topic, **connection} for codec, topic in topics.items()}
        with typed_topic(config, connection, n, per_batch, ("AVRO", "PROTOBUF", "JSON") if quick else ("AVRO",)) as typed:
            if quick:
                return _quick(config, options, topics, n, value_bytes, typed)
            return _full(config, options, topics, n, value_bytes, master, typed["AVRO"])
