"""Spark writes into memq: `df.write.format("memq")` and `df.writeStream.format("memq")` through a
real broker process; read back with memq's Consumer and with Spark. A replayed micro-batch
re-sends the same Messages under the same ids, so it is stored and delivered once."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.spark import store_batches
from memq.client.consumer import Consumer
from memq.config import MemqConfig, TopicConfig
from memq.devcluster import DevCluster
from memq.devcluster.broker_process import BrokerProcess
from memq.errors import ConfigError
from memq.format import LogMessage
from tests.support.cluster import read_stored

pytest.importorskip("pyspark")
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402


pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]

TOPICS = ("sink-a", "sink-b", "sink-s")


@pytest.fixture(scope="module")
def cluster(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MemqConfig, str]]:
    suffix = uuid.uuid4().hex[:6]
    config = devcluster.config(cluster=f"w{suffix}", topics=[TopicConfig(t, batch_ms=50, read_partitions=2)
                                                             for t in TOPICS])
    with BrokerProcess(config, tmp_path_factory.mktemp("sink-broker")) as broker:
        # the readers name the broker: it tells them where the topics' (dense) offsets stand
        yield dataclasses.replace(config, producer=dataclasses.replace(config.producer, brokers=broker.url)), broker.url


def consume(config: MemqConfig, topic: str, expect: int, *, dedup: bool = True) -> list:
    cc = dataclasses.replace(config.consumer, group_id=f"g-{uuid.uuid4().hex[:6]}", auto_offset_reset="earliest",
                             dedup=dedup)
    got: list = []
    with Consumer(dataclasses.replace(config, consumer=cc), topic) as c:
        deadline = time.monotonic() + 60
        while len(got) < expect and time.monotonic() < deadline:
            got.extend(c.poll(0.5))
        got.extend(c.poll(2.0))                     # anything beyond `expect` (a duplicate) shows here
    return got


def test_batch_write_with_keys_headers_timestamps_and_a_topic_column(spark: SparkSession,
                                                                    cluster: tuple[MemqConfig, str]) -> None:
    config, url = cluster
    t0 = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    df = (spark.range(3000).select(
        F.concat(F.lit("v"), F.col("id").cast("string")).alias("value"),
        F.concat(F.lit("k"), F.col("id").cast("string")).cast("binary").alias("key"),
        F.when(F.col("id") % 2 == 0, "sink-a").otherwise("sink-b").alias("topic"),
        F.array(F.struct(F.lit("n").alias("key"), F.col("id").cast("string").cast("binary").alias("value")))
         .alias("headers"),
        (F.lit(t0) + F.make_interval(secs=F.col("id").cast("int"))).alias("timestamp"))
        .repartition(3))
    df.write.format("memq").option("memq.broker", url).mode("append").save()
    a = consume(config, "sink-a", 1500)
    b = consume(config, "sink-b", 1500)
    assert sorted(int(r.value[1:]) for r in a) == list(range(0, 3000, 2))
    assert sorted(int(r.value[1:]) for r in b) == list(range(1, 3000, 2))
    r = next(r for r in a if r.value == b"v42")
    assert r.key == b"k42" and list(r.headers) == [("n", b"42")]
    assert r.timestamp_ms == int(t0.timestamp() * 1000) + 42_000
    back = (spark.read.format("memq").option("kafka.bootstrap.servers", config.kafka.bootstrap_servers)
            .option("cluster", config.cluster.name).option("s3.endpoint", config.s3.endpoint_url)
            .option("s3.bucket", config.s3.bucket).option("s3.accessKeyId", config.s3.access_key_id)
            .option("s3.secretAccessKey", config.s3.secret_access_key).option("topic", "sink-b").load())
    assert back.count() == 1500


def test_bad_writes_fail_on_the_driver_with_clear_errors(spark: SparkSession, cluster: tuple[MemqConfig, str]) -> None:
    _, url = cluster
    df = spark.range(3).select(F.col("id").cast("string").alias("value"))
    with pytest.raises(Exception, match="set option topic"):
        df.write.format("memq").option("memq.broker", url).mode("append").save()
    with pytest.raises(Exception, match="append-only"):
        df.write.format("memq").option("memq.broker", url).option("topic", "sink-a").mode("overwrite").save()
    with pytest.raises(Exception, match="needs a 'value' column"):
        spark.range(3).write.format("memq").option("memq.broker", url).option("topic", "sink-a").mode("append").save()
    with pytest.raises(Exception, match="UnknownTopicError|not hosted"):
        df.write.format("memq").option("memq.broker", url).option("topic", "nope").mode("append").save()
    assert issubclass(ConfigError, Exception)


def test_a_replayed_micro_batch_is_delivered_once(spark: SparkSession, cluster: tuple[MemqConfig, str],
                                                  tmp_path: Path) -> None:
    config, url = cluster
    source = f"src-{uuid.uuid4().hex[:6]}"
    rows = [[LogMessage(value=b"s%05d" % i, key=None, headers=(), timestamp_ms=1_700_000_000_000 + i)
             for i in range(j, j + 100)] for j in range(0, 1000, 100)]
    asyncio.run(store_batches(config, source, rows, partitions=2))
    checkpoint = tmp_path / "ck"

    def run() -> None:
        stream = (spark.readStream.format("memq").option("kafka.bootstrap.servers", config.kafka.bootstrap_servers)
                  .option("cluster", config.cluster.name).option("s3.endpoint", config.s3.endpoint_url)
                  .option("s3.bucket", config.s3.bucket).option("s3.accessKeyId", config.s3.access_key_id)
                  .option("s3.secretAccessKey", config.s3.secret_access_key).option("topic", source)
                  .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "5").load())
        query = (stream.select("value").writeStream.format("memq").option("memq.broker", url)
                 .option("topic", "sink-s").option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(180) is not False and query.exception() is None

    run()
    commits = sorted((checkpoint / "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    last = [p for p in commits if p.name.isdigit()][-1]
    last.unlink()                                   # as if the job died after writing, before its commit
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    run()                                           # restart from the checkpoint: that batch runs again
    assert last.exists()                            # ... and was committed this time
    stored, dups, _keys = asyncio.run(read_stored(config, "sink-s"))
    # the replay re-sent the same Messages under the same ids: the broker's resend de-duplication
    # dropped them (with random ids they would be stored twice and delivered twice)
    assert len(stored) == 1000 and not dups
    once = consume(config, "sink-s", 1000)
    assert sorted(r.value for r in once) == [b"s%05d" % i for i in range(1000)]
