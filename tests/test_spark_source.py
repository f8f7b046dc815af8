"""The Spark DataSource "memq" on the real dev cluster with one shared local Spark session.

Test data is written the way a broker writes it (format -> storage PUT -> notification),
so every row's partition, offset and object are known exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import random
import struct
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Sequence

import pytest

from bench._cluster import read_memq
from crc32c import crc32c

from bench.spark import encode, store_batches
from memq.config import MemqConfig
from memq.devcluster import DevCluster
from memq.format import Codec, LogMessage
from memq.format.kafka_records import KAFKA_BATCH_HEADER_SIZE, verify_kafka_batch
from memq.format.message import encode_kafka_message
from memq.storage import ObjectLocation, make_storage

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from spark_source import MESSAGE_ID_COLUMNS  # noqa: E402
from tests.support.kafka_frames import record_batch  # noqa: E402
from tests.support.spark import connection  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(240)]

T0 = 1_700_000_000_000
N = 60_000
PER_BATCH = 1_500
PARTITIONS = 3


@dataclass(frozen=True)
class Stored:
    partition: int
    offset: int
    location: ObjectLocation
    first: int   # message number of the batch's first LogMessage
    count: int


def make_record(i: int) -> LogMessage:
    headers = ((("seq", b"%d" % i),) if i % 3 == 0 else (("a", b"1"), ("b", b"")) if i % 3 == 1 else ())
    return LogMessage(value=b"v%08d-" % i + bytes(range(i % 7, i % 7 + 40)), key=b"k%08d" % i,
                      headers=headers, timestamp_ms=T0 + i // 2)


def write(config: MemqConfig, topic: str, ranges: list[range], partitions: int = PARTITIONS) -> list[Stored]:
    """One batch per range of message numbers, written as a broker writes them."""
    batches = [[make_record(i) for i in r] for r in ranges]
    stored = asyncio.run(store_batches(config, topic, batches, partitions=partitions))
    return [Stored(s.partition, s.offset, s.location, r.start, len(r)) for s, r in zip(stored, ranges)]


def chunks_of(start: int, stop: int, size: int) -> list[range]:
    return [range(i, min(i + size, stop)) for i in range(start, stop, size)]


@pytest.fixture(scope="module")
def config(devcluster: DevCluster) -> MemqConfig:
    return devcluster.config(cluster="sparktest")


@pytest.fixture(scope="module")
def big(config: MemqConfig) -> tuple[str, list[Stored]]:
    topic = f"spark-big-{uuid.uuid4().hex[:8]}"
    return topic, write(config, topic, chunks_of(0, N, PER_BATCH))


def read(spark: SparkSession, config: MemqConfig, topic: str, **options: str) -> DataFrame:
    return spark.read.format("memq").options(**connection(config)).option("topic", topic).options(**options).load()


def keys_of(df: DataFrame) -> list[int]:
    return sorted(int(r.key[1:]) for r in df.select("key").collect())


def test_count_and_sample_equal_what_was_produced(spark: SparkSession, config: MemqConfig,
                                                  big: tuple[str, list[Stored]]) -> None:
    topic, stored = big
    df = read(spark, config, topic)
    assert df.count() == N
    sample = random.Random(7).sample(range(N), 300)
    rows = (df.filter(F.col("key").isin([b"k%08d" % i for i in sample]))
            .select("key", "value", "headers", F.unix_millis("timestamp").alias("ts"), "topic", "partition",
                    "offset", "index", "bucket", "objectKey").collect())
    assert len(rows) == len(sample)
    where = {s.first + j: s for s in stored for j in range(s.count)}
    for row in rows:
        i = int(row.key[1:])
        want = make_record(i)
        assert row.value == want.value
        assert tuple((h.key, bytes(h.value)) for h in row.headers) == want.headers
        assert row.ts == want.timestamp_ms
        s = where[i]
        assert (row.topic, row.partition, row.offset, row["index"]) == (topic, s.partition, s.offset, i - s.first)
        assert (row.bucket, row.objectKey) == (s.location.bucket, s.location.key)


def test_offset_ranges_and_pushed_filters_select_exact_batches(spark: SparkSession, config: MemqConfig,
                                                                big: tuple[str, list[Stored]]) -> None:
    topic, stored = big
    on_p0 = sorted(s.offset for s in stored if s.partition == 0)
    lo, hi = on_p0[1], on_p0[3] + 1
    df = read(spark, config, topic, startingOffsets=f'{{"{topic}": {{"0": {lo}, "1": -1, "2": -1}}}}',
              endingOffsets=f'{{"{topic}": {{"0": {hi}, "1": -1, "2": -1}}}}')
    want = sorted(s.first + j for s in stored if s.partition == 0 and lo <= s.offset < hi for j in range(s.count))
    assert keys_of(df) == want

    on_p1 = sorted(s.offset for s in stored if s.partition == 1)
    filtered = read(spark, config, topic).filter((F.col("partition") == 1) & (F.col("offset") >= on_p1[0])
                                                 & (F.col("offset") <= on_p1[1]))
    want = sorted(s.first + j for s in stored if s.partition == 1 and s.offset in on_p1[:2] for j in range(s.count))
    assert keys_of(filtered) == want
    assert filtered.rdd.getNumPartitions() == 1  # pushed down: only partition 1's two objects planned


def test_timestamp_ranges_return_exact_rows(spark: SparkSession, config: MemqConfig,
                                            big: tuple[str, list[Stored]]) -> None:
    topic, _ = big
    start, end = T0 + 10_000, T0 + 20_000          # message i has timestamp T0 + i // 2
    want = list(range(20_000, 40_000))
    by_option = read(spark, config, topic, startingTimestamp=str(start), endingTimestamp=str(end))
    assert keys_of(by_option) == want
    utc = dt.timezone.utc
    by_filter = read(spark, config, topic).filter(
        (F.col("timestamp") >= F.lit(dt.datetime.fromtimestamp(start / 1000, utc)))
        & (F.col("timestamp") < F.lit(dt.datetime.fromtimestamp(end / 1000, utc))))
    assert keys_of(by_filter) == want
    after = str(T0 + N)   # past the newest message: no batch is planned, and the read is empty, not an error
    assert read(spark, config, topic, startingTimestamp=after).count() == 0


def _digest(df: DataFrame) -> tuple[int, int, int]:
    h = F.xxhash64("key", "value", "headers", "timestamp")
    row = df.agg(F.count("*").alias("n"), F.sum(h % 1_000_003).alias("s"), F.bit_xor(h).alias("x")).collect()[0]
    return row.n, row.s, row.x


def test_s3list_mode_returns_the_same_rows(spark: SparkSession, config: MemqConfig,
                                           big: tuple[str, list[Stored]]) -> None:
    topic, _ = big
    assert _digest(read(spark, config, topic, mode="s3list")) == _digest(read(spark, config, topic))
    window = {"startingTimestamp": str(T0 + 10_000), "endingTimestamp": str(T0 + 20_000)}
    assert keys_of(read(spark, config, topic, mode="s3list", **window)) == list(range(20_000, 40_000))


def test_streaming_available_now_resumes_from_checkpoint(spark: SparkSession, config: MemqConfig,
                                                         tmp_path: Path) -> None:
    topic = f"spark-stream-{uuid.uuid4().hex[:8]}"
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run_query() -> int:
        stream = (spark.readStream.format("memq").options(**connection(config)).option("topic", topic)
                  .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "3").load())
        query = (stream.select("key", "partition", "offset").writeStream.format("parquet")
                 .option("path", str(out)).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(120)
        assert query.exception() is None
        return sum(1 for p in query.recentProgress if p["numInputRows"] > 0)

    write(config, topic, chunks_of(0, 700, 100))
    assert run_query() >= 3                         # 7 notifications, at most 3 per micro-batch
    assert keys_of(spark.read.parquet(str(out))) == list(range(700))
    write(config, topic, chunks_of(700, 1_200, 100))
    run_query()                                     # a new query on the same checkpoint
    assert keys_of(spark.read.parquet(str(out))) == list(range(1_200))   # no duplicates, no gaps
    run_query()                                     # nothing new: nothing read
    assert keys_of(spark.read.parquet(str(out))) == list(range(1_200))


def test_a_message_stored_in_two_objects_yields_its_rows_once(spark: SparkSession, config: MemqConfig,
                                                              tmp_path: Path) -> None:
    """A producer's retry stored by a second broker: two objects, likely on two read partitions."""
    from tests.support.cluster import records, write_batches

    from memq.client.consumer import notification_topic
    from memq.notify import TopicAdmin

    topic = f"spark-dups-{uuid.uuid4().hex[:8]}"
    TopicAdmin(config.kafka).create_topic(notification_topic(config, topic), PARTITIONS)
    retried = records(5, "retried")
    write_batches(config, topic, [[(7, 0, 0, records(3, "first")), (7, 0, 1, retried)],
                                  [(7, 0, 1, retried), (7, 0, 2, records(4, "last"))],
                                  [(8, 0, 1, records(2, "other"))]])
    want = sorted([f"{t}-{i}".encode() for t, n in (("first", 3), ("retried", 5), ("last", 4), ("other", 2))
                   for i in range(n)])
    df = read(spark, config, topic)
    assert sorted(r.key for r in df.select("key").collect()) == want
    assert df.select(*MESSAGE_ID_COLUMNS).distinct().count() == len(want)
    assert read(spark, config, topic, dropDuplicates="false").count() == len(want) + 5
    stream = (spark.readStream.format("memq").options(**connection(config)).option("topic", topic)
              .option("startingOffsets", "earliest").load())
    query = (stream.select("key").writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    assert query.awaitTermination(120) and query.exception() is None
    assert sorted(r.key for r in spark.read.parquet(str(tmp_path / "out")).collect()) == want


def test_deleted_batch_fails_or_is_skipped_and_reported(spark: SparkSession, config: MemqConfig) -> None:
    topic = f"spark-loss-{uuid.uuid4().hex[:8]}"
    stored = write(config, topic, chunks_of(0, 400, 100))
    gone = stored[2]

    async def delete() -> None:
        storage = make_storage(config)
        await storage.delete(gone.location)
        await storage.close()

    asyncio.run(delete())
    with pytest.raises(Exception, match=gone.location.key):
        read(spark, config, topic).count()
    assert keys_of(read(spark, config, topic, failOnDataLoss="false")) == \
        [i for i in range(400) if i not in range(gone.first, gone.first + gone.count)]
    logs = (spark.tvf.python_worker_logs().filter(F.col("logger") == "memq.spark")
            .filter(F.col("msg").contains(gone.location.key)).collect())
    assert logs and logs[0].level == "WARNING"


def damaged_kafka(records: Sequence[LogMessage], codec: Codec, producer_id: int, sequence: int) -> bytearray:
    """`encode`, but a batch holding k00000150 gets a record framing that does not add up
    (every CRC valid): only the columnar decode can tell it is corrupt."""
    if b"k%08d" % 150 not in {r.key for r in records}:
        return encode(records, codec, producer_id, sequence)
    kb = bytearray(record_batch(records))
    kb[KAFKA_BATCH_HEADER_SIZE] += 2          # the first record's length prefix claims one byte more
    struct.pack_into(">I", kb, 17, crc32c(bytes(kb[21:])))
    return encode_kafka_message(bytes(kb), verify_kafka_batch(bytes(kb)), producer_id=producer_id, epoch=0,
                                sequence=sequence)[0]


@pytest.mark.parametrize("codec", [Codec.ZSTD, Codec.ARROW, Codec.KAFKA], ids=lambda c: c.name)
def test_every_codec_reads_back_the_rows_written_and_a_corrupt_body_loses_only_its_object(
        spark: SparkSession, config: MemqConfig, codec: Codec) -> None:
    topic = f"spark-{codec.name.lower()}-{uuid.uuid4().hex[:8]}"
    ranges = chunks_of(0, 600, 100)
    asyncio.run(store_batches(config, topic, [[make_record(i) for i in r] for r in ranges], partitions=2,
                              codec=codec, encoder=damaged_kafka if codec is Codec.KAFKA else encode))
    rows = read(spark, config, topic, failOnDataLoss="false").select(
        "key", "value", "headers", F.unix_millis("timestamp").alias("ts")).collect()
    lost = range(100, 200) if codec is Codec.KAFKA else range(0)
    got = sorted((r.key, r.value, tuple((h.key, bytes(h.value)) for h in r.headers), r.ts) for r in rows)
    assert got == [(m.key, m.value, m.headers, m.timestamp_ms) for m in map(make_record, range(600))
                   if int(m.key[1:]) not in lost]
    if codec is Codec.KAFKA:
        with pytest.raises(Exception, match="is corrupt: Kafka"):
            read(spark, config, topic).count()


def test_a_user_schema_reads_only_its_columns(spark: SparkSession, config: MemqConfig,
                                              big: tuple[str, list[Stored]]) -> None:
    topic, _stored = big
    df = read_schema(spark, config, topic, "value binary, key binary, timestamp timestamp")
    assert df.columns == ["value", "key", "timestamp"]
    [row] = df.filter(F.col("key") == b"k%08d" % 4242).select("value", F.unix_millis("timestamp").alias("ts")).collect()
    assert (row.value, row.ts) == (make_record(4242).value, make_record(4242).timestamp_ms)
    assert df.count() == N
    with pytest.raises(Exception, match="schema column 'nope' is not one of key, value"):
        read_schema(spark, config, topic, "nope int").count()
    with pytest.raises(Exception, match="schema column 'offset' is int, the source gives bigint"):
        read_schema(spark, config, topic, "offset int").count()


def read_schema(spark: SparkSession, config: MemqConfig, topic: str, schema: str) -> DataFrame:
    return spark.read.format("memq").schema(schema).options(**connection(config)).option("topic", topic).load()


def test_clear_errors(spark: SparkSession, config: MemqConfig, big: tuple[str, list[Stored]]) -> None:
    topic, _ = big
    with pytest.raises(Exception, match="no-such-topic"):
        read(spark, config, "no-such-topic").count()
    with pytest.raises(Exception, match="startingOffsets"):
        read(spark, config, topic, startingOffsets="yesterday").count()
    t = time.monotonic()
    with pytest.raises(Exception, match="127.0.0.1:1"):
        (spark.read.format("memq").options(**connection(config))
         .options(**{"kafka.bootstrap.servers": "127.0.0.1:1", "kafka.request.timeout.ms": "2000"})
         .option("topic", topic).load().count())
    with pytest.raises(Exception, match="127.0.0.1:1"):
        (spark.read.format("memq").options(**connection(config))
         .options(**{"s3.endpoint": "http://127.0.0.1:1", "s3.maxAttempts": "1", "s3.connectTimeoutMs": "500"})
         .option("topic", topic).option("mode", "s3list").load().count())
    assert time.monotonic() - t < 60


@pytest.mark.parametrize("codec", ["zstd", "arrow"])
def test_real_producer_and_broker_discovery(spark: SparkSession, config: MemqConfig,
                                           codec: Literal["zstd", "arrow"]) -> None:
    """Messages sent by memq's Producer through a broker; the source finds Kafka and S3 via the broker.
    Arrow bodies (a producer option) read the same, in Spark and in a Consumer."""
    from memq.broker.server import Broker
    from memq.client.producer import Producer
    from memq.config import ProducerConfig, TopicConfig

    topic = f"spark-prod-{uuid.uuid4().hex[:8]}"
    broker_config = dataclasses.replace(config, topics=(TopicConfig(name=topic, read_partitions=2),))
    n = 50_000
    values = [b"value-%06d" % i for i in range(n)]
    keys = [b"key-%06d" % i for i in range(n)]
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    broker = Broker(broker_config)

    async def produce(url: str) -> None:
        producer = Producer(ProducerConfig(brokers=url, ack="all", codec=codec))
        try:
            for i in range(0, n, 10_000):
                await (await producer.send_many(topic, values[i:i + 10_000], keys=keys[i:i + 10_000],
                                                headers=[("source", b"producer")]))
        finally:
            await producer.close()

    try:
        url = asyncio.run_coroutine_threadsafe(broker.start(), loop).result(30)
        asyncio.run_coroutine_threadsafe(produce(url), loop).result(120)
        df = (spark.read.format("memq").option("memq.broker", url).option("topic", topic)
              .option("s3.accessKeyId", config.s3.access_key_id or "")
              .option("s3.secretAccessKey", config.s3.secret_access_key or "").load())
        rows = df.select("key", "value", "headers", "partition").collect()
        projected = read_schema(spark, broker_config, topic, "key binary, value binary").collect()
        reader = dataclasses.replace(broker_config, producer=ProducerConfig(brokers=url))   # where offsets stand
        consumed = read_memq(reader, topic, n) if codec == "arrow" else None
    finally:
        asyncio.run_coroutine_threadsafe(broker.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    assert sorted((r.key, r.value) for r in rows) == sorted(zip(keys, values))
    assert all([(h.key, bytes(h.value)) for h in r.headers] == [("source", b"producer")] for r in rows)
    assert {r.partition for r in rows} <= {0, 1}
    assert sorted((r.key, r.value) for r in projected) == sorted(zip(keys, values))
    assert consumed is None or (consumed.records, consumed.value_bytes) == (n, sum(map(len, values)))


@pytest.mark.parametrize("offsets", ["sparse", "dense"])
def test_a_compacted_topic_reads_each_keys_latest_value_then_the_tail(spark: SparkSession, config: MemqConfig,
                                                                      offsets: str, tmp_path: Path) -> None:
    """The compacted prefix (the parts the manifest lists) below its end, the plain tail after:
    rows keep the partition, offset and index of the record as produced; a tombstone reads null.
    On a dense topic the offsets are record numbers, those a Kafka client reads through a broker,
    and startingOffsets/endingOffsets inside the prefix cut it there."""
    from prometheus_client import CollectorRegistry
    from tests.support.cluster import write_batches
    from tests.support.kafka_clients import broker_thread, read_to_end

    from memq.compaction.manifest import ManifestPointers
    from memq.compaction.run import Compactor
    from memq.config import BrokerConfig, TopicConfig
    from memq.governor.registry import Registry
    from memq.notify import TopicAdmin

    cfg = TopicConfig(f"spark-cp-{uuid.uuid4().hex[:8]}", read_partitions=1, cleanup_policy="compact",
                      delete_retention_ms=3_600_000, min_cleanable_dirty_ratio=0.0, offsets=offsets)
    TopicAdmin(config.kafka).create_topic(cfg.notification_topic_for(config.cluster.name), 1)

    now = int(time.time() * 1000)       # tombstones stay delete_retention_ms past their timestamp

    def batch(n: int, keys: range, value: Callable[[int], bytes | None]) -> list:
        return [(7, 0, n, [LogMessage(value(k), b"k%02d" % k, (("n", b"%d" % n),), now + n)  # type: ignore[arg-type]
                           for k in keys])]
    # notifications 0, 1, 2: every key, then keys 0-29, then 0-9 (key 0 deleted); one index per key
    write_batches(config, cfg.name, [batch(0, range(50), lambda k: b"a%d" % k), batch(1, range(30), lambda k: b"b%d" % k),
                                     batch(2, range(10), lambda k: None if k == 0 else b"c%d" % k)])
    with Registry(config.zookeeper, config.cluster.name) as registry:
        done = asyncio.run(Compactor(config, ManifestPointers(registry), CollectorRegistry()).partition(cfg, 0))
    assert done.result == "swapped" and done.manifest is not None and done.manifest.end == 3
    write_batches(config, cfg.name, [batch(3, range(45, 52), lambda k: b"d%d" % k)])      # the plain tail

    def want(n: int, keys: range, value: Callable[[int], bytes | None], first: int = 0) -> list[Row]:
        return [(n, k - first, b"k%02d" % k, value(k)) for k in keys]
    prefix = (want(0, range(30, 50), lambda k: b"a%d" % k) + want(1, range(10, 30), lambda k: b"b%d" % k)
              + want(2, range(10), lambda k: None if k == 0 else b"c%d" % k))
    tail = want(3, range(45, 52), lambda k: b"d%d" % k, first=45)
    if offsets == "dense":   # record numbers: notifications of 50, 30, 10 and 7 records from offset 0, 50, 80, 90;
        bases = (0, 50, 80, 90)   # a survivor's index is its place among its part's survivors
        prefix = [(bases[n] + int(key[1:]), i, key, v) for i, (n, _, key, v) in enumerate(prefix)]
        tail = [(bases[n] + i, i, key, v) for n, i, key, v in tail]
    cases = ({"0": 1}, {"0": 2}, {"0": 3}, None) if offsets == "sparse" else ({"0": 55}, {"0": 80}, {"0": 90}, {"0": 65})
    with contextlib.ExitStack() as stack:
        options = {"zookeeper.hosts": config.zookeeper.hosts}
        if offsets == "dense":   # a broker tells where record offsets stand (and serves Kafka clients the prefix)
            zookeeper = dataclasses.replace(config.zookeeper, enabled=True)
            running = stack.enter_context(broker_thread(dataclasses.replace(config, broker=BrokerConfig(kafka_port=0),
                                                                            zookeeper=zookeeper)))
            asyncio.run_coroutine_threadsafe(running.broker.add_topic(cfg), running.loop).result(30)
            options["memq.broker"] = running.broker.url

        def rows(**more: str) -> list[Row]:
            df = read(spark, config, cfg.name, **options, **more)
            got = df.select("partition", "offset", "index", "key", "value").collect()
            assert {r.partition for r in got} <= {0}
            return sorted((r.offset, r["index"], r.key, r.value) for r in got)

        assert rows() == prefix + tail
        removed, stop, at_tail, inside = cases
        assert rows(startingOffsets=json.dumps(removed)) == prefix[20:] + tail   # from a compacted-away position
        assert rows(endingOffsets=json.dumps(stop)) == prefix[:40]              # a range wholly in the prefix
        assert rows(startingOffsets=json.dumps(at_tail)) == tail
        if inside is not None:                                                   # from a record inside a part
            assert rows(startingOffsets=json.dumps(inside)) == prefix[25:] + tail
            assert [(o, k, v) for o, _, k, v in prefix + tail] == read_to_end(running.broker.kafka_address, cfg.name, 0)
        latest = {k: v for _, _, k, v in rows()}
        assert len(latest) == 52 and latest[b"k00"] is None and latest[b"k47"] == b"d47" and latest[b"k20"] == b"b20"

        out = tmp_path / "stream"
        stream = (spark.readStream.format("memq").options(**connection(config)).option("topic", cfg.name)
                  .options(**options).option("startingOffsets", "earliest").load())
        query = (stream.select("offset", "index", "key").writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
        assert query.awaitTermination(120) and query.exception() is None
        assert sorted((r.offset, r["index"], r.key) for r in spark.read.parquet(str(out)).collect()) == \
            [(o, i, k) for o, i, k, _ in prefix + tail]


Row = tuple[int, int, bytes, bytes | None]
