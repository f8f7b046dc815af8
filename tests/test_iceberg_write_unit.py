"""The executors' side of a table sync without Spark: a task's rows written as data files of an
hour-partitioned table from what the driver shipped (the table's metadata without its snapshot
history, pickled as a task gets it), committed by the driver in one append with its summary."""

from __future__ import annotations

import datetime as dt
import pickle
from pathlib import Path

import pyarrow as pa
import pytest

pytest.importorskip("pyiceberg")
pytest.importorskip("pyspark")
from pyiceberg.catalog import load_catalog  # noqa: E402
from pyiceberg.transforms import HourTransform  # noqa: E402

from spark_source.iceberg_write import Target, Written, commit  # noqa: E402

UTC = dt.timezone.utc


def test_files_written_from_a_shipped_target_commit_in_one_append_with_the_summary(tmp_path: Path) -> None:
    catalog = load_catalog("t", type="sql", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/w")
    catalog.create_namespace("n")
    rows = pa.table({"id": pa.array(range(4), pa.int64()),
                     "timestamp": pa.array([dt.datetime(2026, 1, 1, h, tzinfo=UTC) for h in (1, 1, 2, 3)],
                                           pa.timestamp("us", "UTC"))})
    table = catalog.create_table("n.t", schema=rows.schema)
    with table.update_spec() as spec:
        spec.add_field("timestamp", HourTransform(), "timestamp_hour")
    table = catalog.load_table("n.t")
    for i in range(3):                                     # a history the tasks need not carry
        commit(table, [], {"n": str(i)})
    target = pickle.loads(pickle.dumps(Target.of(table)))
    assert "snapshots\":[]" in target.metadata.replace(" ", "")

    files = pickle.loads(pickle.dumps(target.write(rows)))  # as a task returns them
    assert sorted(f.record_count for f in files) == [1, 1, 2]          # one file per hour
    assert not catalog.load_table("n.t").scan().to_arrow().num_rows   # written, not yet committed
    commit(table, files, {"memq.batch-id": "7"})
    now = catalog.load_table("n.t")
    assert sorted(now.scan().to_arrow()["id"].to_pylist()) == [0, 1, 2, 3]
    assert now.current_snapshot().summary["memq.batch-id"] == "7"       # type: ignore[union-attr]
    assert target.write(rows.slice(0, 0)) == []


def test_tasks_results_merge_into_the_batchs_end_offsets_and_newest_timestamp() -> None:
    merged = Written()
    merged.add(Written(ends={"0": 10, "1": 4}, newest_ms=5, letters=1))
    merged.add(Written(ends={"0": 7, "2": 1}, newest_ms=None, letters=2))
    assert (merged.ends, merged.newest_ms, merged.letters) == ({"0": 10, "1": 4, "2": 1}, 5, 3)
