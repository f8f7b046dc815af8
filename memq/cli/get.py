"""`memq get TOPIC KEY`: the latest value of one key of a compacted topic, without scanning it."""

from __future__ import annotations

import sys
from contextlib import ExitStack

import click

from memq.cli._common import config_of


@click.command()
@click.argument("topic")
@click.argument("key")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Seconds to wait for the answer.")
@click.pass_context
def get(ctx: click.Context, topic: str, key: str, timeout: float) -> None:
    """Print KEY's latest value in TOPIC (exit 1 with "no such key", or "deleted" for a tombstone).

    Reads the plain tail newest first, then the compacted parts' key indexes (ZooKeeper names them)."""
    config = config_of(ctx)
    from memq.client.by_key import KeyLookup   # after the config: bad settings fail first
    from memq.client.cluster import resolve_topic
    from memq.client.reader import BatchReader
    from memq.compaction.manifest import ManifestPointers
    from memq.governor.registry import Registry
    from memq.notify import NotificationConsumer

    resolved = resolve_topic(config, topic)
    config = resolved.config
    with ExitStack() as stack:
        notes = NotificationConsumer(config.kafka, resolved.topic.notification_topic, group_id="memq-get")
        stack.callback(notes.close)
        reader = BatchReader(config, 8)
        stack.callback(reader.close)
        pointers = None
        if config.zookeeper.enabled:
            registry = Registry(config.zookeeper, config.cluster.name).start()
            stack.callback(registry.close)
            pointers = ManifestPointers(registry)
        found = KeyLookup(topic, resolved.topic.read_partitions, notes, reader.fetch_loop, pointers,
                          dense=resolved.topic.offsets == "dense").get(key.encode(), timeout)
    if found is None:
        click.echo(f"{topic}: no such key {key!r}", err=True)
        sys.exit(1)
    if found.value is None:
        click.echo(f"{topic}: key {key!r} deleted (tombstone at partition {found.partition} offset {found.offset})",
                   err=True)
        sys.exit(1)
    sys.stdout.buffer.write(found.value + b"\n")
