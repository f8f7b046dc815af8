"""`memq topic tail NAME --notifications`: a topic's notifications as JSON lines.

A memq-native look at the notification topic, for when a generic Kafka tool cannot talk to
the cluster (Debian's kcat, librdkafka 2.0.2, fails against tansu 0.6). It reads by explicit
assignment, so it joins no consumer group and commits nothing.
"""

from __future__ import annotations

import json
import time

import click

from memq.cli._common import config_of


@click.command()
@click.argument("name")
@click.option("--notifications", is_flag=True, required=True,
              help="Print the notifications (one JSON object per line: partition, offset, batch).")
@click.option("--count", "-n", type=click.IntRange(min=1), default=None, help="Stop after N notifications.")
@click.option("--idle-timeout", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="Stop when no notification came for this many seconds.")
@click.pass_context
def tail(ctx: click.Context, name: str, notifications: bool, count: int | None, idle_timeout: float) -> None:
    """Print NAME's notifications from the first one on, as JSON lines."""
    config = config_of(ctx)
    from memq.client.consumer import notification_topic
    from memq.notify import NotificationConsumer

    kafka_topic = notification_topic(config, name)
    reader = NotificationConsumer(config.kafka, kafka_topic, group_id=f"memq-cli-tail-{name}")
    try:
        reader.assign({p: reader.watermarks(p)[0] for p in reader.partitions()})
        printed, last = 0, time.monotonic()
        while (count is None or printed < count) and time.monotonic() - last < idle_timeout:
            for rec in reader.poll(0.2, max_records=500 if count is None else count - printed):
                click.echo(json.dumps({"partition": rec.partition, "offset": rec.offset,
                                       "timestamp_ms": rec.timestamp_ms, "notification": vars(rec.notification)}))
                printed, last = printed + 1, time.monotonic()
    finally:
        reader.close()
