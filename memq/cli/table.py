"""`memq table sync`: keep an Apache Iceberg table in step with a topic (Spark + pyiceberg)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from memq.cli._common import CliState, config_of
from memq.errors import ConfigError


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
@click.option("--typed", is_flag=True,
              help="Columns from the values' registered schemas (Avro, JSON Schema, Protobuf), evolving with "
                   "the subject; what does not decode goes to TABLE_dlq.")
@click.option("--available-now", is_flag=True, help="Sync what is in the topic now, then stop.")
@click.option("--trigger-seconds", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="Micro-batch interval when running continuously.")
@click.pass_context
def sync(ctx: click.Context, topic: str, table_name: str, directory: str, catalog_props: tuple[str, ...],
         value_schema: str | None, typed: bool, available_now: bool, trigger_seconds: float) -> None:
    """Stream TOPIC into an Iceberg table, partitioned by hour of the message timestamp, exactly
    once across restarts (each commit records its Spark batch id; a replay is skipped)."""
    try:
        from spark_source import local_session
        from spark_source.iceberg import TableSync, dead_letters, default_catalog, open_catalog, sync_topic
    except ImportError as e:
        raise ConfigError(f"memq table needs the Spark extra (pip install 'memq[spark]'): {e}") from None
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
    spec = TableSync(topic=topic, table=table_name, checkpoint=f"{directory}/checkpoints/{table_name}",
                     catalog=catalog, source=source, value_schema=value_schema, typed=typed,
                     trigger_s=None if available_now else trigger_seconds)
    click.echo(f"syncing topic {topic} into Iceberg table {table_name} (catalog {catalog.get('uri', '?')}, "
               f"warehouse {catalog.get('warehouse', '?')})", err=True)
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
        spark.stop()


def _pair(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise ConfigError(f"--catalog-prop {text!r}: want KEY=VALUE")
    return key.strip(), value.strip()
