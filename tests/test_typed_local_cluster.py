"""Typed reads and the typed table sync on Spark's `local-cluster` (two executor JVMs, apart from
the driver's): what runs in the tasks (decoding registered Avro values, writing the Iceberg data
files) runs in the executors' Python workers, which import memq through
`spark.executorEnv.PYTHONPATH`, and gives the same exact rows as in local mode. A Spark job of
its own in a subprocess (one SparkContext per process, and this one's is local): a soak."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import memq
from memq.client.producer import Producer
from memq.client.serde import Serde
from memq.config import AuditConfig, MemqConfig
from memq.devcluster import DevCluster
from tests.support.cluster import producer_config, topic_config
from tests.support.inproc import broker_in_thread
from tests.support.spark import connection
from tests.support.typed_versions import VERSIONS

pytest.importorskip("pyspark")
pytest.importorskip("pyiceberg")
import pyarrow.parquet as pq  # noqa: E402

from spark_source.iceberg import TableSync, open_catalog  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

N = 4000            # records: the first half written with version 1, the rest with version 2 (adds note)

#: The job (argv: the read's options, the TableSync, an output directory, memq's root): on
#: local-cluster[2,1,1024], a typed read written as Parquet, then an available-now typed sync.
#: Its last line of stdout: the tasks each executor completed in each part; the sync's task hook
#: notes, in every task that wrote data files, the executor JVM it runs under (its process's
#: ancestor started with `--executor-id`; none under the driver).
_JOB = """
import json, os, sys, time
from pathlib import Path
from spark_source import local_session
from spark_source.iceberg import TableSync, sync_topic

out = Path(sys.argv[3])

def executor_id():
    pid = os.getpid()
    while pid > 1:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\\0")
        if b"--executor-id" in args:
            return args[args.index(b"--executor-id") + 1].decode()
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return None

def step(name, batch_id, log=str(out / "written.jsonl")):
    if name == "written":
        with open(log, "a") as f:
            f.write(json.dumps(executor_id()) + "\\n")

spark = local_session("memq-local-cluster", "local-cluster[2,1,1024]",
                      {"spark.executorEnv.PYTHONPATH": sys.argv[4], "spark.sql.shuffle.partitions": "2"})
sc = spark.sparkContext._jsc.sc()
deadline = time.monotonic() + 180
while len(sc.statusTracker().getExecutorInfos()) < 3:      # the driver and both executors
    assert time.monotonic() < deadline, "the executors did not register"
    time.sleep(0.5)

def tasks():
    sc.listenerBus().waitUntilEmpty()
    found = sc.statusStore().executorList(True)
    return {found.apply(i).id(): found.apply(i).completedTasks() for i in range(found.size())}

def since(before):
    return {k: v - before.get(k, 0) for k, v in tasks().items()}

before = tasks()
(spark.read.format("memq").options(**json.loads(sys.argv[1])).load()
 .select("key", "partition", "value.*", "valueSchemaId", "valueError").write.parquet(str(out / "read")))
read = since(before)
before = tasks()
query = sync_topic(spark, TableSync(**json.loads(sys.argv[2])), step=step)
query.awaitTermination()
assert query.exception() is None, query.exception()
print(json.dumps({"read": read, "sync": since(before)}))
spark.stop()
"""


@dataclass(frozen=True)
class Topic:
    name: str
    url: str                          # the broker (and its registry)
    config: MemqConfig
    ids: tuple[int, int]              # the schema ids of versions 1 and 2


def value(i: int) -> dict[str, object]:
    v1 = {"id": i, "name": f"n{i}", "amount": i / 4}
    return v1 if i < N // 2 else {**v1, "note": f"note{i}"}


@pytest.fixture(scope="module")
def topic(devcluster: DevCluster) -> Iterator[Topic]:
    """N records of two registered versions on two read partitions, through a broker with the registry."""
    name = f"typedlc-{uuid.uuid4().hex[:8]}"
    config = dataclasses.replace(devcluster.config(cluster="typedlc", topics=[topic_config(name, read_partitions=2)]),
                                 audit=AuditConfig(enabled=False))
    with broker_in_thread(config, notify=True) as url:
        pc = producer_config(url, linger_ms=20)
        serde = Serde(pc)
        old, new = serde.serializer(f"{name}-value", VERSIONS[1]), serde.serializer(f"{name}-value", VERSIONS[2])
        values = [(old if i < N // 2 else new)(value(i)) for i in range(N)]

        async def send() -> None:   # in rounds acked one by one: batch objects enough for a task per executor
            async with Producer(pc) as p:
                for start in range(0, N, N // 8):
                    await asyncio.gather(*[await p.send(name, values[i], key=b"k%05d" % i)
                                           for i in range(start, start + N // 8)])
        asyncio.run(send())
        ids = (int.from_bytes(values[0][1:5], "big"), int.from_bytes(values[-1][1:5], "big"))
        yield Topic(name, url, dataclasses.replace(config, producer=pc), ids)


def test_typed_read_and_typed_sync_run_in_executor_jvms_with_exact_rows(topic: Topic, tmp_path: Path) -> None:
    source = {**connection(topic.config), "memq.broker": topic.url, "minPartitions": "2"}   # a task per executor
    spec = TableSync(topic=topic.name, table="memq.typed_lc", checkpoint=str(tmp_path / "ck"), typed=True,
                     catalog={"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                              "warehouse": f"file://{tmp_path}/warehouse"}, source=source)
    read_options = {**source, "topic": topic.name, "valueFormat": "registry"}   # onError=fail: nothing may fail
    root = str(Path(memq.__file__).resolve().parents[1])
    run = subprocess.run([sys.executable, "-c", _JOB, json.dumps(read_options), json.dumps(dataclasses.asdict(spec)),
                          str(tmp_path), root], capture_output=True, text=True, timeout=540)
    assert run.returncode == 0, run.stderr[-5000:]
    tasks = json.loads(run.stdout.strip().splitlines()[-1])

    ids = N * (N - 1) // 2
    read = pq.read_table(tmp_path / "read")
    assert read.num_rows == N and sum(read["id"].to_pylist()) == ids
    assert set(read["partition"].to_pylist()) == {0, 1} and read["valueError"].null_count == N
    rows = {r["key"]: r for r in read.to_pylist()}
    assert {c: v for c, v in rows[b"k00007"].items() if c != "partition"} == {
        "key": b"k00007", "id": 7, "name": "n7", "amount": 1.75, "note": None, "valueSchemaId": topic.ids[0],
        "valueError": None}
    assert rows[b"k03999"]["note"] == "note3999" and rows[b"k03999"]["valueSchemaId"] == topic.ids[1]
    assert {r["key"] for r in rows.values() if r["note"] is None} == {b"k%05d" % i for i in range(N // 2)}

    table = open_catalog(spec.catalog).load_table(spec.table).scan().to_arrow()
    assert table.num_rows == N and sum(table["id"].to_pylist()) == ids
    assert sorted(table["key"].to_pylist()) == [b"k%05d" % i for i in range(N)]          # each record once
    assert {r["key"]: (r["name"], r["amount"], r["note"]) for r in table.to_pylist()} == \
        {b"k%05d" % i: (f"n{i}", i / 4, None if i < N // 2 else f"note{i}") for i in range(N)}
    assert open_catalog(spec.catalog).load_table(spec.dlq).scan().to_arrow().num_rows == 0

    # Both executor JVMs ran tasks of each part, the driver none; every data file's writer was an executor's.
    for part in ("read", "sync"):
        assert tasks[part].get("driver", 0) == 0 and sorted(k for k, n in tasks[part].items() if n) == ["0", "1"], \
            tasks
    writers = [json.loads(line) for line in (tmp_path / "written.jsonl").read_text().splitlines()]
    assert sorted(set(writers)) == ["0", "1"], writers
