"""A micro-batch's Iceberg data files, written by the Spark executors; the driver only commits.

Each task of the batch's DataFrame turns its Arrow batches into the table's rows (and a typed
sync's dead letters), writes them as Parquet data files with pyiceberg's own writer (Iceberg field
ids, column stats, each file's partition) straight to the table's location, and returns only the
files' metadata (`DataFile`, pickled) and where its rows end. The driver gathers those few rows
and commits every file of the batch in one append (`commit`), so the rows never pass through the
driver and the write scales with the executors. A task that fails, or a job killed before the
commit, leaves files that no snapshot references: orphans, left to Iceberg's orphan-file cleanup
(a rerun writes the batch again under new names, so it never commits them).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible, _dataframe_to_data_files
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadataUtil
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema

from spark_source.iceberg_typed import split_typed
from spark_source.typed_values import ReadSchema

#: A test hook `step(name, batch_id)`, called at each step of a batch: "write" (in a task, before
#: it writes a data file), "written" (in a task, after its data files are written), "commit" (on
#: the driver, every file written, before the commit) and "committed" (after the Iceberg commit,
#: before Spark's own commit log). Tests crash or kill the job there.
Step = Callable[[str, int], None]


@dataclass(frozen=True)
class Target:
    """A table as a task writes into it: its metadata (JSON) and its FileIO's properties."""

    metadata: str
    io: Mapping[str, str]

    @classmethod
    def of(cls, table: Table) -> Target:
        """`table` without its snapshot history: a writer reads none of it, and it grows by a
        snapshot a micro-batch (about 0.7 kB each) in every task's closure."""
        slim = table.metadata.model_copy(update={"snapshots": [], "snapshot_log": [], "metadata_log": [], "refs": {},
                                                 "current_snapshot_id": None, "statistics": [],
                                                 "partition_statistics": []})
        return cls(slim.model_dump_json(), dict(table.io.properties))

    def write(self, rows: pa.Table) -> list[DataFile]:
        """`rows` as data files of this table (target-sized, one or more per partition value)."""
        if not rows.num_rows:
            return []
        metadata = TableMetadataUtil.parse_raw(self.metadata)
        return list(_dataframe_to_data_files(metadata, rows, load_file_io(dict(self.io), metadata.location)))


@dataclass
class Written:
    """What the tasks of a batch wrote: the table's and the dead letters' data files, the end
    offsets of the rows placed (partition → next offset), the newest timestamp, the dead letters."""

    files: list[DataFile] = field(default_factory=list)
    letter_files: list[DataFile] = field(default_factory=list)
    ends: dict[str, int] = field(default_factory=dict)
    newest_ms: int | None = None
    letters: int = 0

    def add(self, other: Written) -> None:
        self.files += other.files
        self.letter_files += other.letter_files
        for p, end in other.ends.items():
            self.ends[p] = max(end, self.ends.get(p, end))
        self.newest_ms = max((t for t in (self.newest_ms, other.newest_ms) if t is not None), default=None)
        self.letters += other.letters


def arrow_schema(df: DataFrame) -> pa.Schema:
    """`df`'s rows as `toArrow` gives them, with timestamps as UTC microseconds (Iceberg's timestamptz)."""
    large = df.sparkSession.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
    schema = to_arrow_schema(df.schema, error_on_duplicated_field_names_in_struct=True, timezone="UTC",
                             prefers_large_types=large)
    return pa.schema([pa.field(f.name, pa.timestamp("us", tz="UTC"), f.nullable) if pa.types.is_timestamp(f.type)
                      else f for f in schema])


def table_rows(schema: pa.Schema, read: ReadSchema | None) -> pa.Schema:
    """The schema of the table's rows from a batch of `schema` (a typed read's: split as a task splits it)."""
    return schema if read is None else split_typed(schema.empty_table(), read)[0].schema


def check_compatible(table: Table, rows: pa.Schema) -> None:
    """Fail on the driver, before any task writes, if `rows` cannot go into `table` (as `append` would)."""
    _check_pyarrow_schema_compatible(table.schema(), provided_schema=rows,
                                     format_version=table.metadata.format_version)


def write_files(df: DataFrame, batch_id: int, table: Table, dlq: Table | None, read: ReadSchema | None,
                step: Step | None = None) -> Written:
    """Run one task per partition of `df` (the collected columns: a typed read's, or the table's
    rows) that writes its data files; the driver gets back their metadata only."""
    schema = arrow_schema(df)
    into, letters_into = Target.of(table), (Target.of(dlq) if dlq is not None else None)

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        got = list(batches)
        data = pa.Table.from_batches(got).cast(schema) if got else schema.empty_table()
        rows, letters = split_typed(data, read) if read is not None else (data, None)
        if step is not None:
            step("write", batch_id)
        out = Written(files=into.write(rows))
        placed = [rows.select(["partition", "offset", "timestamp"])]
        if letters is not None and letters.num_rows and letters_into is not None:
            out.letter_files, out.letters = letters_into.write(letters), letters.num_rows
            placed.append(letters.select(["partition", "offset", "timestamp"]))
        if step is not None:
            step("written", batch_id)
        out.ends, out.newest_ms = _placed(pa.concat_tables(placed))
        yield pa.RecordBatch.from_arrays([pa.array([pickle.dumps(out)], pa.binary())], names=["written"])

    written = Written()
    for row in df.mapInArrow(task, "written BINARY").collect():
        written.add(pickle.loads(row.written))
    return written


def commit(table: Table, files: Iterable[DataFile], properties: Mapping[str, str]) -> None:
    """One append of `files` (already written) whose snapshot summary carries `properties`."""
    with table.transaction() as tx:
        with tx.update_snapshot(snapshot_properties=dict(properties)).fast_append() as append:
            for f in files:
                append.append_data_file(f)


def _placed(data: pa.Table) -> tuple[dict[str, int], int | None]:
    """Partition → next offset, and the newest timestamp (ms), of the rows in `data`."""
    if not data.num_rows:
        return {}, None
    grouped = data.group_by("partition").aggregate([("offset", "max")])
    ends = {str(p): o + 1 for p, o in zip(grouped["partition"].to_pylist(), grouped["offset_max"].to_pylist())
            if p is not None and o is not None}
    newest = pc.max(data.column("timestamp")).as_py()
    return ends, None if newest is None else int(newest.timestamp() * 1000)
