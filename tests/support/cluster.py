"""Helpers on a running broker and the dev cluster: topic and producer configs, a broker
in-process, reading back what it stored and notified, batches written straight to storage."""

from __future__ import annotations

from dataclasses import dataclass

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from memq.broker.server import Broker
from memq.config import MemqConfig, ProducerConfig, TopicConfig
from memq.format import LogMessage, Notification, decode_batch, split_parts
from memq.storage import ObjectLocation, make_storage
from collections.abc import Sequence
from memq.client.consumer import Consumer, ConsumerRecord, notification_topic
from memq.format import (NOTIFICATION_VERSION, Codec, decode_message_header,
                         encode_batch, encode_message, object_crc32c)
from memq.notify import NotificationPublisher
from tests.support.readback import read_notification_log


# a stored LogMessage: (producer id, epoch, sequence, position in Message) -> (key, value, headers)
Stored = dict[tuple[int, int, int, int], tuple[bytes | None, bytes, tuple]]


@dataclass(frozen=True)
class Written:
    """One batch as written: where its notification and object are, and what it holds."""

    partition: int
    offset: int
    location: ObjectLocation
    messages: tuple[tuple[int, int, int, tuple[LogMessage, ...]], ...]   # (pid, epoch, seq, records)
    published_ms: int

    @property
    def records(self) -> list[LogMessage]:
        return [r for *_, recs in self.messages for r in recs]


@asynccontextmanager
async def running_broker(config: MemqConfig) -> AsyncIterator[Broker]:
    broker = Broker(config)
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


async def read_stored(config: MemqConfig, topic: str) -> tuple[Stored, dict[str, int], list[str]]:
    """Every LogMessage in the topic's S3 objects; duplicates counted; object keys listed.

    A topic with objects of its own is listed in S3 (so a batch stored but never announced is
    found too); a topic of a shared storage group (the default for one not in `config.topics`)
    is read through its notifications, the only record of which parts are its own."""
    t = next((t for t in config.topics if t.name == topic), TopicConfig(topic))
    storage = make_storage(config)
    try:
        if t.storage_group:
            notes = await asyncio.to_thread(read_notifications, config.kafka.bootstrap_servers,
                                            t.notification_topic_for(config.cluster.name))
            keys = list(dict.fromkeys(n.key for n in notes))
            blobs = [await storage.get_range(ObjectLocation(n.bucket, n.key), n.offset, n.size) for n in notes]
        else:
            infos = await storage.list_topic(topic, 0, 2**62)
            keys = [i.location.key for i in infos]
            blobs = [part for i in infos for part in split_parts(await storage.get(i.location))]   # a part per partition
        stored: Stored = {}
        dups: Counter[tuple[int, int, int, int]] = Counter()
        for blob in blobs:
            _, messages = decode_batch(blob)
            for mh, records in messages:
                for pos, r in enumerate(records):
                    ident = (mh.producer_id, mh.epoch, mh.sequence, pos)
                    dups[ident] += ident in stored
                    stored[ident] = (r.key, r.value, tuple(map(tuple, r.headers)))
        return stored, {str(k): v for k, v in dups.items() if v}, keys
    finally:
        await storage.close()


def read_notifications(bootstrap: str, kafka_topic: str, timeout_s: float = 30) -> list[Notification]:
    """Every notification on the topic, read from the beginning up to the high watermarks."""
    return [r.note for r in read_notification_log(bootstrap, kafka_topic, timeout_s).records]


def topic_config(name: str, **kw: Any) -> TopicConfig:
    """Topics of their own objects ("" group): `read_stored` lists them by topic. Sparse offsets
    unless told: these tests read with Kafka and S3 alone, often after their brokers stopped, and a
    dense topic's reader asks a broker where its offsets stand."""
    return TopicConfig(name, **{"batch_bytes": 2 * 1024 * 1024, "max_message_bytes": 1024 * 1024, "batch_ms": 100,
                              "read_partitions": 3, "storage_group": "", "offsets": "sparse", **kw})


def producer_config(url: str, **kw: Any) -> ProducerConfig:
    return ProducerConfig(brokers=url, **{"linger_ms": 5, "request_timeout_ms": 20_000, **kw})


def write_batches(config: MemqConfig, topic: str, batches: Sequence[Sequence[tuple[int, int, int, Sequence[LogMessage]]]],
                  *, gap_s: float = 0.0) -> list[Written]:
    """Store each batch as one object and publish its notification, like a broker does."""

    async def run() -> list[Written]:
        storage = make_storage(config)
        publisher = NotificationPublisher(config.kafka, client_id="test-writer")
        out = []
        try:
            for batch in batches:
                msgs = [encode_message(list(recs), producer_id=pid, epoch=ep, sequence=seq, codec=Codec.ZSTD)
                        for pid, ep, seq, recs in batch]
                headers = [decode_message_header(m) for m in msgs]
                now = int(time.time() * 1000)
                chunks = encode_batch(msgs, headers, broker_id="test", created_ms=now)
                first = headers[0]
                loc = await storage.put_batch(topic, chunks, first_request_id=first.sequence,
                                              timestamp_ms=now, broker_id="test")
                note = Notification(
                    v=NOTIFICATION_VERSION, topic=topic, bucket=loc.bucket, key=loc.key,
                    size=sum(len(c) for c in chunks), header_size=len(chunks[0]), message_count=len(msgs),
                    logmessage_count=sum(h.count for h in headers),
                    min_timestamp_ms=min(h.min_timestamp_ms for h in headers),
                    max_timestamp_ms=max(h.max_timestamp_ms for h in headers),
                    crc32c=object_crc32c(chunks), broker_id="test", attempt=0, created_ms=now)
                if gap_s:
                    await asyncio.sleep(gap_s)
                published = int(time.time() * 1000)
                partition, offset = await publisher.publish(notification_topic(config, topic), note)
                out.append(Written(partition, offset, loc,
                                   tuple((p, e, s, tuple(r)) for p, e, s, r in batch), published))
                if gap_s:
                    await asyncio.sleep(gap_s)
        finally:
            publisher.close()
            await storage.close()
        return out

    return asyncio.run(run())


def records(n: int, tag: str, start: int = 0) -> list[LogMessage]:
    base = int(time.time() * 1000)
    return [LogMessage(value=f"{tag}-value-{i}".encode() * 3, key=f"{tag}-{i}".encode(),
                       headers=(("i", str(i).encode()), ("tag", tag.encode())), timestamp_ms=base + i)
            for i in range(start, start + n)]


def drain(consumer: Consumer, expect: int, timeout_s: float = 30.0) -> list[ConsumerRecord]:
    """Poll until `expect` records arrived (fails on timeout), each poll fully iterated."""
    out: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < expect:
        assert time.monotonic() < deadline, f"got {len(out)} of {expect} records"
        out.extend(consumer.poll(0.5))
    return out
