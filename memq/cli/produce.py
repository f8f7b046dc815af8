"""`memq produce TOPIC`: lines from stdin, or generated load, with the chosen ack level.

A topic no broker hosts yet is waited for as a Producer does (Kafka's max.block.ms), but for
`--max-block` (default at most `CLI_MAX_BLOCK_S`: someone is watching), saying so while it waits.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable
from dataclasses import replace
from typing import TYPE_CHECKING, Literal, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from memq.audit.emitter import make_audit_sink
from memq.cli._common import config_of, require
from memq.config import ProducerConfig

if TYPE_CHECKING:
    from memq.client.producer import AuditSink, Delivery

_CHUNK = 10_000          # records per send_batch call
_READ_BYTES = 1 << 16
CLI_MAX_BLOCK_S = 10.0   # the default wait for a topic no broker hosts (a Producer's is 60 s)
_QUIET_S = 1.0           # a first send taking longer than this is waiting for its topic: say so
T = TypeVar("T")


@click.command()
@click.argument("topic")
@click.option("--ack", type=click.Choice(["0", "1", "all"]), default=None, help="Ack level (default: producer.ack).")
@click.option("--brokers", default=None, help="Comma-separated broker URLs (default: producer.brokers).")
@click.option("--generate", "-n", type=click.IntRange(min=1), default=None,
              help="Send N generated messages instead of reading stdin.")
@click.option("--size", type=click.IntRange(min=1), default=100, show_default=True,
              help="Value size of generated messages, in bytes.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Generated messages per second (default: as fast as acks allow).")
@click.option("--keys", is_flag=True, help="stdin lines are 'key<TAB>value'.")
@click.option("--max-block", "max_block_s", type=click.FloatRange(min=0), default=None,
              help=f"Seconds a send may block: for a broker to host TOPIC, or for room in "
                   f"producer.max_in_flight_bytes (default: producer.max_block_ms, at most {CLI_MAX_BLOCK_S:g}).")
@click.pass_context
def produce(ctx: click.Context, topic: str, ack: Literal["0", "1", "all"] | None, brokers: str | None, generate: int | None,
            size: int, rate: float | None, keys: bool, max_block_s: float | None) -> None:
    """Send lines from stdin (one message each) or generated messages to TOPIC."""
    config = config_of(ctx)
    block_ms = round(max_block_s * 1000) if max_block_s is not None else \
        min(config.producer.max_block_ms, round(CLI_MAX_BLOCK_S * 1000))
    pc = replace(config.producer, brokers=brokers or config.producer.brokers, ack=ack or config.producer.ack,
                 max_block_ms=block_ms)
    require(pc.brokers, "producer.brokers", "--brokers")
    err = Console(stderr=True)
    start = time.monotonic()
    audit = make_audit_sink(config, client_id="memq-produce")   # None when [audit] enabled = false
    try:
        if generate is not None:
            sent = asyncio.run(_generated(pc, topic, generate, size, rate, err, audit))
        else:
            sent = asyncio.run(_send(pc, topic, _stdin_chunks(keys), err, audit))
    finally:
        if audit is not None:
            audit.close()
    elapsed = time.monotonic() - start
    err.print(f"{sent:,} messages to {topic} in {elapsed:.1f} s ({sent / max(elapsed, 1e-9):,.0f} msg/s, ack={pc.ack})")


async def _stdin_chunks(keys: bool) -> AsyncIterator[list[tuple[bytes, bytes | None]]]:
    """(value, key) pairs per read: whatever arrived, so a slow pipe is sent line by line."""
    fd, rest = sys.stdin.fileno(), b""
    while data := await asyncio.to_thread(os.read, fd, _READ_BYTES):
        lines = (rest + data).split(b"\n")
        rest = lines.pop()
        if lines:
            yield [_split(line, keys) for line in lines]
    if rest:
        yield [_split(rest, keys)]


def _split(line: bytes, keys: bool) -> tuple[bytes, bytes | None]:
    line = line.rstrip(b"\r")
    if not keys:
        return line, None
    key, tab, value = line.partition(b"\t")
    return (value, key) if tab else (line, None)


async def _waiting_noted(send: Awaitable[T], topic: str, pc: ProducerConfig, err: Console) -> T:
    """`send` (a first one, which blocks while no broker hosts `topic`), saying what it waits
    for when that takes longer than _QUIET_S."""
    task = asyncio.ensure_future(send)
    done, _ = await asyncio.wait({task}, timeout=_QUIET_S)
    if not done:
        err.print(f"waiting for a broker to host topic {topic} (up to {pc.max_block_ms / 1000:g} s, --max-block)",
                  soft_wrap=True)
    return await task


async def _send(pc: ProducerConfig, topic: str, chunks: AsyncIterator[list[tuple[bytes, bytes | None]]],
                err: Console, audit: AuditSink | None) -> int:
    from memq.client.producer import Producer

    sent = 0
    pending: deque[asyncio.Future[list[Delivery]]] = deque()
    async with Producer(pc, audit=audit) as producer:
        async for chunk in chunks:
            values = [v for v, _ in chunk]
            ks = [k for _, k in chunk]
            sending = producer.send_many(topic, values, keys=ks if any(ks) else None)
            pending.append(await (_waiting_noted(sending, topic, pc, err) if not sent else sending))
            sent += len(chunk)
            while pending and pending[0].done():
                pending.popleft().result()
        for fut in pending:
            await fut
    return sent


async def _generated(pc: ProducerConfig, topic: str, count: int, size: int, rate: float | None,
                     err: Console, audit: AuditSink | None) -> int:
    from memq.client.producer import Producer

    pending: deque[asyncio.Future[list[Delivery]]] = deque()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    start = time.monotonic()
    with Progress(*columns, console=err, transient=False) as progress:
        task = progress.add_task(f"producing to {topic}", total=count)
        async with Producer(pc, audit=audit) as producer:
            sent = 0
            while sent < count:
                n = min(_CHUNK if rate is None else max(1, int(rate / 10)), count - sent)
                numbers = range(sent, sent + n)
                sending = producer.send_many(topic, [generated_value(i, size) for i in numbers],
                                             keys=[b"%d" % i for i in numbers])
                pending.append(await (_waiting_noted(sending, topic, pc, err) if not sent else sending))
                sent += n
                while pending and pending[0].done():
                    progress.advance(task, _count(pending.popleft().result()))
                if rate is not None:
                    await asyncio.sleep(max(0.0, start + sent / rate - time.monotonic()))
            while pending:
                progress.advance(task, _count(await pending.popleft()))
    return count


def generated_value(number: int, size: int) -> bytes:
    """Generated message `number`: its number, padded to `size` bytes (longer if the number
    needs it), so consumed values show which message each is and duplicates stand out."""
    digits = b"%d" % number
    return digits + (b" " + b"memq" * (size // 4 + 1))[:max(0, size - len(digits))]


def _count(deliveries: list[Delivery]) -> int:
    """Records acknowledged by one send_many (each Delivery covers a run of records)."""
    return sum(d.count for d in deliveries)
