"""`memq dev`: the whole system on this machine, governed, with live demo traffic.

Starts the dev cluster (moto S3, tansu Kafka, ZooKeeper) and N broker processes that register
in ZooKeeper, on racks assigned round-robin; one of them is elected governor. The demo topic is
created through the governor's topic admin (ZooKeeper topic + Kafka notification topic), so
the governor places it (on 2 brokers of different racks when there are 2 or more). With demo
traffic, a second topic, `<topic>-batched`, gets as many records, larger (~60 bytes each once
compressed, against ~5), with a latency budget and objects of its own (`batched_topic`): the cost
panel then shows one topic dearer than Kafka (a trickle sealed every 250 ms on two brokers) and
one cheaper, each against its break-even. Then it
writes a client config file and runs a demo producer (which follows the brokers' metadata) and
consumers showing live counts. Ctrl-C or SIGTERM (or `--duration`) stops everything, children
first; every server also dies with this process if it is killed outright.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.live import Live

from memq.audit.emitter import make_audit_sink
from memq.config import BrokerConfig, MemqConfig, TopicConfig
from memq.devcluster.secure import DEV_PRINCIPAL, make_dev_security
from memq.errors import MemqError

if TYPE_CHECKING:
    from memq.devcluster import GovernedCluster

_DEMO_GROUP = "memq-dev-demo"
READY_TIMEOUT_S = 30.0


def batched_topic(name: str, partitions: int) -> TopicConfig:
    """The demo's second topic: a batch waits for 1 MiB up to 10 s, in objects of its own (in the
    shared group the demo topic's 250 ms seals would carry its batches off early); kept 30 minutes,
    so that the dev S3 (in memory) holds a bounded amount of it."""
    return TopicConfig(name=name, read_partitions=partitions, min_batch_bytes=1 << 20, max_batch_ms=10_000,
                       storage_group="", retention_ms=30 * 60_000)


def demo_value(i: int) -> bytes:
    return b"demo message %d" % i


def reading_value(i: int) -> bytes:
    """A value of the batched topic: ~110 bytes, about half of them random (zstd leaves ~60)."""
    return b"reading %d %s" % (i, os.urandom(48).hex().encode())


@click.command()
@click.option("--brokers", "broker_count", type=click.IntRange(1, 16), default=2, show_default=True,
              help="Broker processes to start (racks round-robin; a topic wants 2 on different racks).")
@click.option("--topic", "topic_name", default="demo", show_default=True, help="Demo topic.")
@click.option("--partitions", type=click.IntRange(min=1), default=3, show_default=True,
              help="Read partitions of the demo topic.")
@click.option("--rate", type=click.FloatRange(min=0), default=1000.0, show_default=True,
              help="Demo messages per second (0: no demo traffic).")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Stop by itself after this many seconds.")
@click.option("--audit-port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port of the audit dashboard (0: a free one, printed as 'audit:').")
@click.option("--tls", is_flag=True,
              help="Security on: a throwaway CA, TLS on every broker, token authentication and ACLs; "
                   "the client config trusts the CA and holds a token.")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".memq-run/dev"),
              show_default=True, help="Logs, ZooKeeper data and the generated client config.")
def dev(broker_count: int, topic_name: str, partitions: int, rate: float, duration: float | None,
        audit_port: int, tls: bool, run_dir: Path) -> None:
    """Run memq locally: S3, Kafka, ZooKeeper, governed brokers and demo traffic (Ctrl-C stops)."""
    from memq.devcluster import GovernedCluster

    console = Console()
    # SIGTERM ends the run like Ctrl-C, so every `finally` below stops what it started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    run_dir = run_dir.resolve()
    security = make_dev_security(run_dir / "tls") if tls else None
    try:
        with ExitStack() as stack:
            console.print(f"starting S3, Kafka, ZooKeeper and {broker_count} governed "
                          f"broker{'s' if broker_count > 1 else ''}...")
            cluster = stack.enter_context(GovernedCluster(
                run_dir, broker_count, ready_timeout_s=READY_TIMEOUT_S, security=security,
                broker=BrokerConfig(kafka_port=0)))
            governor = cluster.governor()
            placed = cluster.create_topic(TopicConfig(name=topic_name, read_partitions=partitions))
            topics: dict[str, Callable[[int], bytes]] = {topic_name: demo_value}
            if rate > 0:
                topics[f"{topic_name}-batched"] = reading_value
                batched = cluster.create_topic(batched_topic(f"{topic_name}-batched", partitions))
            config, client = cluster.base, cluster.config()
            config_path = cluster.write_client_config(run_dir / "memq.toml")
            endpoints = {
                "S3": f"{config.s3.endpoint_url}  (bucket {config.s3.bucket})",
                "Kafka": config.kafka.bootstrap_servers,
                "ZooKeeper": f"{config.zookeeper.hosts}  (root {config.zookeeper.root}, cluster {config.cluster.name})",
                "brokers": "  ".join(f"{b.url} ({bid}, {cluster.rack(bid)})" for bid, b in cluster.brokers.items()),
                "governor": f"{governor} ({cluster.broker(governor).url})",
                "Kafka API": _kafka_listeners(cluster.broker(governor).url, client),
                # every broker serves Confluent's registry API on its HTTP port; any takes writes
                "schema registry": "  ".join(b.url for b in cluster.brokers.values()),
                "placement": _placement_line(topic_name, placed, cluster),
            }
            if rate > 0:
                endpoints["placement"] += "; " + _placement_line(f"{topic_name}-batched", batched,
                                                                 cluster).split("  --")[0]
            if security is not None:
                endpoints["security"] = (f"TLS (CA {security.ca_file}), token of principal {security.principal} "
                                         "in the client config, ACLs allow it everything")
                endpoints["Kafka API"] += f"  (SASL_SSL, PLAIN: user {security.principal}, password its token)"
            # Further services (e.g. the audit dashboard) start here and add their endpoint.
            if config.audit.enabled:
                from memq.audit.dashboard import AuditThread
                audit = stack.enter_context(AuditThread(client, db_path=str(run_dir / "audit.db"),
                                                             port=audit_port))
                endpoints["audit"] = audit.url
            endpoints["config"] = str(config_path)
            endpoints["logs"] = str(run_dir)
            _print_endpoints(endpoints, config_path, topic_name)
            demo = stack.enter_context(DemoTraffic(client, topics, rate)) if rate > 0 else None
            _watch(console, demo, duration)
    except KeyboardInterrupt:
        pass
    except MemqError as e:
        raise click.ClickException(f"{type(e).__name__}: {e}") from None
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    console.print("memq dev stopped")


def _placement_line(topic: str, placed: tuple[str, ...], cluster: GovernedCluster) -> str:
    """Where the governor put the topic; with fewer than 2 brokers, say what is missing."""
    line = f"{topic} on " + ", ".join(f"{b} ({cluster.rack(b)})" for b in placed)
    if len(placed) < 2:
        line += ("  -- a topic wants 2 brokers on different racks; with one broker there is "
                 "no failover (use --brokers 2 or more)")
    return line


def _print_endpoints(endpoints: dict[str, str], config_path: Path, topic: str) -> None:
    """Plain `name: value` lines (never wrapped), so scripts can read them too."""
    width = max(map(len, endpoints)) + 1
    for name, value in endpoints.items():
        click.echo(f"{name + ':':<{width}} {value}")
    memq = _memq_command()
    lines = [f"try:  {memq} --config {config_path} consume {topic} --count",
             f"      echo hello | {memq} --config {config_path} produce {topic}"]
    kafka = endpoints["Kafka API"].split(",")[0].split()[0]
    if "security" in endpoints:
        ca = config_path.parent / "tls" / "ca.pem"
        lines.append(f"      {memq} --config {config_path} token create alice   # through the brokers, "
                     "applied at once")
        lines.append(f"      {memq} --config {config_path} acl add allow alice produce literal:{topic}")
        lines.append(f"      echo hello | kcat -P -b {kafka} -t {topic} -X security.protocol=SASL_SSL "
                     f"-X sasl.mechanisms=PLAIN -X sasl.username={DEV_PRINCIPAL} -X sasl.password=TOKEN -X ssl.ca.location={ca}"
                     "   # TOKEN: producer.token in the config")
    else:
        lines.append(f"      echo hello | kcat -P -b {kafka} -t {topic}   # or any Kafka producer")
    click.echo("\n".join([*lines, "Ctrl-C stops everything."]))
    sys.stdout.flush()


def _kafka_listeners(broker_url: str, client: MemqConfig) -> str:
    """Every broker's Kafka listener (any one is a bootstrap server for Kafka producers)."""
    from memq.client._auth import BrokerAuth
    from memq.client.cluster import fetch_metadata
    brokers = fetch_metadata(broker_url, 10.0, BrokerAuth.of(client.producer)).brokers
    return ",".join(b.kafka_address for b in brokers if b.kafka_address)


def _memq_command() -> str:
    """The `memq` script by full path: the shell the user pastes into may not have the
    virtualenv activated, so a bare `memq` would not be found."""
    script = Path(sys.executable).with_name("memq")
    return shlex.quote(str(script)) if script.exists() else "memq"


def _watch(console: Console, demo: DemoTraffic | None, duration: float | None) -> None:
    """Show live demo counts until `duration` passes (or forever, until Ctrl-C/SIGTERM)."""
    start = time.monotonic()
    end = start + duration if duration is not None else float("inf")
    try:
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            while time.monotonic() < end:
                if demo is not None:
                    elapsed = max(time.monotonic() - start, 1e-9)
                    demo.check()
                    live.update(f"demo ({len(demo.topics)} topics): produced {demo.acked:,} "
                                f"({demo.acked / elapsed:,.0f}/s)  consumed {demo.consumed:,} "
                                f"({demo.consumed / elapsed:,.0f}/s)")
                time.sleep(min(0.25, max(0.0, end - time.monotonic())))
    finally:
        if not console.is_terminal:
            console.line()                  # Live's last frame ends without a newline
    console.print("duration reached, stopping")


class DemoTraffic:
    """A producer at `rate` msg/s to each demo topic (topic -> its values by number) and a
    consumer of each, each in its own thread."""

    def __init__(self, config: MemqConfig, topics: dict[str, Callable[[int], bytes]], rate: float) -> None:
        self.acked = 0
        self.consumed = 0
        self.topics = dict(topics)
        self._config = config
        self._rate = rate
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._audit = make_audit_sink(config, client_id="memq-dev-demo")
        self._threads = [threading.Thread(target=self._guard, args=(self._produce,), name="memq-dev-produce")]
        self._threads += [threading.Thread(target=self._guard, args=(self._consume, t), name=f"memq-dev-consume-{t}")
                          for t in self.topics]

    def __enter__(self) -> DemoTraffic:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)
        if self._audit is not None:
            self._audit.close()

    def check(self) -> None:
        """Re-raise a failure of the demo threads in the caller."""
        if self._errors:
            raise self._errors[0]

    def _guard(self, fn: object, *args: object) -> None:
        try:
            fn(*args)  # type: ignore[operator]
        except BaseException as e:  # surfaced by check() in the main thread
            self._errors.append(e)

    def _produce(self) -> None:
        from memq.client.producer import Producer

        async def run() -> None:
            start = time.monotonic()
            sent = 0
            pending: list[asyncio.Future[list]] = []
            async with Producer(self._config.producer, audit=self._audit) as producer:
                while not self._stop.is_set():
                    due = int((time.monotonic() - start) * self._rate) - sent
                    if due > 0:
                        for topic, value in self.topics.items():
                            pending.append(await producer.send_many(topic, [value(i) for i in range(sent, sent + due)]))
                        sent += due
                    for fut in [f for f in pending if f.done()]:
                        pending.remove(fut)
                        self.acked += sum(d.count for d in fut.result())
                    await asyncio.sleep(0.05)

        asyncio.run(run())

    def _consume(self, topic: str) -> None:
        from memq.client.consumer import Consumer

        with Consumer(self._config, topic, group_id=_DEMO_GROUP, audit=self._audit) as consumer:
            while not self._stop.is_set():
                got = sum(1 for _ in consumer.poll(0.25))
                if got:
                    self.consumed += got
                    consumer.commit(asynchronous=True)
