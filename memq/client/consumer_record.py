"""What the Consumer hands to the application: `ConsumerRecord`s, built in bulk from a decoded batch."""

from __future__ import annotations

from itertools import repeat
from operator import add
from typing import NamedTuple

from memq.client.reader import BatchPointer, Decoded
from memq.format import LogMessage, MessageHeader
from memq.notify import NotificationRecord
from memq.storage import ObjectLocation

_tuple_new = tuple.__new__


class ConsumerRecord(NamedTuple):
    """One LogMessage as handed to the application, with where it came from.

    A NamedTuple whose first five fields are LogMessage's, so a batch's records are built in
    bulk (tuple concatenation in C) rather than one Python constructor call each.
    """

    value: bytes
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int
    message_id: bytes | None
    topic: str
    partition: int                 # read partition = notification topic partition
    offset: int                    # notification offset (the batch)
    index: int   # type: ignore[assignment]  # LogMessage index inside the batch; shadows tuple.index (public name)
    producer_id: int
    epoch: int
    sequence: int
    location: ObjectLocation


DecodedBatch = list[tuple[MessageHeader, list[ConsumerRecord]]]
"""A batch's Messages in order, each its header and its records."""


def batch_pointer(topic: str, rec: NotificationRecord) -> BatchPointer:
    """Where the batch `rec` notifies is, and the size and CRC32C it must have."""
    n = rec.notification
    return BatchPointer(topic, ObjectLocation(n.bucket, n.key), n.size, n.crc32c, rec.partition, rec.offset,
                        n.offset)


def build_records(topic: str, rec: NotificationRecord, decoded: Decoded) -> DecodedBatch:
    """Bulk-build ConsumerRecords: LogMessage + position tuple, concatenated and re-typed in C
    (run in the reader's CPU worker)."""
    n = rec.notification
    partition, offset, loc = rec.partition, rec.offset, ObjectLocation(n.bucket, n.key)
    _, messages = decoded
    out: DecodedBatch = []
    first = 0
    for h, logs in messages:
        pid, epoch, seq = h.producer_id, h.epoch, h.sequence
        tails = [(topic, partition, offset, i, pid, epoch, seq, loc)
                 for i in range(first, first + len(logs))]
        out.append((h, list(map(_tuple_new, repeat(ConsumerRecord), map(add, logs, tails)))))
        first += len(logs)
    return out


def record_at(ptr: BatchPointer, partition: int, offset: int, index: int, header: MessageHeader,
              log_message: LogMessage) -> ConsumerRecord:
    """The ConsumerRecord of one LogMessage read by position (random access)."""
    return ConsumerRecord(*log_message, ptr.topic, partition, offset, index,
                          header.producer_id, header.epoch, header.sequence, ptr.location)
