"""`memq cost`: what each topic costs per month on memq, next to replicated Kafka, from live counters."""

from __future__ import annotations

import json
import time

import click
from rich.console import Console
from rich.table import Table

from memq.cli._common import config_of, require
from memq.client._auth import BrokerAuth
from memq.cost import Estimate, Usage, Verdict, estimate, price_source, report, usage, verdict
from memq.cost.breakeven import describe
from memq.cost.scrape import cluster_brokers, scrape

_TIMEOUT_S = 5.0
ASSUMPTIONS = """\
Assumptions (docs/ARCHITECTURE.md, "Cost"): rates measured over the window, extrapolated to a 730-hour
month; GB = 2^30 bytes. memq: the S3 requests counted on the brokers (every try; their GETs include
the read cache's misses for consumers reading through them, consumer_read_path = broker), or with
consumer_read_path = s3 plus 1 GET per batch object per consumer group; S3 storage = batch bytes/s x retention, or for a compacted topic what it keeps
now (compacted parts + plain tail, from the compactors' gauges; Kafka's disks keep the same), shown
against the plain figure with the S3 storage it saves; producers -> brokers cross zones for
cross_az_fraction of the bytes; consumers read S3 or a broker in their zone (no transfer charge); the notifications
are priced on the Kafka model. Kafka: the same bytes in, kafka_replicas replicas on EBS gp3
(bytes/s x retention x replicas / kafka_disk_utilization), cross-zone transfer ($ per GB out and again
in) for producers -> leaders (cross_az_fraction), leader -> each other replica, and leaders -> each
consumer group (cross_az_fraction, no fetch-from-follower). Not modelled: broker instances and compute,
free tiers, volume discounts. Break-even: the rate above which the topic costs less on memq, from the
same prices on steady traffic with its settings (batches sealed by size, batch_ms, its latency budget
and its producers' Messages, on the brokers its bytes reach; in a storage group, its share by bytes of
the group's objects), in closed form; below it, the changes that would cut its cost, each priced the
same way at the rate now."""


@click.command(epilog=ASSUMPTIONS)
@click.option("--brokers", default=None,
              help="Comma-separated broker URLs (default: producer.brokers); every broker their metadata "
                   "lists is read too.")
@click.option("--window", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Seconds to measure over (counters read at its start and end); 0: since each broker started.")
@click.option("--retention-days", type=click.FloatRange(min=0), default=7.0, show_default=True,
              help="How long topics keep their data (storage is bytes/s x retention).")
@click.option("--topic", "topics", multiple=True, help="Only this topic (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of tables.")
@click.pass_context
def cost(ctx: click.Context, brokers: str | None, window: float, retention_days: float,
         topics: tuple[str, ...], as_json: bool) -> None:
    """Monthly cost per topic from the brokers' counters, priced by the [cost] table, next to
    3-replica Kafka on block storage with cross-zone replication.

    The default prices are public AWS list prices (us-east-1): S3 Standard PUT/LIST $0.005 and GET
    $0.0004 per 1,000 requests, DELETE free, storage $0.023 per GB-month; EBS gp3 $0.08 per GB-month;
    inter-AZ transfer $0.01 per GB each way.
    """
    config = config_of(ctx)
    auth = BrokerAuth.of(config.producer)
    urls = cluster_brokers(require(brokers or config.producer.brokers, "producer.brokers", "--brokers"), _TIMEOUT_S,
                           auth)
    before = scrape(urls, _TIMEOUT_S, auth) if window else []
    if window:
        time.sleep(window)
    every = usage(scrape(urls, _TIMEOUT_S, auth), before)     # a storage group's other topics count
    used = {t: u for t, u in every.items() if t in topics} if topics else every
    retention_s = retention_days * 86_400
    if as_json:
        click.echo(json.dumps(report(urls, every, retention_s, config.cost, only=topics)))
        return
    estimates = {t: estimate(u, retention_s, config.cost) for t, u in used.items()}
    verdicts = {t: verdict(u, every, retention_s, config.cost, estimates[t]) for t, u in used.items()}
    _print(Console(), urls, price_source(config.cost), retention_days, used, estimates, verdicts)


def _print(console: Console, urls: list[str], prices: str, retention_days: float, used: dict[str, Usage],
           estimates: dict[str, Estimate], verdicts: dict[str, Verdict]) -> None:
    console.print(f"memq cost: {len(urls)} broker(s); prices: {prices}; retention {retention_days:g} days")
    if not estimates:
        console.print("no topic has counters yet")
    for topic, e in estimates.items():
        u = used[topic]
        r = u.counts.requests
        console.print(f"\n[bold]{topic}[/]: in {u.window_s:,.0f} s: {u.counts.bytes_in / 2**20:,.1f} MiB in, "
                      f"{u.counts.objects:,.0f} objects, {u.counts.notifications:,.0f} notifications; "
                      f"S3 requests: {r['put']:,.0f} PUT, {r['get']:,.0f} GET, {r['list']:,.0f} LIST, "
                      f"{r['delete']:,.0f} DELETE (brokers)")
        table = Table(title=f"{topic}: per month at this rate")
        table.add_column("system")
        table.add_column("item")
        table.add_column("quantity", justify="right")
        table.add_column("USD", justify="right")
        for system, lines in (("memq", e.memq.lines), ("kafka", e.kafka.lines)):
            for line in lines:
                table.add_row(system, line.item, f"{line.quantity:,.1f} {line.unit}", f"{line.usd:,.2f}")
        table.add_row("memq", "[bold]total[/]", "", f"[bold]{e.memq_usd:,.2f}[/]")
        table.add_row("kafka", "[bold]total[/]", "", f"[bold]{e.kafka_usd:,.2f}[/]")
        console.print(table)
        console.print(f"memq {e.memq_usd:,.2f} USD/month vs Kafka {e.kafka_usd:,.2f}: "
                      f"{e.saving:.0%} {'cheaper' if e.saving >= 0 else 'dearer'}")
        if e.compaction:
            console.print(e.compaction.describe())
        for said in describe(verdicts[topic]):
            console.print(said, highlight=False, markup=False)
    console.print(f"\n{ASSUMPTIONS}", style="dim")

