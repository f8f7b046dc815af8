"""A memq topic as an Apache Iceberg table: a Spark Structured Streaming job from format("memq")
into a table written with pyiceberg, partitioned by the hour of the message timestamp. The
executors write each micro-batch's data files, the driver commits them (`iceberg_write`).

    from spark_source import local_session
    from spark_source.iceberg import TableSync, sync_topic
    query = sync_topic(local_session(), TableSync(topic="events", table="memq.events",
                                                  source={"memq.config": "memq.toml"}, ...))

Exactly once across restarts: every micro-batch is one Iceberg append whose snapshot summary
records the sync's id, Spark's batch id and the batch's end offsets. Spark replays the last
batch after a crash (its commit log is written after the sink returns); a batch whose id a
snapshot of this sync already holds is skipped before any file is written, so a replay adds
nothing, and the files of a batch killed before its commit are in no snapshot. The Spark
checkpoint says where to resume; Iceberg's atomic commit says what is already in.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table import Table
from pyiceberg.types import StructType
from pyiceberg.transforms import DayTransform, HourTransform, MonthTransform, Transform
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming import StreamingQuery

from memq.audit.table_board import TableReporter
from memq.audit.tables import (
    BATCH_ID,
    DEAD_LETTERS,
    END_OFFSETS,
    NEWEST_MS,
    SCHEMA_VERSION,
    SYNC_ID,
    Committed,
    committed,
)
from memq.config import MemqConfig
from memq.errors import ConfigError
from spark_source.iceberg_typed import COLLECTED, DLQ_SCHEMA, evolve_table
from spark_source.iceberg_write import Step, arrow_schema, check_compatible, commit, table_rows, write_files
from spark_source.options import parse_options
from spark_source.typed_values import ReadSchema

log = logging.getLogger("memq.table")

# `partition_by` → the transform of the message timestamp a new table is partitioned by (none: unpartitioned)
PARTITIONS: Mapping[str, Callable[[], Transform[Any, Any]] | None] = {
    "hour": HourTransform, "day": DayTransform, "month": MonthTransform, "none": None}
# the memq source's columns a table keeps (bucket/objectKey are where a row was read from)
KEPT = ("key", "value", "topic", "partition", "offset", "index", "timestamp", "headers", "producerId")


@dataclass(frozen=True)
class TableSync:
    """One topic → table job. `catalog`: pyiceberg catalog properties (default: a SQL catalog
    on SQLite, see `default_catalog`); `value_schema`: a Spark DDL string ("id INT, name
    STRING") to parse each value as JSON into columns (the raw value is then dropped); `typed`:
    the values' registered schemas give the columns (`valueFormat=registry`), evolving by field
    identity, and what does not decode goes to `<table>_dlq`; `trigger_s` None means
    available-now: read what is there, commit, stop."""

    topic: str
    table: str                                   # "namespace.name"
    checkpoint: str                              # Spark checkpoint directory
    catalog: Mapping[str, str] = field(default_factory=dict)
    source: Mapping[str, str] = field(default_factory=dict)   # options of format("memq")
    value_schema: str | None = None
    trigger_s: float | None = None
    sync_id: str = ""                            # default: "<topic>-><table>"
    typed: bool = False
    partition_by: str = "hour"                   # a key of PARTITIONS: a new table's spec

    def __post_init__(self) -> None:
        if self.partition_by not in PARTITIONS:
            raise ConfigError(f"table sync: partition by {self.partition_by!r}: one of {', '.join(PARTITIONS)}")
        if self.typed and self.value_schema is not None:
            raise ConfigError("table sync: --typed takes the columns from the registry; --value-schema is for JSON")
        if "." not in self.table.strip(".") or not self.topic:
            raise ConfigError(f"table sync: --table must be 'namespace.name' (got {self.table!r}) and the topic set")
        if self.trigger_s is not None and self.trigger_s <= 0:
            raise ConfigError(f"table sync: trigger interval must be > 0 s (got {self.trigger_s})")

    @property
    def id(self) -> str:
        return self.sync_id or f"{self.topic}->{self.table}"

    @property
    def dlq(self) -> str:
        return f"{self.table}_dlq"

    def options(self) -> dict[str, str]:
        """The memq source's options for this sync."""
        typed = {"valueFormat": "registry", "onError": "null"} if self.typed else {}
        return {**self.source, **typed, "topic": self.topic,
                "startingOffsets": self.source.get("startingOffsets", "earliest")}


def default_catalog(config: MemqConfig, directory: str) -> dict[str, str]:
    """A SQL catalog on SQLite in `directory`; data files on memq's own S3 bucket (under
    `tables/`) with memq's S3 settings, or in `directory` when memq stores on files."""
    props = {"type": "sql", "uri": f"sqlite:///{directory.rstrip('/')}/catalog.db"}
    if config.storage.kind == "s3":
        s3 = config.s3
        props["warehouse"] = f"s3://{s3.bucket}/tables"
        props.update({k: v for k, v in {"s3.endpoint": s3.endpoint_url, "s3.region": s3.region,
                                        "s3.access-key-id": s3.access_key_id,
                                        "s3.secret-access-key": s3.secret_access_key,
                                        "s3.session-token": s3.session_token,
                                        "s3.profile-name": s3.profile}.items() if v})
    else:
        props["warehouse"] = f"file://{directory.rstrip('/')}/warehouse"
    return props


def open_catalog(props: Mapping[str, str]) -> Catalog:
    return load_catalog("memq", **props)


def committed_batches(table: Table, sync_id: str) -> dict[int, dict[str, int]]:
    """Batch id → end offsets of every snapshot this sync appended (pure over the metadata)."""
    out: dict[int, dict[str, int]] = {}
    for snap in table.metadata.snapshots:
        summary = snap.summary
        batch = summary[BATCH_ID] if summary is not None and summary[SYNC_ID] == sync_id else None
        if summary is not None and batch is not None:
            out[int(batch)] = json.loads(summary[END_OFFSETS] or "{}")
    return out


def dead_letters(table: Table, sync_id: str) -> int:
    """How many records this sync has sent to the dead-letter table (over its snapshot summaries)."""
    return sum(int(s.summary[DEAD_LETTERS] or 0) for s in table.metadata.snapshots
               if s.summary is not None and s.summary[SYNC_ID] == sync_id and s.summary[DEAD_LETTERS])


def read_table(spark: SparkSession, table: Table) -> DataFrame:
    """The table's current rows in Spark without Iceberg's Spark runtime: its data files (appends
    only, no delete files) read by Iceberg field id, so a renamed column reads under its new name
    in files written before the rename, and a column added since reads null."""
    schema = _with_field_ids(from_arrow_schema(schema_to_pyarrow(table.schema())), table.schema().as_struct())
    spark.conf.set("spark.sql.parquet.fieldId.read.enabled", "true")
    files = [t.file.file_path for t in table.scan().plan_files()]
    return spark.read.schema(schema).parquet(*files) if files else spark.createDataFrame([], schema)


def _with_field_ids(spark_type: Any, iceberg: Any) -> Any:
    """`spark_type` (a struct) with each field's Iceberg id as Spark's `parquet.field.id` metadata."""
    if not isinstance(spark_type, T.StructType):
        return spark_type
    ids = {f.name: f for f in iceberg.fields}
    return T.StructType([T.StructField(f.name, _with_field_ids(f.dataType, ids[f.name].field_type)
                                       if isinstance(ids[f.name].field_type, StructType) else f.dataType,
                                       f.nullable, {"parquet.field.id": ids[f.name].field_id})
                         for f in spark_type.fields])


def rows(df: DataFrame, value_schema: str | None) -> DataFrame:
    """The columns a table gets: memq's (value parsed as JSON into columns if a schema is given)."""
    kept = [c for c in KEPT if c != "value" or value_schema is None]
    if value_schema is None:
        return df.select(*kept)
    parsed = F.from_json(F.col("value").cast("string"), value_schema)
    return df.select(*kept, parsed.alias("_v")).select(*kept, "_v.*")


def load_or_create(catalog: Catalog, name: str, schema: pa.Schema, partition_by: str = "hour") -> Table:
    """The table, created on first use, partitioned by `partition_by` (PARTITIONS) of the timestamp."""
    try:
        return catalog.load_table(name)
    except NoSuchTableError:
        pass
    catalog.create_namespace_if_not_exists(name.rsplit(".", 1)[0])
    table = catalog.create_table_if_not_exists(name, schema=schema)
    transform = PARTITIONS[partition_by]
    if transform is not None and "timestamp" in schema.names and not table.spec().fields:
        with table.update_spec() as spec:
            spec.add_field("timestamp", transform(), f"timestamp_{partition_by}")
        table = catalog.load_table(name)
    log.info("created Iceberg table %s at %s", name, table.location())
    return table


def sync_committed(table: Table, spec: TableSync, *, dense: bool) -> Committed:
    """What `spec`'s commits to `table` add up to, from its snapshot summaries."""
    current = table.current_snapshot()
    rows = int(current.summary["total-records"] or 0) if current is not None and current.summary else 0
    snaps = [(s.timestamp_ms, s.summary.additional_properties) for s in table.metadata.snapshots
             if s.summary is not None]
    return committed(snaps, rows, sync_id=spec.id, topic=spec.topic, table=spec.table, dense=dense)


def batch_writer(spec: TableSync, catalog: Catalog, read: ReadSchema | None = None,
                 step: Step | None = None,
                 report: Callable[[Table], None] | None = None) -> Callable[[DataFrame, int], None]:
    """The foreachBatch function: the executors write the batch's data files (`write_files`), the
    driver commits them in one idempotent Iceberg append (a typed sync's dead letters first, as
    one idempotent append to `<table>_dlq`). `read`: a typed sync's read schema. `step`: a test
    hook called at each step of a batch (`iceberg_write.Step`). `report`: told the table after
    each commit (the dashboard's `TableReporter`)."""
    dlq: list[Table] = []   # loaded once per query: only this sync's appends change its metadata

    def write(df: DataFrame, batch_id: int) -> None:
        collected = df.select(*COLLECTED) if read is not None else rows(df, spec.value_schema)
        schema = table_rows(arrow_schema(collected), read)
        table = load_or_create(catalog, spec.table, schema, spec.partition_by)
        if batch_id in committed_batches(table, spec.id):
            log.info("table %s: batch %d of %s is already committed (a replay): skipped", spec.table, batch_id,
                     spec.id)
            return
        props = {SYNC_ID: spec.id, BATCH_ID: str(batch_id)}
        if read is not None:
            evolve_table(table, read, schema)
            if not dlq:
                dlq.append(load_or_create(catalog, spec.dlq, DLQ_SCHEMA, spec.partition_by))
        check_compatible(table, schema)
        written = write_files(collected, batch_id, table, dlq[0] if dlq else None, read, step)
        if step is not None:
            step("commit", batch_id)
        if read is not None:
            if written.letter_files and batch_id not in committed_batches(dlq[0], spec.id):
                commit(dlq[0], written.letter_files, {**props, END_OFFSETS: "{}"})
                log.warning("table %s: batch %d: %d records to %s", spec.table, batch_id, written.letters, spec.dlq)
            props[DEAD_LETTERS] = str(written.letters)
            props[SCHEMA_VERSION] = str(max((read.version_of[i] for i in read.writers), default=0))
        if written.newest_ms is not None:
            props[NEWEST_MS] = str(written.newest_ms)
        commit(table, written.files, {**props, END_OFFSETS: json.dumps(written.ends, sort_keys=True)})
        log.info("table %s: batch %d committed, %d files, end offsets %s", spec.table, batch_id,
                 len(written.files), written.ends)
        if report is not None:
            report(table)
        if step is not None:
            step("committed", batch_id)

    return write


def sync_topic(spark: SparkSession, spec: TableSync, step: Step | None = None) -> StreamingQuery:
    """Start the streaming job (format("memq") → Iceberg); returns the running query. `step`: a
    test hook (`batch_writer`)."""
    catalog = open_catalog(spec.catalog)
    options = spec.options()
    opts = parse_options(options)
    read = opts.typed if spec.typed else None   # the driver's read schema, evolving the table
    report = None
    if opts.config.audit.enabled:   # the dashboard's table panel, beside the audit's
        reporter = TableReporter(opts.config)

        def report(table: Table) -> None:
            reporter.report(sync_committed(table, spec, dense=opts.dense))

    stream = spark.readStream.format("memq").options(**options).load()
    writer = (stream.writeStream.foreachBatch(batch_writer(spec, catalog, read, step, report))
              .option("checkpointLocation", spec.checkpoint).queryName(f"memq-table-{spec.table}"))
    writer = writer.trigger(availableNow=True) if spec.trigger_s is None else \
        writer.trigger(processingTime=f"{spec.trigger_s} seconds")
    return writer.start()
