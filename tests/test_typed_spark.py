"""Typed data end to end on a real cluster (moto S3, tansu Kafka, a memq broker serving the
registry): a topic whose producer goes through six Avro versions (add, delete, rename by alias,
int→long, a nested record), then an incompatible version and undecodable values, read by Spark
as typed columns (batch and streaming) with exact rows per version. One Spark session."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from memq.client.producer import Producer
from memq.client.schemas import SchemaClient
from memq.client.serde import Serde
from memq.config import AuditConfig, MemqConfig
from memq.devcluster import DevCluster
from tests.support.cluster import producer_config, topic_config
from tests.support.inproc import broker_in_thread
from tests.support.spark import connection
from tests.support.typed_versions import INCOMPATIBLE, READ, VERSIONS, WRITTEN

pytest.importorskip("pyspark")
from pyspark.sql import SparkSession  # noqa: E402

from spark_source import local_session  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]

BAD = {b"bad-garbage": b"garbage", b"bad-truncated": b"\0\0\0\0\x01\x02"}   # key → a value that does not decode


@dataclass(frozen=True)
class Topic:
    name: str
    url: str                          # the broker (and its registry)
    config: MemqConfig
    ids: dict[int, int]               # version → schema id; 7: the incompatible one


@pytest.fixture(scope="module")
def topic(devcluster: DevCluster) -> Iterator[Topic]:
    name = f"typed-{uuid.uuid4().hex[:8]}"
    config = dataclasses.replace(devcluster.config(cluster="typedtest", topics=[topic_config(name, read_partitions=2)]),
                                 audit=AuditConfig(enabled=False))
    with broker_in_thread(config, notify=True) as url:
        pc = producer_config(url, linger_ms=1)
        SchemaClient(pc).call("PUT", f"/config/{name}-value", {"compatibility": "NONE"})
        serde = Serde(pc)
        writers = {v: serde.serializer(f"{name}-value", text) for v, text in {**VERSIONS, 7: INCOMPATIBLE}.items()}
        values = {b"v%d" % v: writers[v](WRITTEN[v]) for v in VERSIONS}
        values[b"v7"] = writers[7]({"id": "seven", "title": "t", "note": None, "address": None})
        values.update(BAD)

        async def produce() -> None:
            async with Producer(pc) as p:
                for key, value in values.items():
                    await (await p.send(name, value, key=key))
        asyncio.run(produce())
        ids = {v: int.from_bytes(values[b"v%d" % v][1:5], "big") for v in (*VERSIONS, 7)}
        yield Topic(name, url, dataclasses.replace(config, producer=pc), ids)


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = local_session("memq-typed-tests", "local[2]", {"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


def options(t: Topic, **more: str) -> dict[str, str]:
    return {**connection(t.config), "memq.broker": t.url, "topic": t.name, "valueFormat": "registry", **more}


def by_key(rows: list[Any]) -> dict[bytes, Any]:
    return {bytes(r["key"]): r for r in rows}


def test_spark_reads_every_version_as_the_merged_columns_and_names_what_does_not_decode(
        spark: SparkSession, topic: Topic) -> None:
    df = spark.read.format("memq").options(**options(topic, onError="null")).load()
    assert df.schema["value"].dataType.simpleString() == (
        "struct<id:bigint,title:string,amount:float,note:string,address:struct<city:string,zip:int>>")
    rows = by_key(df.select("key", "value", "valueSchemaId", "valueError", "rawValue").collect())
    assert len(rows) == len(VERSIONS) + 1 + len(BAD)
    for v in VERSIONS:
        row = rows[b"v%d" % v]
        assert row["value"].asDict(recursive=True) == READ[v] and row["valueError"] is None
        assert row["valueSchemaId"] == topic.ids[v]
    assert rows[b"v7"]["value"] is None and "incompatible with the read schema: field id: long → string" in \
        rows[b"v7"]["valueError"]
    assert rows[b"bad-garbage"]["valueError"] == "not framed: no magic byte 0 and schema id"
    assert rows[b"bad-truncated"]["valueError"].startswith(f"schema id {topic.ids[1]}: does not decode")
    assert bytes(rows[b"bad-garbage"]["rawValue"]) == b"garbage"

    skipped = spark.read.format("memq").options(**options(topic, onError="skip")).load()
    assert sorted(bytes(r["key"]) for r in skipped.select("key").collect()) == sorted(b"v%d" % v for v in VERSIONS)
    with pytest.raises(Exception, match="UndecodableRecordError|does not decode|not framed|incompatible"):
        spark.read.format("memq").options(**options(topic)).load().collect()   # onError=fail, the default


def test_a_typed_stream_reads_the_same_rows(spark: SparkSession, topic: Topic, tmp_path: Any) -> None:
    got: list[Any] = []
    query = (spark.readStream.format("memq").options(**options(topic, onError="skip", startingOffsets="earliest"))
             .load().select("key", "value").writeStream
             .foreachBatch(lambda df, _: got.extend(df.collect()))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert query.awaitTermination(120) is not False and query.exception() is None
    rows = by_key(got)
    assert {k: r["value"].asDict(recursive=True) for k, r in rows.items()} == {b"v%d" % v: READ[v] for v in VERSIONS}
