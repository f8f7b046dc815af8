"""`memq status`: is each part of the cluster reachable, and which broker hosts what."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from memq.cli._common import config_of
from memq.client._auth import BrokerAuth
from memq.client.cluster import broker_urls, fetch_metadata
from memq.config import memq_topic_of
from memq.errors import AuthenticationError, BrokerUnavailableError, MemqError

_TIMEOUT_S = 3.0


@click.command()
@click.option("--brokers", default=None, help="Comma-separated broker URLs (default: producer.brokers).")
@click.pass_context
def status(ctx: click.Context, brokers: str | None) -> None:
    """Show brokers (health, topics) and the notification queue; exit 1 if anything is down."""
    config = config_of(ctx)
    from memq.notify import TopicAdmin

    console = Console()
    healthy = True
    table = Table(title=f"memq cluster {config.cluster.name}")
    for col in ("component", "address", "state", "detail"):
        table.add_column(col)
    for url in broker_urls(brokers or config.producer.brokers):
        try:
            meta = fetch_metadata(url, _TIMEOUT_S, BrokerAuth.of(config.producer))
            own = next((b.url for b in meta.brokers if b.id == meta.broker_id), url)   # as it advertises itself
            topics = ", ".join(sorted(name for name, t in meta.topics.items() if own in t.brokers)) or "-"
            table.add_row(f"broker {meta.broker_id or '?'}", url, "[green]up[/]", f"topics: {topics}")
        except (BrokerUnavailableError, AuthenticationError) as e:
            healthy = False
            table.add_row("broker", url, "[red]down[/]", str(e))
    try:
        kafka_topics = TopicAdmin(config.kafka).list_topics()
        count = sum(memq_topic_of(t, config.cluster.name) is not None for t in kafka_topics)
        table.add_row("kafka", config.kafka.bootstrap_servers, "[green]up[/]", f"{count} memq topics")
    except MemqError as e:
        healthy = False
        table.add_row("kafka", config.kafka.bootstrap_servers, "[red]down[/]", str(e))
    console.print(table)
    if not healthy:
        ctx.exit(1)
