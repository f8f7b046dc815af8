"""`memq status`: is each part of the cluster reachable, which broker hosts what, and how far
behind each Kafka consumer group is (in records, on topics with dense offsets)."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from memq.cli._common import config_of
from memq.client._auth import BrokerAuth
from memq.client.cluster import broker_urls, fetch_metadata
from memq.client.lag import GroupLag, cluster_lags
from memq.config import memq_topic_of
from memq.errors import AuthenticationError, BrokerUnavailableError, MemqError

_TIMEOUT_S = 3.0


@click.command()
@click.option("--brokers", default=None, help="Comma-separated broker URLs (default: producer.brokers).")
@click.pass_context
def status(ctx: click.Context, brokers: str | None) -> None:
    """Show brokers (health, topics), the notification queue and Kafka consumer groups' lag; exit 1
    if anything is down (an unreadable lag is shown, not a failure)."""
    config = config_of(ctx)
    from memq.notify import TopicAdmin

    console = Console()
    healthy = True
    lags: list[GroupLag] | MemqError | None = None   # Kafka groups' lag, through the first broker that answers
    table = Table(title=f"memq cluster {config.cluster.name}")
    for col in ("component", "address", "state", "detail"):
        table.add_column(col)
    for url in broker_urls(brokers or config.producer.brokers):
        try:
            meta = fetch_metadata(url, _TIMEOUT_S, BrokerAuth.of(config.producer))
            own = next((b.url for b in meta.brokers if b.id == meta.broker_id), url)   # as it advertises itself
            if lags is None:
                try:
                    lags = cluster_lags(meta, _TIMEOUT_S) or []
                except MemqError as e:   # shown, not a failure: the cluster may be healthy
                    lags = e
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
    if lags:
        console.print(_lag_table(lags))
    if not healthy:
        ctx.exit(1)


def _lag_table(lags: list[GroupLag] | MemqError) -> Table:
    """Kafka consumer groups' lag per topic, as Kafka's tools get it from a broker's listener."""
    table = Table(title="consumer groups (Kafka clients): lag = high watermark - committed")
    for col in ("group", "topic", "partitions", "lag (records)"):
        table.add_column(col)
    if isinstance(lags, MemqError):
        table.add_row("?", "-", "-", f"[yellow]not read[/]: {lags}")
        return table
    for g in lags:
        table.add_row(g.group, g.topic, str(g.partitions),
                      str(g.records) if g.records is not None else "- (sparse offsets: not a record count)")
    return table
