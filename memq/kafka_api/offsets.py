"""Kafka offsets of memq records: a pure function of where a record is.

A record's Kafka offset is `notification offset << PART_RECORD_BITS | index`, where the
notification offset is its part's notification's offset in the notification partition (the
Kafka partition of the same number) and `index` its position among the part's LogMessages. So
every broker computes the same offset, after any restart, with no index stored anywhere; the
offsets of a partition grow with its notifications, and gaps (a part holds fewer than 2**24
records) are fine: Kafka clients accept them.

Why 24 bits: a broker never lets a part hold more than `MAX_PART_LOGMESSAGES` = 2**24 records
(it seals before, `memq.broker.processor`), 16x the default `batch_messages`; the remaining 39
bits of Kafka's signed i64 number 5.5e11 notifications per partition, 43 years at 400 parts a
second per partition.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memq.errors import InvalidInputError
from memq.format.batch import MAX_PART_LOGMESSAGES, PART_RECORD_BITS

#: The first notification offset whose records' Kafka offsets would overflow an i64.
MAX_NOTIFICATION_OFFSET = 1 << (63 - PART_RECORD_BITS)


def kafka_offset(notification_offset: int, index: int) -> int:
    """The Kafka offset of record `index` of the part announced at `notification_offset`."""
    if not 0 <= notification_offset < MAX_NOTIFICATION_OFFSET or not 0 <= index < MAX_PART_LOGMESSAGES:
        raise InvalidInputError(f"no Kafka offset for record {index} of notification {notification_offset}: "
                                f"want 0 <= notification < {MAX_NOTIFICATION_OFFSET}, "
                                f"0 <= index < {MAX_PART_LOGMESSAGES}")
    return notification_offset << PART_RECORD_BITS | index


def split_offset(offset: int) -> tuple[int, int]:
    """(notification offset, record index) of a Kafka offset >= 0: the inverse of `kafka_offset`."""
    if offset < 0:
        raise InvalidInputError(f"Kafka offset {offset} is negative")
    return offset >> PART_RECORD_BITS, offset & (MAX_PART_LOGMESSAGES - 1)


def first_offset(notification_offset: int) -> int:
    """The Kafka offset where the part at `notification_offset` starts (a watermark's image)."""
    return notification_offset << PART_RECORD_BITS


def end_offset(notification_offset: int, count: int) -> int:
    """The Kafka offset just after the last of the `count` records of the part at
    `notification_offset`: the high watermark while that part is the partition's last, so a
    reader that read everything has no lag (and gets its end-of-partition event)."""
    return first_offset(notification_offset) + min(max(count, 0), MAX_PART_LOGMESSAGES)


def produce_base_offset(placed: Sequence[tuple[int, int, int]],
                        offset_of: Callable[[int, int], int] = kafka_offset) -> int:
    """The base offset a Produce response gives for one partition's batches, each placed at
    (notification offset, index of its first record in that part, record count), in request
    order: the first record's Kafka offset (`offset_of`: the topic's scheme) when the batches' records
    are consecutive in one part (a client numbers the request's records base, base + 1, ...), else
    unknown: also when a
    place is unknown (notification offset or index < 0: acks=1). Unknown is minus the request's
    record count, so that every record's number is negative, ending at Kafka's -1: librdkafka
    and aiokafka number from -1 on (0, 1, ...: offsets of other records), Java and kafka-python
    report -1 for all; a negative offset is "not known" to every client."""
    unknown = -max(sum(count for _, _, count in placed), 1)
    if not placed or any(n < 0 or i < 0 for n, i, _ in placed):
        return unknown
    note, first, _ = placed[0]
    expect = first
    for n, i, count in placed:
        if n != note or i != expect:
            return unknown
        expect = i + count
    return offset_of(note, first)
