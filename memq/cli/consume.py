"""`memq consume TOPIC`: print values (one per line), or count them with a live rate."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager, nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, Literal

import click
from rich.console import Console
from rich.live import Live

from memq.audit.emitter import make_audit_sink
from memq.cli._common import config_of

if TYPE_CHECKING:
    from memq.client.consumer import Consumer
    from memq.compaction.manifest import ManifestPointers
    from memq.config import MemqConfig


@click.command()
@click.argument("topic")
@click.option("--group", "-g", default=None, help="Consumer group (default: consumer.group_id).")
@click.option("--from-beginning", is_flag=True, help="Start at the first batch, not the committed position.")
@click.option("--max-messages", "-n", type=click.IntRange(min=1), default=None, help="Stop after N messages.")
@click.option("--count", "count_only", is_flag=True, help="Do not print messages: show the count and rate.")
@click.option("--idle-timeout", type=click.FloatRange(min=0), default=None,
              help="Stop when no message came for this many seconds.")
@click.option("--keys", is_flag=True, help="Print 'key<TAB>value'.")
@click.option("--read-path", type=click.Choice(["auto", "broker", "s3"]), default=None,
              help="Read parts through a broker's cache near the tail and from S3 far behind (auto), "
                   "always through a broker, or always from S3 (default: consumer.read_path).")
@click.pass_context
def consume(ctx: click.Context, topic: str, group: str | None, from_beginning: bool,
            max_messages: int | None, count_only: bool, idle_timeout: float | None, keys: bool,
            read_path: Literal["auto", "broker", "s3"] | None) -> None:
    """Read TOPIC; commits after each batch (at-least-once) and on exit."""
    config = config_of(ctx)
    if read_path is not None:
        config = replace(config, consumer=replace(config.consumer, read_path=read_path))
    from memq.client.cluster import resolve_topic   # after the config: bad settings fail first
    from memq.client.consumer import Consumer
    from memq.notify import TopicAdmin

    # The brokers first (a topic this principal may not see is refused as such, existing or
    # not), then Kafka answers and the topic exists, before anything else talks to Kafka.
    resolved = resolve_topic(config, topic)
    TopicAdmin(resolved.config.kafka).partitions(resolved.topic.notification_topic)
    if from_beginning:
        config = replace(config, consumer=replace(config.consumer, auto_offset_reset="earliest"))
    err = Console(stderr=True)
    out = sys.stdout.buffer
    seen = 0
    start = time.monotonic()
    stop = _stop_on_signals()
    # A live line only on a terminal: elsewhere its last frame has no newline and the summary
    # would be glued to it.
    show_live = count_only and err.is_terminal
    live = Live(console=err, transient=False, refresh_per_second=4, redirect_stdout=False)
    audit = make_audit_sink(config, client_id="memq-consume")   # None when [audit] enabled = false
    with closing(audit) if audit is not None else nullcontext(), \
            _pointers(config, resolved.topic.cleanup_policy) as pointers, \
            Consumer(config, topic, group_id=group, audit=audit, pointers=pointers) as consumer, \
            live if show_live else nullcontext():
        try:
            _wait_assignment(consumer, 30.0, stop)
            if from_beginning:
                consumer.seek_to_beginning()
            start = last = time.monotonic()      # idle time counts once this member has partitions
            while not stop.is_set() and (max_messages is None or seen < max_messages):
                got = 0
                for record in consumer.poll(0.5):
                    got += 1
                    if not count_only:
                        if keys:
                            out.write((record.key or b"") + b"\t")
                        out.write((record.value or b"") + b"\n")   # a compacted tombstone: None
                    if stop.is_set() or (max_messages is not None and seen + got >= max_messages):
                        break
                seen += got
                now = time.monotonic()
                if got:
                    last = now
                    out.flush()
                    consumer.commit(asynchronous=True)
                elif idle_timeout is not None and now - last >= idle_timeout:
                    break
                if show_live:
                    live.update(f"[bold]{topic}[/]: {seen:,} messages, {seen / max(now - start, 1e-9):,.0f} msg/s")
        except KeyboardInterrupt:
            pass
        finally:
            out.flush()
            consumer.commit()
    elapsed = time.monotonic() - start
    m = consumer.metrics
    err.print(f"{seen:,} messages from {topic} in {elapsed:.1f} s ({seen / max(elapsed, 1e-9):,.0f} msg/s); "
              f"{m.duplicates_dropped:,} duplicates dropped ({m.duplicate_messages:,} retried Messages), "
              f"{m.expired:,} expired; parts: {m.parts_via_broker:,} through brokers, {m.parts_via_s3:,} from "
              f"storage ({m.broker_fallbacks:,} fallen back)")


@contextmanager
def _pointers(config: MemqConfig, cleanup_policy: str) -> Iterator[ManifestPointers | None]:
    """A compacted topic's prefixes through ZooKeeper, when the config names it (else the notifications alone)."""
    if "compact" not in cleanup_policy or not config.zookeeper.enabled:
        yield None
        return
    from memq.compaction.manifest import ManifestPointers
    from memq.governor.registry import Registry
    registry = Registry(config.zookeeper, config.cluster.name).start()
    try:
        yield ManifestPointers(registry)
    finally:
        registry.close()


def _stop_on_signals() -> threading.Event:
    """An event SIGTERM or Ctrl-C sets: the loop then ends between records, commits what it
    delivered and prints its summary (exit 0), instead of dying mid-batch or mid-line. A second
    Ctrl-C interrupts at once. A Ctrl-C the parent ignores stays ignored, as Unix asks (a
    non-interactive shell's background job starts so): such a consume ends on SIGTERM."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        def on_ctrl_c(*_: object) -> None:
            if stop.is_set():
                raise KeyboardInterrupt
            stop.set()
        signal.signal(signal.SIGINT, on_ctrl_c)
    return stop


def _wait_assignment(consumer: Consumer, timeout_s: float, stop: threading.Event) -> None:
    """Join the group first: partitions are only known once assigned, and a member that
    leaves in the middle of a join can stall the group on some brokers (tansu)."""
    deadline = time.monotonic() + timeout_s
    while not consumer.assignment() and not stop.is_set():
        if time.monotonic() >= deadline:
            raise click.ClickException(f"no partition of {consumer.topic} was assigned to this consumer")
        consumer.poll(0.2)  # not iterated: the next poll resumes it (or a seek drops it)
