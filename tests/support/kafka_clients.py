"""A broker with a Kafka listener in a thread, and confluent-kafka producing to it: the Kafka-client side of the tests."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from memq.broker.server import Broker
from memq.client.producer import Producer as MemqProducer
from memq.config import MemqConfig, ProducerConfig, TopicConfig
from memq.format import LogMessage


T0 = 1_700_000_000_000   # the records' timestamps start here

Row = tuple[bytes, bytes | None, tuple[tuple[str, bytes], ...], int]


@dataclasses.dataclass
class Running:
    config: MemqConfig
    broker: Broker
    loop: asyncio.AbstractEventLoop

    def add_topic(self, partitions: int = 3, batch_ms: int = 50, **settings: int | str) -> str:
        """`settings`: other TopicConfig fields, e.g. batch_bytes or kafka_compression."""
        name = f"kafka-{uuid.uuid4().hex[:8]}"
        topic = TopicConfig(name=name, read_partitions=partitions, batch_ms=batch_ms, **settings)
        asyncio.run_coroutine_threadsafe(self.broker.add_topic(topic), self.loop).result(30)
        return name


def memq_produce(running: Running, topic: str, records: list[LogMessage], codec: str = "zstd") -> None:
    """`records` through memq's Producer, 100 a Message, all acked."""

    async def send() -> None:
        cfg = ProducerConfig(brokers=running.broker.url, linger_ms=5, request_timeout_ms=20_000, codec=codec)
        async with MemqProducer(cfg) as p:
            futures = [await p.send_batch(topic, records[i:i + 100]) for i in range(0, len(records), 100)]
            await p.flush()
            for f in futures:
                await f
    asyncio.run_coroutine_threadsafe(send(), running.loop).result(120)


@contextlib.contextmanager
def broker_thread(config: MemqConfig) -> Iterator[Running]:
    """One broker with a Kafka listener (in this process, on its own loop thread)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    broker = Broker(config)
    asyncio.run_coroutine_threadsafe(broker.start(), loop).result(30)
    try:
        yield Running(config, broker, loop)
    finally:
        asyncio.run_coroutine_threadsafe(broker.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def rows(n: int, tag: str) -> list[LogMessage]:
    return [LogMessage(b"%s-value-%d" % (tag.encode(), i) + b"x" * (i % 50), b"key-%d" % (i % 7) if i % 5 else None,
                       (("n", b"%d" % i), ("tag", tag.encode())) if i % 2 else (), T0 + i)
            for i in range(n)]


def kafka_produce(address: str, topic: str, records: list[LogMessage], **conf: object) -> None:
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    p = Producer({"bootstrap.servers": address, "linger.ms": 5, "message.timeout.ms": 30_000, **conf})
    for r in records:
        p.produce(topic, value=r.value, key=r.key, headers=list(r.headers) or None, timestamp=r.timestamp_ms,
                  on_delivery=delivered)
        p.poll(0)
    assert p.flush(60) == 0
    assert errors == []


def as_rows(records: list[LogMessage]) -> list[Row]:
    return [(r.value, r.key, r.headers, r.timestamp_ms) for r in records]


def read_committed(address: str, topic: str, *, partitions: int, settle_s: float = 1.5,
                   timeout_s: float = 30.0) -> list[str]:
    """Every value of `topic` a confluent-kafka read_committed reader gets, once each partition is
    at its end for `settle_s`."""
    c = Consumer({"bootstrap.servers": address, "group.id": f"r-{uuid.uuid4().hex[:6]}",
                  "isolation.level": "read_committed", "enable.partition.eof": True, "fetch.wait.max.ms": 100})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[str] = []
    ends: set[int] = set()
    quiet = time.monotonic()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() and m.error().code() == KafkaError._PARTITION_EOF:
                ends.add(m.partition())
            elif m is not None:
                assert not m.error(), m.error()
                got.append(m.value().decode())
                ends.discard(m.partition())
                quiet = time.monotonic()
            if len(ends) == partitions and time.monotonic() - quiet > settle_s:
                return got
    finally:
        c.close()
    raise AssertionError(f"read_committed of {topic} did not reach its end (got {len(got)})")


def read_to_end(address: str, topic: str, offset: int, partition: int = 0,
                **conf: object) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of `partition` from `offset` to its end (Kafka's end of partition),
    read by confluent-kafka; AssertionError when no end comes within a minute (the high watermark
    past the last record a reader gets)."""
    consumer = Consumer({"bootstrap.servers": address, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "error", "enable.partition.eof": True, **conf})
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        got: list[tuple[int, bytes | None, bytes | None]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = consumer.poll(1.0)
            if m is None:
                continue
            if m.error():
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                return got
            got.append((m.offset(), m.key(), m.value()))
        raise AssertionError(f"{topic}[{partition}]: no end of partition after {got[-3:]}: the high watermark "
                             "is past the last record a reader gets")
    finally:
        consumer.close()
