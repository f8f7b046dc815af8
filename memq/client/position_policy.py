"""Where a Consumer's position, or a batch it reads, is outside what is retained (pure rules in
`positions.py`, decisions and messages here; no I/O but the two questions `RangeCheck` asks).

A committed position outside the retained notifications follows `consumer.auto_offset_reset`
(Kafka's OffsetOutOfRange; checked by the Consumer, since not every Kafka reports it: tansu
reads nothing), and a missing object older than the topic's retention expired (counted, never
data loss); any other missing or corrupt batch follows `consumer.on_data_loss`. A log start
DeleteRecords moved (the partition log model's, `memq.log.model`) counts as retention: a position before it is out of range, a
batch before it expired.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

from memq.client.compacted import PartRead
from memq.client.positions import is_expired, out_of_range
from memq.client.reader import DataLossPolicy
from memq.errors import DataLossError, ObjectNotFoundError, OffsetOutOfRangeError
from memq.log.model import TopicLogs
from memq.notify import NotificationRecord

LossOutcome = Literal["expired", "skipped"]


@dataclass(frozen=True, slots=True)
class Reset:
    """Move `partition` to `target`; `expired` notifications were skipped by moving forward."""

    partition: int
    target: int
    expired: int


@dataclass(frozen=True)
class PositionPolicy:
    """`auto_offset_reset` and the data-loss policy of one Consumer, with the names its
    errors and log lines give (on `loss.logger`)."""

    topic: str
    kafka_topic: str
    group_id: str
    auto_offset_reset: Literal["earliest", "latest", "error"]
    retention_ms: int | None               # None: no missing object counts as expired
    loss: DataLossPolicy
    logs: TopicLogs = field(default_factory=TopicLogs)   # where DeleteRecords moved each partition's start

    def reset(self, partition: int, committed: int, low: int, high: int) -> Reset | None:
        """Where a committed position outside the retained notifications [low, high) goes;
        None when it is inside. Raises OffsetOutOfRangeError if auto_offset_reset = error."""
        if not out_of_range(committed, low, high):
            return None
        where = (f"topic {self.topic} read partition {partition}: committed position {committed} of group "
                 f"{self.group_id} is outside the retained notifications {low}..{high - 1} "
                 f"(oldest available offset {low}) of Kafka topic {self.kafka_topic}")
        if self.auto_offset_reset == "error":
            raise OffsetOutOfRangeError(f"{where}; consumer.auto_offset_reset = error: seek, or set it "
                                        f"to earliest or latest", topic=self.topic, partition=partition,
                                        offset=committed, oldest=low)
        target = low if self.auto_offset_reset == "earliest" else high
        self.loss.logger.warning("%s; reset to %s (%d) by consumer.auto_offset_reset", where,
                                 self.auto_offset_reset, target)
        return Reset(partition, target, max(0, low - committed))

    def lost(self, rec: NotificationRecord | PartRead, e: DataLossError, now_ms: int) -> LossOutcome:
        """What the batch `rec` names, lost with `e`, counts as: "expired" (a missing object
        older than the topic's retention) or "skipped" (data loss, consumer.on_data_loss =
        skip). Raises `e` for data loss to raise, OffsetOutOfRangeError for an expired batch
        when auto_offset_reset = error."""
        plog = self.logs.partition(rec.partition)
        deleted = plog.deleted(rec.offset)
        missing = isinstance(e.__cause__, ObjectNotFoundError)
        if not deleted and not is_expired(missing, rec.timestamp_ms, now_ms, self.retention_ms):
            self.loss.handle(e)
            return "skipped"
        why = ("before the partition's log start (DeleteRecords)" if deleted
               else f"older than the topic's retention ({self.retention_ms} ms)")
        self.loss.logger.info("%s; expired (%s), skipped", e, why)
        if self.auto_offset_reset == "error":
            raise OffsetOutOfRangeError(
                f"topic {self.topic}: {e}: {why}; consumer.auto_offset_reset = error", topic=self.topic,
                partition=rec.partition, offset=rec.offset,
                oldest=max(rec.offset + 1, plog.first_note)) from e
        return "expired"


class RetainedLog(Protocol):
    """What RangeCheck asks the notification queue (a NotificationConsumer fits)."""

    def committed(self, partitions: Iterable[int]) -> dict[int, int | None]: ...
    def watermarks(self, partition: int) -> tuple[int, int]: ...


class RangeCheck:
    """The assigned partitions whose committed position is not checked against the retained
    notifications yet (a partition the application sought is not checked: it chose)."""

    def __init__(self, policy: PositionPolicy) -> None:
        self.policy = policy
        self._unchecked: set[int] = set()

    def add(self, partitions: Iterable[int]) -> None:
        self._unchecked.update(partitions)

    def discard(self, partitions: Iterable[int]) -> None:
        self._unchecked.difference_update(partitions)

    def resets(self, log: RetainedLog) -> Iterator[Reset]:
        """The resets due, one partition at a time (apply each before asking for the next).
        With auto_offset_reset = error, raises for the first partition out of range, which
        stays unchecked with those after it: raised again on the next call."""
        if not self._unchecked:
            return
        positions = log.committed(sorted(self._unchecked))   # one request for all of them
        self._unchecked.clear()
        for p, committed in positions.items():
            if committed is None:           # nothing committed: Kafka's reset policy applies anyway
                continue
            low, high = log.watermarks(p)
            low = dataclasses.replace(self.policy.logs.partition(p), low=low).first_note   # DeleteRecords cuts like retention
            try:
                reset = self.policy.reset(p, committed, low, max(high, low))
            except OffsetOutOfRangeError:
                self._unchecked.update(q for q in positions if q >= p)
                raise
            if reset is not None:
                yield reset
