"""What Spark's sink (`df.write.format("memq")`) wrote, read back by a Kafka consumer
(confluent-kafka) through a broker's Kafka listener with identical values, keys, headers and
timestamps, for the sink's Message codecs (zstd, the default, and arrow); and the source reading
only committed transactions of memq's Producer."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from tests.support.kafka_clients import Row, Running, as_rows, broker_thread, rows

from memq.client.producer import Producer as MemqProducer
from memq.config import BrokerConfig, ProducerConfig
from memq.devcluster import DevCluster

pytest.importorskip("pyspark")
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import types as T  # noqa: E402
from pyspark.sql.streaming.datasource import ReadMaxRows  # noqa: E402
from spark_source.datasource import MemqStreamReader  # noqa: E402
from spark_source.options import parse_options  # noqa: E402


pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]

PARTITIONS = 2
SCHEMA = T.StructType([
    T.StructField("value", T.BinaryType(), False),
    T.StructField("key", T.BinaryType(), True),
    T.StructField("headers", T.ArrayType(T.StructType([T.StructField("key", T.StringType(), False),
                                                       T.StructField("value", T.BinaryType(), True)])), True),
    T.StructField("timestamp", T.TimestampType(), False),
])


@pytest.fixture(scope="module")
def running(devcluster: DevCluster) -> Iterator[Running]:
    with broker_thread(dataclasses.replace(devcluster.config(cluster="sparkkafkaread"),
                                           broker=BrokerConfig(kafka_port=0))) as r:
        yield r


def kafka_read(address: str, topic: str, n: int) -> list[Row]:
    c = Consumer({"bootstrap.servers": address, "group.id": "unused", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 200})
    got: list[Row] = []
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                assert m.error() is None, m.error()
                got.append((m.value(), m.key(), tuple(m.headers() or ()), m.timestamp()[1]))
    finally:
        c.close()
    return got


@pytest.mark.parametrize("codec", ["zstd", "arrow"])
def test_records_spark_wrote_read_back_through_the_kafka_listener(spark: SparkSession, running: Running,
                                                                  codec: str, tmp_path: Path) -> None:
    topic = running.add_topic(partitions=PARTITIONS)
    sent = rows(2_000, f"spark-{codec}")
    config = tmp_path / "memq.toml"
    config.write_text(f'[producer]\ncodec = "{codec}"\n')
    df = spark.createDataFrame(
        [(r.value, r.key, [(k, v) for k, v in r.headers] or None,
          dt.datetime.fromtimestamp(r.timestamp_ms / 1000, dt.timezone.utc)) for r in sent], SCHEMA).repartition(2)
    (df.write.format("memq").option("memq.broker", running.broker.url).option("memq.config", str(config))
     .option("topic", topic).mode("append").save())
    assert sorted(kafka_read(running.broker.kafka_address, topic, len(sent))) == sorted(as_rows(sent))


def test_the_source_reads_committed_transactions_only(spark: SparkSession, running: Running) -> None:
    """Commit A, abort B (stored, acked, never published), commit C with memq's Producer: the
    `memq` source reads exactly A and C."""
    topic = running.add_topic(partitions=PARTITIONS)
    a, b, c = ([b"%s-%d" % (tag, i) for i in range(n)] for tag, n in ((b"a", 300), (b"b", 200), (b"c", 7)))

    async def write() -> None:
        cfg = ProducerConfig(brokers=running.broker.url, linger_ms=5, request_timeout_ms=20_000)
        async with MemqProducer(cfg, transactional_id=f"spark-{topic}") as p:
            for values, commit in ((a, True), (b, False), (c, True)):
                await p.begin()
                sent = await p.send_many(topic, values)
                await p.flush()
                await sent                        # B too: acked, pending, never to be read
                await (p.commit() if commit else p.abort())
    asyncio.run_coroutine_threadsafe(write(), running.loop).result(60)
    config = running.config
    df = (spark.read.format("memq").option("memq.broker", running.broker.url).option("topic", topic)
          .option("s3.accessKeyId", config.s3.access_key_id or "")
          .option("s3.secretAccessKey", config.s3.secret_access_key or "").load())
    assert sorted(bytes(r.value) for r in df.select("value").collect()) == sorted(a + c)


def test_dense_offsets_are_the_record_offsets_kafka_clients_read(spark: SparkSession, running: Running) -> None:
    """A dense 3-partition topic written by a Kafka producer to the partitions it names: Spark's
    `offset` column is each record's Kafka offset, and `startingOffsets`/`endingOffsets` in
    record offsets cut inside parts; a stream's offsets are record offsets too."""
    topic = running.add_topic(partitions=3, offsets="dense")
    p = Producer({"bootstrap.servers": running.broker.kafka_address, "linger.ms": 20, "acks": "all"})
    for i in range(150):
        p.produce(topic, b"v%d" % i, partition=i % 3)
        if i % 50 == 49:
            p.flush(30)   # several parts per partition
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": running.broker.kafka_address, "group.id": "unused",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 200})
    kafka: list[tuple[int, int, bytes]] = []
    try:
        c.assign([TopicPartition(topic, q, OFFSET_BEGINNING) for q in range(3)])
        deadline = time.monotonic() + 60
        while len(kafka) < 150 and time.monotonic() < deadline:
            kafka += [(m.partition(), m.offset(), m.value()) for m in c.consume(1000, 0.5) if m.error() is None]
    finally:
        c.close()

    options = {"memq.broker": running.broker.url, "topic": topic,
               "s3.accessKeyId": running.config.s3.access_key_id or "",
               "s3.secretAccessKey": running.config.s3.secret_access_key or ""}

    def read(**more: str) -> list[tuple[int, int, bytes]]:
        df = spark.read.format("memq").options(**options, **more).load()
        return sorted((r.partition, r.offset, bytes(r.value)) for r in df.select("partition", "offset", "value").collect())

    assert read() == sorted(kafka) and {o for q, o, _ in kafka if q == 0} == set(range(50))
    pushed = spark.read.format("memq").options(**options).load().filter("partition = 1 AND offset BETWEEN 20 AND 39")
    assert sorted(r.offset for r in pushed.select("offset").collect()) == list(range(20, 40))
    # from record 20 of partition 0 (inside a part), 5 to 30 of partition 2 (its end inside one too)
    assert read(startingOffsets='{"0": 20, "1": -1, "2": 5}', endingOffsets='{"0": -1, "1": -1, "2": 30}') == \
        sorted(r for r in kafka if (r[0] == 0 and r[1] >= 20) or (r[0] == 2 and 5 <= r[1] < 30))
    # a stream's offsets (its checkpoints) from record 20 of partition 0, 70 records a micro-batch: the first ends
    # inside parts, the last at each partition's record count (the reader's calls as Spark makes them, in-process)
    stream = MemqStreamReader(parse_options({**options, "startingOffsets": '{"0": 20, "1": 0, "2": 0}'}))
    try:
        start, ends, streamed = stream.initialOffset(), [], []
        stream.prepareForTriggerAvailableNow()
        while (end := stream.latestOffset(start, ReadMaxRows(70))) != start:
            ends.append(end)
            for task in stream.partitions(start, end):
                for batch in stream.read(task):
                    streamed += zip(*(batch.column(c).to_pylist() for c in ("partition", "offset", "value")))
            start = end
    finally:
        stream.stop()
    assert ends == [{"0": 43, "1": 23, "2": 24}, {"0": 50, "1": 50, "2": 50}]
    assert sorted(streamed) == sorted(r for r in kafka if r[0] != 0 or r[1] >= 20)
