"""Shared fixtures: one real dev cluster (moto S3, tansu Kafka, ZooKeeper) per test session."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import settings

from memq.config import MemqConfig
from memq.devcluster import DevCluster
from tests.support import numba_cache
from tests.support.kafkajs import kafkajs  # noqa: F401  (kafkajs installed with npm, for any test module)

#: Every Spark driver the tests start (the `spark` fixture's and those of the CLIs and examples they
#: run) compiles with C1 only: a test's Spark work is short, and C2's compiling doubled a JVM's CPU
#: (about 25 s against 12 s for a session's start and first queries) on cores the suite shares.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

#: Property tests check results, not speed: a first example that imports or compiles, or a busy
#: machine, took 0.55 s against Hypothesis' 200 ms deadline and failed a correct test.
settings.register_profile("memq", deadline=None)
settings.load_profile("memq")


@pytest.fixture(scope="session")
def devcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """Started on first use, stopped at the end of the session; logs under pytest's tmp dir."""
    with DevCluster(tmp_path_factory.mktemp("devcluster")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession per test process, shared by every module that reads or writes with
    Spark: a JVM's start costs 10-20 s on two busy cores, once per worker instead of per file."""
    pytest.importorskip("pyspark")
    from spark_source import local_session

    session = local_session("memq-tests", "local[2]", {
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.pyspark.worker.logging.enabled": "true",
    })
    yield session
    session.stop()


@pytest.fixture
def memq_config(devcluster: DevCluster) -> MemqConfig:
    return devcluster.config()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """`unique_name("orders")` -> "orders-<test name>-<random>": topics, groups, buckets."""
    test = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]

    def make(prefix: str = "t") -> str:
        return f"{prefix}-{test}-{uuid.uuid4().hex[:8]}"

    return make


#: The tests that use the `spark` fixture, by file (all its tests) or by test, in two units of work: each
#: unit runs on one xdist worker (`pytest_xdist_make_scheduler`), which starts one Spark JVM and warms
#: one set of Python workers for it, instead of one per worker. One unit alone (~10 min of tests) would
#: be the longest of four workers; the units are balanced by the files' times (~5 min each, 2 cores).
#: A file with one Spark test among many names that test alone, so its other tests go elsewhere.
#: Collection fails on a test that uses `spark` and is not named here.
SPARK_FILES = frozenset({"test_spark_source.py", "test_table_sync.py", "test_spark_write.py", "test_shared_objects.py",
                         "test_typed_spark.py", "test_spark_kafka_read.py", "test_security_describe.py",
                         "test_discovery.py"})
SPARK_TESTS = frozenset({"test_kafka_produce.py::test_spark_reads_what_a_kafka_producer_wrote",
                         "test_long_stall.py::test_a_kafka_frozen_past_the_notify_timeout_delivers_no_duplicates"})
#: The first unit's files; the rest of SPARK_FILES and SPARK_TESTS make the second.
SPARK_FIRST_UNIT = frozenset({"test_spark_source.py", "test_typed_spark.py", "test_discovery.py",
                              "test_security_describe.py"})


def _spark_unit(nodeid: str) -> str | None:
    """The Spark unit of work the test `nodeid` (as xdist names it, path::name[params]) is in, if any."""
    path, _, name = nodeid.partition("::")
    file = path.rsplit("/", 1)[-1]
    if file not in SPARK_FILES and f"{file}::{name.split('[')[0]}" not in SPARK_TESTS:
        return None
    return "spark-1" if file in SPARK_FIRST_UNIT else "spark-2"


#: The files that take longest (a run's `--junitxml` times summed per file), handed out first: xdist's
#: loadfile gives out whole files, by default those with most tests first, which left the one-test
#: `memq dev` files to run alone at the end. The Spark files come first as two units of work (the
#: largest); a file not named keeps its place; name a new file here when it takes a minute or more.
LONGEST_FIRST = (*sorted(SPARK_FILES), "test_kafka_produce.py",
                 "test_cli.py", "test_governor_cluster.py", "test_cli_first_hour.py", "test_consumer.py",
                 "test_compaction_run.py", "test_compaction_read.py", "test_storage.py", "test_kafka_txn.py",
                 "test_cost_cluster.py", "test_security_kafka_listener.py", "test_schema_producer.py",
                 "test_dev_tls.py", "test_dedup_cluster.py", "test_cli_topic_create.py", "test_lint.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    stray = [item.nodeid for item in items if "spark" in getattr(item, "fixturenames", ()) and
             _spark_unit(item.nodeid) is None]
    if stray:
        raise pytest.UsageError(f"tests using the spark fixture, not named in conftest's SPARK_FILES or "
                                f"SPARK_TESTS (the Spark workers run them): {', '.join(stray)}")
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))   # stable: a file's tests keep their order


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's loadfile, with the Spark tests as two units of work (see SPARK_FILES)."""
    from xdist.scheduler import LoadFileScheduling

    class SparkUnits(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _spark_unit(nodeid) or super()._split_scope(nodeid)

    return SparkUnits(config, log)


def pytest_configure(config: pytest.Config) -> None:
    # Also marked slow, so the default suite leaves it out; run with `-m container`.
    config.addinivalue_line("markers", "container: builds and runs the OCI image (podman), see tests/test_image.py")
    if not hasattr(config, "workerinput"):   # once, in the process that starts the others
        numba_cache.warm()
