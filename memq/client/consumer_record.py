"""What the Consumer hands to the application: `ConsumerRecord`s, built in bulk, a chunk at a time."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
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
    offset: int                    # notification offset (the batch); on a dense topic, the record's offset
    index: int   # type: ignore[assignment]  # LogMessage index inside the batch; shadows tuple.index (public name)
    producer_id: int
    epoch: int
    sequence: int
    location: ObjectLocation


RECORD_CHUNK = 256
"""ConsumerRecords built at a time: below the GC's young-generation threshold (700 by default)."""


@dataclass(frozen=True, slots=True)
class MessageRecords:
    """One Message's records, made ConsumerRecords a chunk at a time as they are handed over.

    Built ahead for a whole batch (in the reader's worker), ~10^5 records were alive when the GC
    next ran, and that collection traversed every one: a quarter of the consumer's CPU. The GC
    runs on net allocations, so records built a chunk at a time, in the thread that hands them
    over, are mostly gone before one runs (`python -m bench consume`: see docs/DECISIONS.md)."""

    logs: Sequence[tuple]          # LogMessages, or plain tuples in their field order (`unpack_rows`)
    first: int                     # the batch index of logs[0]
    head: tuple[str, int, int]     # topic, partition, offset
    tail: tuple[int, int, int, ObjectLocation]   # producer id, epoch, sequence, location
    base: int | None = None        # a dense topic's offset of the batch's record 0: offsets are base + index

    def __len__(self) -> int:
        return len(self.logs)

    def __iter__(self) -> Iterator[ConsumerRecord]:
        return chain.from_iterable(self.chunks())

    def chunks(self) -> Iterator[list[ConsumerRecord]]:
        """The records in order, `RECORD_CHUNK` at a time: LogMessage + position tuples,
        concatenated and re-typed in C."""
        logs, (topic, partition, offset), (pid, epoch, seq, loc), base = self.logs, self.head, self.tail, self.base
        for start in range(0, len(logs), RECORD_CHUNK):
            at = self.first + start
            indexes = range(at, at + min(RECORD_CHUNK, len(logs) - start))
            tails = ([(topic, partition, offset, i, pid, epoch, seq, loc) for i in indexes] if base is None
                     else [(topic, partition, base + i, i, pid, epoch, seq, loc) for i in indexes])
            yield list(map(_tuple_new, repeat(ConsumerRecord), map(add, logs[start:start + RECORD_CHUNK], tails)))


DecodedBatch = list[tuple[MessageHeader, MessageRecords]]
"""A batch's Messages in order, each its header and its records."""


def batch_pointer(topic: str, rec: NotificationRecord) -> BatchPointer:
    """Where the batch `rec` notifies is, and the size and CRC32C it must have."""
    n = rec.notification
    return BatchPointer(topic, ObjectLocation(n.bucket, n.key), n.size, n.crc32c, rec.partition, rec.offset,
                        n.offset, n.created_ms, n.broker_id)


def build_records(topic: str, rec: NotificationRecord, decoded: Decoded, base: int | None = None) -> DecodedBatch:
    """Each Message's records, to be made ConsumerRecords as they are handed over (`MessageRecords`);
    `base`: a dense topic's offset of the batch's first record (None: offsets are the notification's)."""
    n = rec.notification
    head, loc = (topic, rec.partition, rec.offset), ObjectLocation(n.bucket, n.key)
    _, messages = decoded
    out: DecodedBatch = []
    first = 0
    for h, logs in messages:
        out.append((h, MessageRecords(logs, first, head, (h.producer_id, h.epoch, h.sequence, loc), base)))
        first += len(logs)
    return out


def record_at(ptr: BatchPointer, partition: int, offset: int, index: int, header: MessageHeader,
              log_message: LogMessage) -> ConsumerRecord:
    """The ConsumerRecord of one LogMessage read by position (random access)."""
    return ConsumerRecord(*log_message, ptr.topic, partition, offset, index,
                          header.producer_id, header.epoch, header.sequence, ptr.location)


def trim(batch: DecodedBatch, skip: int) -> DecodedBatch:
    """`batch` without its first `skip` records (those before a log start inside the part, the
    partition log's `skip`): Messages wholly before it go, the one it cuts keeps its later
    records at their indexes."""
    out: DecodedBatch = []
    for header, records in batch:
        end = records.first + len(records)
        if end <= skip:
            continue
        if records.first < skip:
            cut = skip - records.first
            records = dataclasses.replace(records, logs=records.logs[cut:], first=skip)
        out.append((header, records))
    return out
