"""What a read-back of a topic saw, for a failing assertion to print: every notification where
Kafka holds it, the Messages of the part it names, and where the producer was told each
Message went (its ack) next to what is there now.

A record missing from `read_stored` can be a record the broker never stored (lost acked
data), a notification Kafka does not hand out, or a read-back that skipped it; the acks say
which: each names its object key and its notification's (partition, offset).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka import Consumer as KafkaConsumer

from memq.client.producer import Delivery
from memq.config import MemqConfig, TopicConfig
from memq.errors import MemqError
from memq.format import Notification, decode_batch, split_parts
from memq.storage import ObjectLocation, StorageHandler, make_storage


@dataclass(frozen=True)
class Placed:
    """One notification and where Kafka holds it."""

    partition: int
    offset: int
    note: Notification


@dataclass
class NotificationLog:
    """A notification topic read from the beginning up to its high watermarks."""

    records: list[Placed] = field(default_factory=list)
    watermarks: dict[int, tuple[int, int]] = field(default_factory=dict)   # partition -> (low, high)
    errors: list[str] = field(default_factory=list)   # what the consumer reported instead of a record


def read_notification_log(bootstrap: str, kafka_topic: str, timeout_s: float = 30) -> NotificationLog:
    """Every notification on the topic, with its place, read up to the high watermarks taken first."""
    c = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": f"verify-{uuid.uuid4().hex}",
                       "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        parts = list(c.list_topics(kafka_topic, timeout=10).topics[kafka_topic].partitions)
        log = NotificationLog(watermarks={p: c.get_watermark_offsets(TopicPartition(kafka_topic, p), timeout=10)
                                          for p in parts})
        c.assign([TopicPartition(kafka_topic, p, OFFSET_BEGINNING) for p in parts])
        pos = {p: 0 for p in parts}
        deadline = time.monotonic() + timeout_s
        while any(pos[p] < log.watermarks[p][1] for p in parts):
            assert time.monotonic() < deadline, f"notifications not read within {timeout_s}s: {pos} of {log.watermarks}"
            for m in c.consume(500, 0.5):
                err = m.error()
                if err is not None:
                    log.errors.append(f"partition {m.partition()}: {err}")
                    continue
                part, offset = m.partition(), m.offset()
                assert part is not None and offset is not None
                log.records.append(Placed(part, offset, Notification.from_bytes(m.value())))
                pos[part] = offset + 1
        return log
    finally:
        c.close()


async def readback_report(config: MemqConfig, topic: str, acks: Sequence[tuple[bytes, Delivery]] = ()) -> str:
    """Lines saying what the topic's notifications and parts hold and, for each (value, ack),
    whether its notification and its Message are where the ack says."""
    t = next((t for t in config.topics if t.name == topic), TopicConfig(topic))
    kafka_topic = t.notification_topic_for(config.cluster.name)
    log = await asyncio.to_thread(read_notification_log, config.kafka.bootstrap_servers, kafka_topic)
    lines = [f"notification topic {kafka_topic}: watermarks (low, high) {log.watermarks}, "
             f"consumer errors {log.errors or 'none'}"]
    storage = make_storage(config)
    try:
        for r in log.records:
            n = r.note
            lines.append(f"  [{r.partition}@{r.offset}] {n.topic} {n.key} part {n.offset}+{n.size} "
                         f"attempt {n.attempt} created {n.created_ms}: "
                         + await _part(storage, ObjectLocation(n.bucket, n.key), n.offset, n.size))
        for value, d in acks:
            at = [r for r in log.records if (r.partition, r.offset) == (d.partition, d.offset)]
            lines.append(f"ack of {value!r}: pid {d.producer_id} epoch {d.epoch} seq {d.sequence} in {d.key} "
                         f"Message {d.index}, notification {d.partition}@{d.offset}: "
                         + (f"read back, naming {at[0].note.key}" if at else "NOT read back")
                         + "; the object holds " + await _part(storage, ObjectLocation(d.bucket, d.key), 0, None))
    finally:
        await storage.close()
    return "\n".join(lines)


async def _part(storage: StorageHandler, loc: ObjectLocation, offset: int, size: int | None) -> str:
    """The Messages (producer id, epoch, sequence: values) of the batches at a byte range (None: the object)."""
    try:
        blob = await (storage.get(loc) if size is None else storage.get_range(loc, offset, size))
        out = []
        for part in split_parts(blob):
            _, messages = decode_batch(part)
            out += [f"({h.producer_id}, {h.epoch}, {h.sequence}): {[r.value for r in recs]}" for h, recs in messages]
        return "; ".join(out) or "no Messages"
    except MemqError as e:
        return f"unreadable: {type(e).__name__}: {e}"
