"""Spark DataSource "memq" against memq's own Consumer, reading the same N messages.

One DevCluster, the same rows written twice the way brokers write them (batch objects on S3,
notifications on Kafka): a topic for Spark with Codec.ARROW Message bodies (Arrow columns, as
a producer with `codec = "arrow"` writes them) and one with the default msgpack+zstd bodies.
memq's side: a local[2] Spark session (started and warmed up before timing) runs
`count(*), sum(length(value)), sum(length(key)), max(timestamp)` with a read schema of the
three columns it reads, every row through Arrow; timed from `load()` (planning included) to
the collected result. Peers: the same query on a local Parquet copy of the same rows (ratio
`vs_parquet` = Parquet seconds / memq seconds), and one `memq.client.Consumer` iterating the
msgpack topic (its own best format), timed as `bench consume` times it
(`bench._cluster.read_memq`: group assignment to the N-th record, so tansu's slow group join
counts on neither side). Ratio `vs_consumer` = consumer seconds / Spark seconds (higher is
better). Spark on the msgpack topic is reported too (`spark_zstd_bodies_s`).
"""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Sequence

from bench._cluster import read_memq
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
from memq.notify import NotificationPublisher, TopicAdmin
from memq.storage import ObjectLocation, make_storage

PER_MESSAGE = 1_000
READ_SCHEMA = "key binary, value binary, timestamp timestamp"   # the columns `_query` reads


@dataclass(frozen=True)
class Stored:
    """Where one written batch landed."""

    partition: int
    offset: int
    location: ObjectLocation
    count: int


async def store_batches(config: MemqConfig, topic: str, batches: Sequence[Sequence[LogMessage]], *,
                        partitions: int, codec: Codec = Codec.ZSTD) -> list[Stored]:
    """Write each batch as a broker does (encode, PUT, notify) into `topic`'s notification topic."""
    kafka_topic = notification_topic(config, topic)
    TopicAdmin(config.kafka).create_topic(kafka_topic, partitions)
    storage = make_storage(config)
    publisher = NotificationPublisher(config.kafka, client_id=f"bench-{topic}")
    producer_id = random.getrandbits(64)
    out = []
    try:
        for seq, records in enumerate(batches):
            msgs = [encode_message(records[j:j + PER_MESSAGE], producer_id=producer_id, epoch=0,
                                   sequence=seq * 1_000_000 + j, codec=codec) for j in range(0, len(records), PER_MESSAGE)]
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


def run(quick: bool = False) -> dict:
    from memq.devcluster import DevCluster
    from spark_source import local_session

    n = 200_000 if quick else 1_000_000
    per_batch = 20_000
    with DevCluster() as dc:
        config = dc.config(cluster="bench")
        suffix = uuid.uuid4().hex[:6]
        topics = {codec: f"bench-spark-{codec.name.lower()}-{suffix}" for codec in (Codec.ARROW, Codec.ZSTD)}
        for codec, topic in topics.items():
            t = time.perf_counter()
            asyncio.run(store_batches(config, topic, _records(n, per_batch), partitions=4, codec=codec))
            print(f"wrote {n} messages in {n // per_batch} batches ({codec.name}): {time.perf_counter() - t:.1f}s",
                  flush=True)
        connection = {"kafka.bootstrap.servers": config.kafka.bootstrap_servers,
                      "cluster": config.cluster.name, "s3.endpoint": config.s3.endpoint_url or "",
                      "s3.bucket": config.s3.bucket, "s3.accessKeyId": config.s3.access_key_id or "",
                      "s3.secretAccessKey": config.s3.secret_access_key or ""}
        options = {codec: {"topic": topic, **connection} for codec, topic in topics.items()}
        t = time.perf_counter()
        spark = local_session("memq-bench", "local[2]")
        try:
            # warm-up: one object per read partition = 4 tasks, so both Python workers are started
            for opts in options.values():
                _spark_read(spark, {**opts, "endingOffsets": '{"0": 1, "1": 1, "2": 1, "3": 1}'})
            print(f"spark session ready: {time.perf_counter() - t:.1f}s", flush=True)
            parquet = tempfile.mkdtemp(prefix="memq-bench-parquet-")
            _parquet_copy(spark, options[Codec.ZSTD], parquet)
            rounds = 1 if quick else 2
            spark_runs: dict[Codec, list[tuple[float, int, int]]] = {codec: [] for codec in topics}
            parquet_runs = []
            consumer_runs = []
            for _ in range(rounds):
                for codec, opts in options.items():
                    spark_runs[codec].append(_spark_read(spark, opts))
                    print(f"spark datasource ({codec.name} bodies): {spark_runs[codec][-1][1]} rows in "
                          f"{spark_runs[codec][-1][0]:.2f}s", flush=True)
                parquet_runs.append(_parquet_read(spark, parquet))
                print(f"spark on a local Parquet copy: {parquet_runs[-1][1]} rows in {parquet_runs[-1][0]:.2f}s",
                      flush=True)
                c = read_memq(config, topics[Codec.ZSTD], n, timeout_s=300)
                consumer_runs.append((c.read_s, c.records, c.value_bytes, c.total_s))
                print(f"memq consumer (ZSTD bodies): {c.records} records in {c.read_s:.2f}s from assignment "
                      f"({c.total_s:.2f}s with group join)", flush=True)
        finally:
            spark.stop()
            shutil.rmtree(parquet, ignore_errors=True)
    s_time, s_rows, s_bytes = min(spark_runs[Codec.ARROW])
    m_time, m_rows, m_bytes = min(spark_runs[Codec.ZSTD])
    p_time, p_rows, p_bytes = min(parquet_runs)
    c_time, c_rows, c_bytes, c_total = min(consumer_runs)
    if {(s_rows, s_bytes), (m_rows, m_bytes), (p_rows, p_bytes)} != {(n, c_bytes)} or c_rows != n:
        raise RuntimeError(f"reads disagree: spark {s_rows} rows/{s_bytes} B (ARROW), {m_rows}/{m_bytes} B (ZSTD), "
                           f"parquet {p_rows}/{p_bytes} B, consumer {c_rows}/{c_bytes} B, want {n}")
    return {"ratios": {"vs_consumer": round(c_time / s_time, 3), "vs_parquet": round(p_time / s_time, 3)},
            "messages": n, "spark_s": round(s_time, 3), "parquet_s": round(p_time, 3), "consumer_s": round(c_time, 3),
            "consumer_with_join_s": round(c_total, 3), "spark_zstd_bodies_s": round(m_time, 3),
            "zstd_bodies_vs_parquet": round(p_time / m_time, 3),
            "spark_msgs_per_s": round(n / s_time), "consumer_msgs_per_s": round(n / c_time)}
