"""`memq topic create|alter|list|describe|delete`: topics and their notification topics on Kafka.

A memq topic's read partitions are the partitions of its notification topic, so creating
a topic creates that Kafka topic; batches need no setup (one object each). With ZooKeeper
configured (a governed cluster such as `memq dev`), `create` also registers the topic there,
so the governor places it on brokers and it can be produced to at once; `memq governor topic
create` is the same command, and so is `memq governor topic alter`. Clients are imported on
use, so `memq --help` starts fast.
"""

from __future__ import annotations

import dataclasses

import click
from rich.console import Console
from rich.table import Table

from memq.cli._common import config_of
from memq.cli.topic_tail import tail
from memq.config import MemqConfig, TopicConfig, build, memq_topic_of
from memq.errors import ConfigError

PLACEMENT_TIMEOUT_S = 60.0      # the governor's cycle plus the brokers' start of the topic


@click.group()
def topic() -> None:
    """Create, list, describe and delete topics."""


def settings_of(pairs: tuple[str, ...]) -> dict[str, str]:
    """`--set FIELD=VALUE` options as a dict."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--set {pair!r}: use FIELD=VALUE, e.g. expected_mbps=40")
        out[key.strip()] = value.strip()
    return out


def topic_config(config: MemqConfig, name: str, partitions: int | None,
                 pairs: tuple[str, ...], retention_ms: int | None = None) -> TopicConfig:
    """NAME's settings: the config file's entry, then `--set`, with `-p` as read_partitions and
    `--retention-ms` as retention_ms."""
    settings = settings_of(pairs)
    for option, field, value in (("-p", "read_partitions", partitions),
                                 ("--retention-ms", "retention_ms", retention_ms)):
        if value is not None:
            given = settings.setdefault(field, str(value))
            if given != str(value):
                raise ConfigError(f"topic {name}: {option} {value} and --set {field}={given} disagree")
    configured = next((t for t in config.topics if t.name == name), None)
    cfg: TopicConfig = build(TopicConfig, {**dataclasses.asdict(configured or TopicConfig(name=name)), **settings},
                             f"topic {name}")
    return cfg.created(set(settings) | ({"storage_group"} if configured is not None else set()))


def create_topic(config: MemqConfig, cfg: TopicConfig) -> str:
    """Create topic `cfg` so that it can be produced to; returns how it was done.

    With credentials (`producer.token` or a client certificate) through a broker's admin API,
    as that principal (the broker checks `admin` on the topic). Governed (ZooKeeper configured):
    registered in ZooKeeper with its notification topic, the governor places it. Otherwise only
    the notification topic: static brokers serve the topics of their config file. An existing
    notification topic must have `read_partitions` partitions.
    """
    from memq.client._auth import BrokerAuth
    from memq.client.admin import BrokerAdmin, through_brokers
    from memq.governor.registry import Registry
    from memq.governor.topics import TopicManager, check_partitions
    from memq.notify import TopicAdmin

    kafka_topic = cfg.notification_topic_for(config.cluster.name)
    if through_brokers(config.producer):
        placed = BrokerAdmin(config.producer).create_topic(cfg)
        return f"notifications on {kafka_topic}; served by {', '.join(placed)}"
    admin = TopicAdmin(config.kafka)
    if not config.zookeeper.enabled:
        check_partitions(admin, cfg, config.cluster.name, governed=False)
        admin.create_topic(kafka_topic, cfg.read_partitions, retention_ms=cfg.retention_ms)
        return f"notifications on {kafka_topic}; brokers must list it in their config"
    with Registry(config.zookeeper, config.cluster.name) as registry:
        placed = TopicManager(registry, admin, config.cluster.name).ensure(
            cfg, PLACEMENT_TIMEOUT_S, BrokerAuth.of(config.producer).ssl_context)
    return f"notifications on {kafka_topic}; served by {', '.join(placed)}"


@topic.command()
@click.argument("name")
@click.option("--partitions", "-p", type=click.IntRange(min=1), default=None,
              help="Read partitions (consumer parallelism); default from the topic's config or 3.")
@click.option("--retention-ms", type=click.IntRange(min=1), default=None,
              help="Keep notifications this long (objects a grace period longer); default 7 days.")
@click.option("--set", "pairs", multiple=True, metavar="FIELD=VALUE",
              help="Topic setting, e.g. expected_mbps=40, batch_ms=100 or retention_bytes=10000000000 "
                   "(repeatable).")
@click.pass_context
def create(ctx: click.Context, name: str, partitions: int | None, retention_ms: int | None,
           pairs: tuple[str, ...]) -> None:
    """Create topic NAME, ready to produce to (idempotent when its settings match).

    With ZooKeeper configured (e.g. `memq dev`) the governor places it on brokers.
    """
    config = config_of(ctx)
    cfg = topic_config(config, name, partitions, pairs, retention_ms)
    how = create_topic(config, cfg)
    click.echo(f"topic {name}: {cfg.read_partitions} read partitions, {cfg.expected_mbps:g} MB/s ({how})")


@topic.command()
@click.argument("name")
@click.option("--set", "pairs", multiple=True, required=True, metavar="FIELD=VALUE",
              help="Setting to change, e.g. retention_ms=86400000 or expected_mbps=40 (repeatable).")
@click.pass_context
def alter(ctx: click.Context, name: str, pairs: tuple[str, ...]) -> None:
    """Change settings of topic NAME in a governed cluster: brokers pick them up, the governor
    re-places it, its notification topic's retention.ms follows retention_ms."""
    config = config_of(ctx)
    from memq.client.admin import BrokerAdmin, through_brokers

    if through_brokers(config.producer):
        cfg = BrokerAdmin(config.producer).alter_topic(name, settings_of(pairs))
        click.echo(f"topic {name}: {cfg}")
        return
    if not config.zookeeper.enabled:
        raise ConfigError("memq topic alter changes a topic in ZooKeeper: set zookeeper.enabled = true "
                          "(a static broker takes its topics' settings from its config file)")
    from memq.governor.registry import Registry
    from memq.governor.topics import TopicManager
    from memq.notify import TopicAdmin

    with Registry(config.zookeeper, config.cluster.name) as registry:
        cfg = TopicManager(registry, TopicAdmin(config.kafka), config.cluster.name).alter(name, **settings_of(pairs))
    click.echo(f"topic {name}: {cfg}")


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
