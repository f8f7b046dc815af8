"""Where DeleteRecords moved each read partition's log start, as memq's Consumer applies it (pure).

The cluster metadata carries a Kafka offset per partition (`notification offset << 24 |
index`, as Kafka readers see it). The Consumer reads by notification: a notification before the
start's is treated as an expired one (counted as expired, or OffsetOutOfRangeError with
auto_offset_reset = error: `position_policy`), a committed position before it is reset like one
behind retention, and the records of the start's own part before its index are not delivered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from memq.client.consumer_record import DecodedBatch
from memq.format.batch import MAX_PART_LOGMESSAGES, PART_RECORD_BITS


@dataclass(frozen=True)
class LogStarts:
    """Per read partition, (notification offset, record index) of its log start; a partition
    not named starts where its notification partition does."""

    starts: Mapping[int, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def of(cls, log_start: Iterable[tuple[int, int]]) -> LogStarts:
        """From the metadata's (partition, Kafka offset) pairs."""
        return cls({p: (o >> PART_RECORD_BITS, o & (MAX_PART_LOGMESSAGES - 1)) for p, o in log_start})

    def first_note(self, partition: int) -> int:
        """The first notification offset with records at or after the log start."""
        return self.starts.get(partition, (0, 0))[0]

    def deleted(self, partition: int, offset: int) -> bool:
        """Whether the notification at `offset` lies wholly before the log start."""
        return offset < self.first_note(partition)

    def skip(self, partition: int, offset: int) -> int:
        """How many leading records of the part at `offset` lie before the log start."""
        note, index = self.starts.get(partition, (0, 0))
        return index if offset == note else 0


def trim(batch: DecodedBatch, skip: int) -> DecodedBatch:
    """`batch` without its first `skip` records (those before a log start inside the part):
    Messages wholly before it go, the one it cuts keeps its later records at their indexes."""
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
