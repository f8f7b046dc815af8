"""`memq topic create|list|describe|delete`: a topic's notification topic on Kafka.

For clusters with static topics; a governed cluster keeps topics in ZooKeeper
(`memq governor topic ...`). Clients are imported on use, so `memq --help` starts fast.

A memq topic's read partitions are the partitions of its notification topic, so creating
a topic creates that Kafka topic; batches need no setup (one object each).
"""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from memq.cli._common import config_of
from memq.cli.topic_tail import tail
from memq.config import memq_topic_of


@click.group()
def topic() -> None:
    """Create, list, describe and delete topics."""


@topic.command()
@click.argument("name")
@click.option("--partitions", "-p", type=click.IntRange(min=1), default=None,
              help="Read partitions (consumer parallelism); default from the topic's config or 3.")
@click.pass_context
def create(ctx: click.Context, name: str, partitions: int | None) -> None:
    """Create topic NAME (idempotent when the partition count matches)."""
    config = config_of(ctx)
    from memq.client.consumer import notification_topic
    from memq.notify import TopicAdmin

    configured = next((t for t in config.topics if t.name == name), None)
    count = partitions or (configured.read_partitions if configured else 3)
    kafka_topic = notification_topic(config, name)
    TopicAdmin(config.kafka).create_topic(kafka_topic, count)
    click.echo(f"topic {name}: {count} read partitions (notifications on {kafka_topic})")


@topic.command(name="list")
@click.pass_context
def list_(ctx: click.Context) -> None:
    """List the topics of this cluster."""
    config = config_of(ctx)
    from memq.notify import TopicAdmin

    kafka_topics = TopicAdmin(config.kafka).list_topics()
    names = {n for t in kafka_topics if (n := memq_topic_of(t, config.cluster.name)) is not None}
    for name in sorted(names):
        click.echo(name)


@topic.command()
@click.argument("name")
@click.pass_context
def describe(ctx: click.Context, name: str) -> None:
    """Read partitions of NAME and how many batches each holds."""
    config = config_of(ctx)
    from memq.client.consumer import notification_topic
    from memq.notify import NotificationConsumer, TopicAdmin

    kafka_topic = notification_topic(config, name)
    count = TopicAdmin(config.kafka).partitions(kafka_topic)
    reader = NotificationConsumer(config.kafka, kafka_topic, group_id=f"memq-cli-describe-{name}")
    table = Table(title=f"topic {name} ({kafka_topic})")
    for col in ("partition", "first offset", "next offset", "batches"):
        table.add_column(col, justify="right")
    try:
        for p in range(count):
            low, high = reader.watermarks(p)
            table.add_row(str(p), str(low), str(high), str(high - low))
    finally:
        reader.close()
    Console().print(table)


@topic.command()
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def delete(ctx: click.Context, name: str, yes: bool) -> None:
    """Delete NAME's notification topic (batch objects stay until storage expires them)."""
    config = config_of(ctx)
    from memq.client.consumer import notification_topic
    from memq.notify import TopicAdmin

    kafka_topic = notification_topic(config, name)
    if not yes:
        click.confirm(f"delete topic {name} ({kafka_topic})?", abort=True)
    TopicAdmin(config.kafka).delete_topic(kafka_topic)
    click.echo(f"deleted topic {name}")


topic.add_command(tail)
