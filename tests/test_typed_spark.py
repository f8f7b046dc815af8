"""Typed data end to end on a real cluster (moto S3, tansu Kafka, a memq broker serving the
registry): a topic whose producer goes through six Avro versions (add, delete, rename by alias,
int→long, a nested record), then an incompatible version and undecodable values, read by Spark
as typed columns (batch and streaming) with exact rows per version, and synced into one Iceberg
table that evolves with it (read back by pyiceberg and by Spark, its status shown by `memq table status`
and the dashboard), bad records in its _dlq, a
running sync stopping on a newer schema id before committing. One Spark session."""

from __future__ import annotations

import asyncio
import json
import dataclasses
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from memq.audit.dashboard import AuditThread
from memq.cli import main as memq_cli
from memq.client.producer import Producer
from memq.client.schemas import SchemaClient
from memq.client.serde import Serde
from memq.config import AuditConfig, MemqConfig
from memq.devcluster import DevCluster
from memq.devcluster.broker_process import config_toml
from tests.support.cluster import producer_config, topic_config
from tests.support.inproc import broker_in_thread
from tests.support.spark import connection
from tests.support.typed_versions import INCOMPATIBLE, MERGED_COLUMNS, READ, VERSIONS, WRITTEN

pytest.importorskip("pyspark")
pytest.importorskip("pyiceberg")
from pyspark.sql import SparkSession  # noqa: E402

from pyiceberg.table import Table  # noqa: E402
from pyspark.errors import StreamingQueryException  # noqa: E402

from spark_source.iceberg import TableSync, dead_letters, open_catalog, read_table, sync_topic  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]

BAD = {b"bad-garbage": b"garbage", b"bad-truncated": b"\0\0\0\0\x01\x02"}   # key → a value that does not decode


@dataclass(frozen=True)
class Cluster:
    url: str                          # the broker (and its registry)
    config: MemqConfig
    topics: tuple[str, str]           # one read by Spark, one synced into a table


@dataclass(frozen=True)
class Topic:
    name: str
    url: str
    config: MemqConfig
    ids: dict[int, int]               # version → schema id; 7: the incompatible one


def produce(cluster: Cluster, name: str, versions: list[int], bad: dict[bytes, bytes]) -> dict[int, int]:
    """Register `versions` (7: INCOMPATIBLE) of `<name>-value` in order and send one record of
    each (key b"v<version>"), then the `bad` values; version → schema id."""
    pc = cluster.config.producer
    SchemaClient(pc).call("PUT", f"/config/{name}-value", {"compatibility": "NONE"})
    serde = Serde(pc)
    texts = {**VERSIONS, 7: INCOMPATIBLE}
    written = {**WRITTEN, 7: {"id": "seven", "title": "t", "note": None, "address": None}}
    values = {b"v%d" % v: serde.serializer(f"{name}-value", texts[v])(written[v]) for v in versions}

    async def send() -> None:
        async with Producer(pc) as p:
            for key, value in {**values, **bad}.items():
                await (await p.send(name, value, key=key))
    asyncio.run(send())
    return {v: int.from_bytes(values[b"v%d" % v][1:5], "big") for v in versions}


@pytest.fixture(scope="module")
def cluster(devcluster: DevCluster) -> Iterator[Cluster]:
    names = (f"typed-{uuid.uuid4().hex[:8]}", f"typedtbl-{uuid.uuid4().hex[:8]}")
    config = dataclasses.replace(devcluster.config(cluster="typedtest", topics=[
        topic_config(n, read_partitions=2) for n in names]), audit=AuditConfig(enabled=False))
    with broker_in_thread(config, notify=True) as url:
        yield Cluster(url, dataclasses.replace(config, producer=producer_config(url, linger_ms=1)), names)


@pytest.fixture(scope="module")
def topic(cluster: Cluster) -> Topic:
    name = cluster.topics[0]
    return Topic(name, cluster.url, cluster.config, produce(cluster, name, [*VERSIONS, 7], BAD))


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

    with pytest.raises(Exception, match=r"UndecodableRecordError: topic typed-\w+ partition \d offset \d+ index \d+"):
        spark.read.format("memq").options(**options(topic)).load().collect()   # onError=fail, the default


def test_a_typed_stream_reads_the_same_rows_and_skips_the_bad_ones(spark: SparkSession, topic: Topic,
                                                                   tmp_path: Any) -> None:
    got: list[Any] = []
    query = (spark.readStream.format("memq").options(**options(topic, onError="skip", startingOffsets="earliest"))
             .load().select("key", "value").writeStream
             .foreachBatch(lambda df, _: got.extend(df.collect()))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert query.awaitTermination(120) is not False and query.exception() is None
    rows = by_key(got)
    assert {k: r["value"].asDict(recursive=True) for k, r in rows.items()} == {b"v%d" % v: READ[v] for v in VERSIONS}


def test_a_topic_through_every_version_becomes_one_evolving_table_with_bad_records_in_its_dlq(
        spark: SparkSession, cluster: Cluster, tmp_path: Path) -> None:
    name = cluster.topics[1]
    spec = TableSync(topic=name, table="memq.typed", checkpoint=str(tmp_path / "ck"), typed=True,
                     catalog={"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                              "warehouse": f"file://{tmp_path}/warehouse"},
                     source={**connection(cluster.config), "memq.broker": cluster.url})

    def sync() -> Table:
        query = sync_topic(spark, spec)
        assert query.awaitTermination(120) is not False and query.exception() is None
        return open_catalog(spec.catalog).load_table(spec.table)

    produce(cluster, name, [1, 2, 3], {})
    first = sync().schema()
    assert [(f.name, str(f.field_type)) for f in first.fields][-4:] == [
        ("id", "int"), ("name", "string"), ("amount", "float"), ("note", "string")]
    ids = {f.name: f.field_id for f in first.fields}

    running = sync_topic(spark, dataclasses.replace(spec, trigger_s=0.5))   # a sync that keeps running ...
    produce(cluster, name, [4, 5, 6, 7], BAD)                               # ... meets ids newer than it
    with pytest.raises(StreamingQueryException, match="SchemaChangedError"):
        running.awaitTermination(60)
    assert open_catalog(spec.catalog).load_table(spec.table).scan().to_arrow().num_rows == 3   # nothing committed
    table = sync()                                                          # restarted: the new read schema
    now = table.schema()
    assert [(f.name, str(f.field_type)) for f in now.fields][-5:] == [
        ("id", "long"), ("title", "string"), ("amount", "float"), ("note", "string"),
        ("address", "struct<17: city: optional string, 18: zip: optional int>")]
    assert (now.find_field("id").field_id, now.find_field("title").field_id, now.find_field("amount").field_id) == \
        (ids["id"], ids["name"], ids["amount"])                      # renamed and promoted in place
    expected = {b"v%d" % v: READ[v] for v in VERSIONS}
    got = by_key(table.scan().to_arrow().to_pylist())                # pyarrow over the current data files
    assert {k: {c: r[c] for c in MERGED_COLUMNS} for k, r in got.items()} == expected
    assert all(r["topic"] == name and r["partition"] in (0, 1) and r["timestamp"] is not None for r in got.values())
    in_spark = by_key([r.asDict(recursive=True) for r in read_table(spark, table).collect()])
    assert {k: {c: r[c] for c in MERGED_COLUMNS} for k, r in in_spark.items()} == expected

    dlq = open_catalog(spec.catalog).load_table(spec.dlq).scan().to_arrow().to_pylist()
    letters = {r["key"]: r for r in dlq}
    assert sorted(letters) == [b"bad-garbage", b"bad-truncated", b"v7"]
    assert letters[b"bad-garbage"]["value"] == b"garbage" and letters[b"bad-garbage"]["schemaId"] is None
    assert "incompatible with the read schema" in letters[b"v7"]["error"]
    assert letters[b"bad-truncated"]["error"].startswith(f"schema id {letters[b'bad-truncated']['schemaId']}: does not")
    assert all(r["partition"] in (0, 1) and r["offset"] is not None for r in dlq)
    assert dead_letters(table, spec.id) == 3

    again = sync()                                                   # nothing new: nothing added
    assert again.scan().to_arrow().num_rows == len(VERSIONS)
    assert open_catalog(spec.catalog).load_table(spec.dlq).scan().to_arrow().num_rows == 3
    assert [f.name for f in again.spec().fields] == ["timestamp_hour"]

    config_file = tmp_path / "memq.toml"
    config_file.write_text(config_toml(cluster.config))
    run = CliRunner().invoke(memq_cli, ["--config", str(config_file), "table", "status", name, "--table", spec.table,
                                        "--json", *(f"--catalog-prop={k}={v}" for k, v in spec.catalog.items())])
    assert run.exit_code == 0, run.output
    status = json.loads(run.stdout)
    assert (status["rows"], status["dead_letters"], status["schema_version"], status["lag"],
            status["lag_unit"], status["lag_s"]) == (len(VERSIONS), 3, 6, 0, "notifications", 0.0)

    audit = dataclasses.replace(cluster.config, audit=AuditConfig(db_path=str(tmp_path / "audit.db")))
    with AuditThread(audit, port=0) as dashboard:                    # what the sync reported, beside its lag now
        with urllib.request.urlopen(f"{dashboard.url}api/tables", timeout=60) as resp:
            shown = {r["table"]: r for r in json.load(resp)["tables"]}
    assert {k: shown[spec.table][k] for k in ("rows", "dead_letters", "schema_version", "lag", "lag_unit", "lag_s",
                                              "topic", "error")} == \
        {"rows": len(VERSIONS), "dead_letters": 3, "schema_version": 6, "lag": 0, "lag_unit": "notifications",
         "lag_s": 0.0, "topic": name, "error": None}
