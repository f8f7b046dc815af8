"""`memq governor ...`: the ZooKeeper side of a governed cluster.

`status` shows the governor, brokers and assignments; `drain`/`undrain` set a broker's drain
flag (the governor moves its topics away, for rolling restarts); `topic create|alter|delete|
list` administer topics in ZooKeeper (creating the notification topic on Kafka); `topic create`
and `topic alter` are `memq topic create` and `memq topic alter`. With credentials in the
config, create, alter and delete go through the brokers' admin API (memq.client.admin).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import click
from rich.console import Console
from rich.table import Table

from memq.cli._common import config_of
from memq.cli.topic import alter as alter_topic_command
from memq.cli.topic import create as create_topic_command
from memq.governor.registry import Registry
from memq.governor.topics import TopicManager


@contextmanager
def registry_of(ctx: click.Context) -> Iterator[Registry]:
    config = config_of(ctx)
    with Registry(config.zookeeper, config.cluster.name) as registry:
        yield registry


@click.group()
def governor() -> None:
    """Governed cluster: status, drain, topics in ZooKeeper."""


@governor.command()
@click.pass_context
def status(ctx: click.Context) -> None:
    """The governor, live brokers with their topics, and every topic's brokers."""
    with registry_of(ctx) as r:
        gov = r.governor()
        state = r.snapshot()
    table = Table(title=f"governor: {gov or 'none'}")
    for col in ("broker", "url", "rack", "capacity MB/s", "draining", "topics"):
        table.add_column(col)
    for b in state.brokers.values():
        hosted = sorted(t for t, bs in state.assignments.items() if b.id in bs)
        table.add_row(b.id, b.url, b.rack, f"{b.capacity_mbps:g}", "yes" if b.draining else "",
                      ", ".join(hosted))
    console = Console()
    console.print(table)
    topics = Table(title="topics")
    for col in ("topic", "expected MB/s", "read partitions", "brokers"):
        topics.add_column(col)
    for name, cfg in state.topics.items():
        topics.add_row(name, f"{cfg.expected_mbps:g}", str(cfg.read_partitions),
                       ", ".join(state.assignments.get(name, ())) or "(unassigned)")
    console.print(topics)


@governor.command()
@click.argument("broker_id")
@click.option("--wait/--no-wait", default=True, help="Wait until no topic is assigned to it.")
@click.option("--timeout", "timeout_s", type=float, default=60.0, show_default=True)
@click.pass_context
def drain(ctx: click.Context, broker_id: str, wait: bool, timeout_s: float) -> None:
    """Move every topic off BROKER_ID (then it can stop without producer errors)."""
    with registry_of(ctx) as r:
        r.set_drain(broker_id)
        click.echo(f"broker {broker_id}: draining")
        if not wait:
            return
        deadline = time.monotonic() + timeout_s
        while any(broker_id in bs for bs in r.assignments().values()):
            if time.monotonic() > deadline:
                raise click.ClickException(f"broker {broker_id} still has topics after {timeout_s:g}s "
                                           "(is another broker live and a governor elected?)")
            time.sleep(0.2)
        click.echo(f"broker {broker_id}: no topics assigned")


@governor.command()
@click.argument("broker_id")
@click.pass_context
def undrain(ctx: click.Context, broker_id: str) -> None:
    """Let BROKER_ID take topics again (a restarted broker does this itself)."""
    with registry_of(ctx) as r:
        r.set_drain(broker_id, False)
    click.echo(f"broker {broker_id}: accepting topics")


@governor.group()
def topic() -> None:
    """Topics in ZooKeeper: the governor places them on brokers."""


def _manager(ctx: click.Context, r: Registry) -> TopicManager:
    from memq.notify import TopicAdmin  # Kafka client: load on use

    config = config_of(ctx)
    return TopicManager(r, TopicAdmin(config.kafka), config.cluster.name)


topic.add_command(create_topic_command)
topic.add_command(alter_topic_command)


@topic.command()
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--delete-notifications", is_flag=True, help="Also delete the Kafka notification topic.")
@click.pass_context
def delete(ctx: click.Context, name: str, yes: bool, delete_notifications: bool) -> None:
    """Delete topic NAME (its batches stay in storage)."""
    if not yes:
        click.confirm(f"delete topic {name}?", abort=True)
    from memq.client.admin import BrokerAdmin, through_brokers

    config = config_of(ctx)
    if through_brokers(config.producer):
        BrokerAdmin(config.producer).delete_topic(name, delete_notifications=delete_notifications)
    else:
        with registry_of(ctx) as r:
            _manager(ctx, r).delete(name, delete_notifications=delete_notifications)
    click.echo(f"topic {name}: deleted")


@topic.command(name="list")
@click.pass_context
def list_(ctx: click.Context) -> None:
    """Topics and their brokers."""
    with registry_of(ctx) as r:
        assignments = r.assignments()
        for name in r.topics():
            click.echo(f"{name}\t{','.join(assignments.get(name, ()))}")
