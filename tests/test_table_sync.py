"""A memq topic synced into an Iceberg table (pyiceberg, SQLite catalog) by a Spark streaming job
whose executors write the data files: exactly the topic's rows, partitioned by hour, and exactly
once across a crash between the Iceberg commit and Spark's own commit, and across a SIGKILL of
the whole job at each step of a batch."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench.spark import store_batches
from memq.cli import main as cli
from memq.config import MemqConfig
from memq.devcluster import DevCluster
from memq.devcluster.broker_process import config_toml
from memq.format import LogMessage
from tests.support.killed import kill_at_marker
from tests.support.spark import connection

pytest.importorskip("pyspark")
pytest.importorskip("pyiceberg")
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.errors import StreamingQueryException  # noqa: E402

from spark_source.iceberg import TableSync, committed_batches, default_catalog, open_catalog, sync_topic  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]

T0 = 1_700_000_000_000          # 2023-11-14T22:13:20Z
HOUR = 3_600_000


def record(i: int) -> LogMessage:
    value = json.dumps({"id": i, "name": f"n{i}"}).encode()
    return LogMessage(value=value, key=b"k%06d" % i, headers=(("h", b"%d" % i),), timestamp_ms=T0 + i * HOUR // 100)


def write(config: MemqConfig, topic: str, start: int, stop: int, per_batch: int = 50) -> None:
    batches = [[record(i) for i in range(j, min(j + per_batch, stop))] for j in range(start, stop, per_batch)]
    asyncio.run(store_batches(config, topic, batches, partitions=2))


@pytest.fixture(scope="module")
def config(devcluster: DevCluster) -> MemqConfig:
    return devcluster.config(cluster="tabletest")


def test_topic_becomes_an_hour_partitioned_table_on_memqs_s3_with_json_columns(
        spark: SparkSession, config: MemqConfig, tmp_path: Path) -> None:
    topic = f"tbl-{uuid.uuid4().hex[:8]}"
    write(config, topic, 0, 500)
    spec = TableSync(topic=topic, table=f"memq.{topic.replace('-', '_')}", checkpoint=str(tmp_path / "ck"),
                     catalog=default_catalog(config, str(tmp_path)), source=connection(config),
                     value_schema="id INT, name STRING")
    query = sync_topic(spark, spec)
    assert query.awaitTermination(180) is not False and query.exception() is None
    table = open_catalog(spec.catalog).load_table(spec.table)
    assert table.location().startswith(f"s3://{config.s3.bucket}/tables/")
    got = table.scan().to_arrow()
    assert got.num_rows == 500
    assert sorted(got["id"].to_pylist()) == list(range(500))
    by_id = {r["id"]: r for r in got.select(["id", "name", "key", "headers", "timestamp"]).to_pylist()}
    assert by_id[123]["name"] == "n123" and by_id[123]["key"] == b"k000123"
    assert by_id[123]["headers"] == [{"key": "h", "value": b"123"}]
    assert int(by_id[123]["timestamp"].timestamp() * 1000) == T0 + 123 * HOUR // 100
    assert [f.name for f in table.spec().fields] == ["timestamp_hour"]
    hours = {f.file.partition[0] for f in table.scan().plan_files()}
    assert len(hours) == 6                           # 500 rows over 5 hours of timestamps: 6 hour buckets
    ends = {}
    for e in committed_batches(table, spec.id).values():
        ends.update(e)
    assert sum(ends.values()) == 10                  # 10 notifications over 2 partitions, all committed


def test_a_crash_after_the_iceberg_commit_and_a_restart_still_give_exactly_n_rows(
        spark: SparkSession, config: MemqConfig, tmp_path: Path) -> None:
    topic = f"tblx-{uuid.uuid4().hex[:8]}"
    write(config, topic, 0, 400)
    spec = TableSync(topic=topic, table="memq.crashy", checkpoint=str(tmp_path / "ck"),
                     catalog={"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                              "warehouse": f"file://{tmp_path}/warehouse"},
                     source={**connection(config), "maxOffsetsPerTrigger": "3"})

    def crash_after_second(step: str, batch_id: int) -> None:   # committed to Iceberg, not to Spark's log
        if step == "committed" and batch_id == 1:
            raise RuntimeError("crash between the Iceberg commit and Spark's commit")

    first = sync_topic(spark, spec, step=crash_after_second)
    with pytest.raises(StreamingQueryException, match="crash between"):
        first.awaitTermination(180)
    table = open_catalog(spec.catalog).load_table(spec.table)
    assert sorted(committed_batches(table, spec.id)) == [0, 1]
    write(config, topic, 400, 600)                   # more arrives while the job is down
    again = sync_topic(spark, spec)                  # same checkpoint: Spark replays batch 1
    assert again.awaitTermination(180) is not False and again.exception() is None
    table.refresh()
    keys = table.scan(selected_fields=("key",)).to_arrow()["key"].to_pylist()
    assert sorted(keys) == [b"k%06d" % i for i in range(600)]            # exactly once
    files = [f.file.file_path.removeprefix("file://") for f in table.scan().plan_files()]
    assert spark.read.parquet(*files).count() == 600                      # Spark reads the data files


def test_cli_table_sync_available_now(spark: SparkSession, config: MemqConfig, tmp_path: Path) -> None:
    """`memq table sync` in this process: it uses the session it finds and leaves it running (a
    separate process would start a JVM of its own)."""
    topic = f"tblc-{uuid.uuid4().hex[:8]}"
    write(config, topic, 0, 120)
    config_file = tmp_path / "memq.toml"
    config_file.write_text(config_toml(config))
    run = CliRunner().invoke(cli, ["--config", str(config_file), "table", "sync", topic, "--table", "memq.cli_t",
                                   "--dir", str(tmp_path / "tables"), "--available-now"])
    assert run.exit_code == 0, run.output[-3000:]
    assert "120 rows" in run.stdout and "memq.cli_t" in run.stdout, run.stdout
    assert spark.range(2).count() == 2   # the caller's session still runs
    table = open_catalog(default_catalog(config, str(tmp_path / "tables"))).load_table("memq.cli_t")
    assert table.scan().to_arrow().num_rows == 120


#: A table sync in its own process (argv: the TableSync as JSON, a step, the marker file) that
#: stops at that step of its first batch (`iceberg_write.Step`) and waits there to be SIGKILLed with its
#: JVM and Python workers. The step's arguments are bound as defaults: the hook runs in the tasks.
_KILLED_SYNC = """
import json, os, sys, time
from pathlib import Path
from spark_source import local_session
from spark_source.iceberg import TableSync, sync_topic

def step(name, batch_id, at=sys.argv[2], marker=sys.argv[3]):
    if name == at:
        Path(marker).write_text(str(os.getpgid(0)))
        time.sleep(600)
spark = local_session("memq-killed-sync", conf={"spark.sql.shuffle.partitions": "2"})
sync_topic(spark, TableSync(**json.loads(sys.argv[1])), step=step).awaitTermination()
"""


def data_files(warehouse: Path) -> set[str]:
    return {f"file://{p}" for p in warehouse.rglob("*.parquet")}


@pytest.mark.slow   # a Spark job of its own per kill (40-100 s each): `python -m bench soak`
@pytest.mark.parametrize("step", ["write", "written", "commit", "committed"])
def test_a_sync_sigkilled_at_a_step_of_a_batch_then_rerun_holds_each_row_once(
        spark: SparkSession, config: MemqConfig, tmp_path: Path, step: str) -> None:
    """Killed in a task before or after it wrote its data files, or on the driver before or after
    the commit: the rerun commits each row once; the killed batch's files are orphans, never committed."""
    topic = f"tblk-{uuid.uuid4().hex[:8]}"
    write(config, topic, 0, 200)
    spec = TableSync(topic=topic, table="memq.killed", checkpoint=str(tmp_path / "ck"),
                     catalog={"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                              "warehouse": f"file://{tmp_path}/warehouse"}, source=connection(config))
    marker = tmp_path / f"{step}.reached"
    kill_at_marker([sys.executable, "-c", _KILLED_SYNC, json.dumps(dataclasses.asdict(spec)), step, str(marker)],
                   marker, timeout_s=180)
    table = open_catalog(spec.catalog).load_table(spec.table)
    assert list(committed_batches(table, spec.id)) == ([0] if step == "committed" else [])
    committed = {t.file.file_path for t in table.scan().plan_files()}
    orphans = data_files(tmp_path / "warehouse") - committed
    assert bool(orphans) == (step in ("written", "commit"))      # written by the killed batch, in no snapshot

    again = sync_topic(spark, spec)                                # the same checkpoint: Spark replays batch 0
    assert again.awaitTermination(180) is not False and again.exception() is None
    table.refresh()
    keys = table.scan(selected_fields=("key",)).to_arrow()["key"].to_pylist()
    assert sorted(keys) == [b"k%06d" % i for i in range(200)]     # rows == produced, no duplicates
    assert not orphans & {t.file.file_path for t in table.scan().plan_files()}
