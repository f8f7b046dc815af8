"""A memq topic as an Apache Iceberg table: a Spark Structured Streaming job from format("memq")
into a table written with pyiceberg, partitioned by the hour of the message timestamp.

    from spark_source import local_session
    from spark_source.iceberg import TableSync, sync_topic
    query = sync_topic(local_session(), TableSync(topic="events", table="memq.events",
                                                  source={"memq.config": "memq.toml"}, ...))

Exactly once across restarts: every micro-batch is one Iceberg append whose snapshot summary
records the sync's id, Spark's batch id and the batch's end offsets. Spark replays the last
batch after a crash (its commit log is written after the sink returns); a batch whose id a
snapshot of this sync already holds is skipped, so a replay adds nothing. The Spark
checkpoint says where to resume; Iceberg's atomic commit says what is already in.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.transforms import HourTransform
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from memq.config import MemqConfig
from memq.errors import ConfigError

log = logging.getLogger("memq.table")

SYNC_ID = "memq.sync-id"
BATCH_ID = "memq.batch-id"
END_OFFSETS = "memq.end-offsets"
# the memq source's columns a table keeps (bucket/objectKey are where a row was read from)
KEPT = ("key", "value", "topic", "partition", "offset", "index", "timestamp", "headers", "producerId")


@dataclass(frozen=True)
class TableSync:
    """One topic → table job. `catalog`: pyiceberg catalog properties (default: a SQL catalog
    on SQLite, see `default_catalog`); `value_schema`: a Spark DDL string ("id INT, name
    STRING") to parse each value as JSON into columns (the raw value is then dropped);
    `trigger_s` None means available-now: read what is there, commit, stop."""

    topic: str
    table: str                                   # "namespace.name"
    checkpoint: str                              # Spark checkpoint directory
    catalog: Mapping[str, str] = field(default_factory=dict)
    source: Mapping[str, str] = field(default_factory=dict)   # options of format("memq")
    value_schema: str | None = None
    trigger_s: float | None = None
    sync_id: str = ""                            # default: "<topic>-><table>"

    def __post_init__(self) -> None:
        if "." not in self.table.strip(".") or not self.topic:
            raise ConfigError(f"table sync: --table must be 'namespace.name' (got {self.table!r}) and the topic set")
        if self.trigger_s is not None and self.trigger_s <= 0:
            raise ConfigError(f"table sync: trigger interval must be > 0 s (got {self.trigger_s})")

    @property
    def id(self) -> str:
        return self.sync_id or f"{self.topic}->{self.table}"


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


def rows(df: DataFrame, value_schema: str | None) -> DataFrame:
    """The columns a table gets: memq's (value parsed as JSON into columns if a schema is given)."""
    kept = [c for c in KEPT if c != "value" or value_schema is None]
    if value_schema is None:
        return df.select(*kept)
    parsed = F.from_json(F.col("value").cast("string"), value_schema)
    return df.select(*kept, parsed.alias("_v")).select(*kept, "_v.*")


def to_arrow(df: DataFrame) -> pa.Table:
    """Spark's Arrow with timestamps as UTC microseconds (Iceberg's timestamptz)."""
    table = df.toArrow()
    fields = [pa.field(f.name, pa.timestamp("us", tz="UTC"), f.nullable) if pa.types.is_timestamp(f.type) else f
              for f in table.schema]
    return table.cast(pa.schema(fields))


def load_or_create(catalog: Catalog, name: str, schema: pa.Schema) -> Table:
    """The table, created on first use with an hour(timestamp) partition spec."""
    try:
        return catalog.load_table(name)
    except NoSuchTableError:
        pass
    catalog.create_namespace_if_not_exists(name.rsplit(".", 1)[0])
    table = catalog.create_table_if_not_exists(name, schema=schema)
    if "timestamp" in schema.names and not table.spec().fields:
        with table.update_spec() as spec:
            spec.add_field("timestamp", HourTransform(), "timestamp_hour")
        table = catalog.load_table(name)
    log.info("created Iceberg table %s at %s", name, table.location())
    return table


def batch_writer(spec: TableSync, catalog: Catalog,
                 after_commit: Callable[[int], None] | None = None) -> Callable[[DataFrame, int], None]:
    """The foreachBatch function: one idempotent Iceberg append per micro-batch.
    `after_commit(batch_id)` runs once the append is committed (tests use it to crash there)."""

    def write(df: DataFrame, batch_id: int) -> None:
        data = to_arrow(rows(df, spec.value_schema))
        table = load_or_create(catalog, spec.table, data.schema)
        done = committed_batches(table, spec.id)
        if batch_id in done:
            log.info("table %s: batch %d of %s is already committed (a replay): skipped", spec.table, batch_id,
                     spec.id)
            return
        ends: dict[str, int] = {}
        if data.num_rows:
            grouped = data.group_by("partition").aggregate([("offset", "max")])
            ends = {str(p): o + 1 for p, o in zip(grouped["partition"].to_pylist(), grouped["offset_max"].to_pylist())
                    if p is not None and o is not None}
        table.append(data, snapshot_properties={SYNC_ID: spec.id, BATCH_ID: str(batch_id),
                                                END_OFFSETS: json.dumps(ends, sort_keys=True)})
        log.info("table %s: batch %d committed, %d rows, end offsets %s", spec.table, batch_id, data.num_rows, ends)
        if after_commit is not None:
            after_commit(batch_id)

    return write


def sync_topic(spark: SparkSession, spec: TableSync,
               after_commit: Callable[[int], None] | None = None) -> StreamingQuery:
    """Start the streaming job (format("memq") → Iceberg); returns the running query."""
    catalog = open_catalog(spec.catalog)
    stream = (spark.readStream.format("memq").options(**spec.source).option("topic", spec.topic)
              .option("startingOffsets", spec.source.get("startingOffsets", "earliest")).load())
    writer = (stream.writeStream.foreachBatch(batch_writer(spec, catalog, after_commit))
              .option("checkpointLocation", spec.checkpoint).queryName(f"memq-table-{spec.table}"))
    writer = writer.trigger(availableNow=True) if spec.trigger_s is None else \
        writer.trigger(processingTime=f"{spec.trigger_s} seconds")
    return writer.start()
