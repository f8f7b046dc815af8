"""`memq table sync`: keep an Apache Iceberg table in step with a topic (Spark + pyiceberg)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from memq.cli._common import CliState, config_of
from memq.errors import ConfigError

if TYPE_CHECKING:
    from spark_source.iceberg import TableSync


@click.group()
def table() -> None:
    """Topics as Apache Iceberg tables."""


@table.command("sync")
@click.argument("topic")
@click.option("--table", "table_name", required=True, help="Iceberg table 'namespace.name' (created if missing).")
@click.option("--dir", "directory", default=".memq-tables", show_default=True, type=click.Path(file_okay=False),
              help="Where the default SQLite catalog and the Spark checkpoint live.")
@click.option("--catalog-prop", "catalog_props", multiple=True, metavar="KEY=VALUE",
              help="pyiceberg catalog property (repeatable); replaces the default SQLite catalog "
                   "when 'type' or 'uri' is given. Default warehouse: s3://<memq bucket>/tables.")
@click.option("--value-schema", default=None, metavar="DDL",
              help="Parse each value as JSON into these columns, e.g. 'id INT, name STRING'.")
@click.option("--partition-by", type=click.Choice(["hour", "day", "month", "none"]), default="hour", show_default=True,
              help="A new table's partitions: this unit of the message timestamp.")
@click.option("--typed", is_flag=True,
              help="Columns from the values' registered schemas (Avro, JSON Schema, Protobuf), evolving with "
                   "the subject; what does not decode goes to TABLE_dlq.")
@click.option("--available-now", is_flag=True, help="Sync what is in the topic now, then stop.")
@click.option("--trigger-seconds", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="Micro-batch interval when running continuously.")
@click.pass_context
def sync(ctx: click.Context, topic: str, table_name: str, directory: str, catalog_props: tuple[str, ...],
         value_schema: str | None, partition_by: str, typed: bool, available_now: bool,
         trigger_seconds: float) -> None:
    """Stream TOPIC into an Iceberg table, partitioned by --partition-by of the message timestamp,
    exactly once across restarts (each commit records its Spark batch id; a replay is skipped)."""
    try:
        from pyspark.sql import SparkSession

        from spark_source import local_session
        from spark_source.iceberg import dead_letters, open_catalog, sync_topic
    except ImportError as e:
        raise ConfigError(f"memq table needs the Spark extra (pip install 'memq[spark]'): {e}") from None
    spec = _spec(ctx, topic, table_name, directory, catalog_props, value_schema=value_schema, typed=typed,
                 partition_by=partition_by, trigger_s=None if available_now else trigger_seconds)
    catalog = spec.catalog
    click.echo(f"syncing topic {topic} into Iceberg table {table_name} (catalog {catalog.get('uri', '?')}, "
               f"warehouse {catalog.get('warehouse', '?')})", err=True)
    started = SparkSession.getActiveSession() is None   # called in a process that has one (a notebook): keep it
    spark = local_session(f"memq-table-{table_name}", conf={"spark.ui.showConsoleProgress": "false"})
    try:
        query = sync_topic(spark, spec)
        while True:
            while not query.awaitTermination(10):
                progress = query.lastProgress
                if progress:
                    click.echo(f"batch {progress['batchId']}: {progress['numInputRows']} rows", err=True)
            failure = query.exception()
            if failure is None:
                break
            if "SchemaChangedError" not in str(failure):
                raise click.ClickException(f"table sync failed: {failure}")
            click.echo(f"{failure}: restarting with the subject's new versions", err=True)
            query = sync_topic(spark, spec)   # nothing of the failed batch was committed: it is read again
        table_now = open_catalog(catalog).load_table(table_name)
        snapshot = table_now.current_snapshot()
        rows = snapshot.summary["total-records"] if snapshot is not None and snapshot.summary else 0
        letters = f", {dead_letters(table_now, spec.id)} dead letters in {spec.dlq}" if typed else ""
        click.echo(f"{table_name}: {rows} rows{letters}")
    finally:
        if started:
            spark.stop()


@table.command("status")
@click.argument("topic")
@click.option("--table", "table_name", required=True, help="Iceberg table 'namespace.name'.")
@click.option("--dir", "directory", default=".memq-tables", show_default=True, type=click.Path(file_okay=False),
              help="Where the default SQLite catalog lives.")
@click.option("--catalog-prop", "catalog_props", multiple=True, metavar="KEY=VALUE", help="As for sync.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_context
def status(ctx: click.Context, topic: str, table_name: str, directory: str, catalog_props: tuple[str, ...],
           as_json: bool) -> None:
    """Where TOPIC's sync into a table stands: rows, last commit, schema version, dead letters, lag."""
    try:
        from spark_source.iceberg_status import table_status
    except ImportError as e:
        raise ConfigError(f"memq table needs the Spark extra (pip install 'memq[spark]'): {e}") from None
    now = table_status(_spec(ctx, topic, table_name, directory, catalog_props), int(time.time() * 1000))
    if as_json:
        click.echo(now.to_json())
        return
    last = "never" if now.last_commit_ms is None else \
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now.last_commit_ms / 1000))
    lag_time = "?" if now.lag_s is None else f"{now.lag_s:.1f} s"
    click.echo(f"{now.table}: {now.rows} rows in {now.batches} batches, last commit {last}, "
               f"schema version {now.schema_version if now.schema_version is not None else '-'}, "
               f"{now.dead_letters} dead letters, lag {now.lag} {now.lag_unit} ({lag_time})")


def _spec(ctx: click.Context, topic: str, table_name: str, directory: str, catalog_props: tuple[str, ...],
          **settings: Any) -> TableSync:
    """The TableSync the options name: the default SQLite catalog in `directory` unless
    --catalog-prop names another; the source's config is the CLI's."""
    from spark_source.iceberg import TableSync, default_catalog

    config = config_of(ctx)
    state = ctx.find_object(CliState)
    directory = str(Path(directory).resolve())
    os.makedirs(directory, exist_ok=True)
    catalog = default_catalog(config, directory)
    extra = dict(_pair(p) for p in catalog_props)
    if {"type", "uri"} & extra.keys():
        catalog = {}
    catalog.update(extra)
    source = {"memq.config": state.config_path} if state is not None and state.config_path else {}
    return TableSync(topic=topic, table=table_name, checkpoint=f"{directory}/checkpoints/{table_name}",
                     catalog=catalog, source=source, **settings)


def _pair(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise ConfigError(f"--catalog-prop {text!r}: want KEY=VALUE")
    return key.strip(), value.strip()
