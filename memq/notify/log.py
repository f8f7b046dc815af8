"""The janitor's Kafka side: a topic's notification log as retention sees it (blocking calls;
the janitor runs them in a thread).

- `sync_retention`: the notification topic's `retention.ms` follows the memq topic's;
- `expire`: DeleteRecords before a cutoff, and the oldest object the first retained
  notification of each partition names (the floor objects may not be deleted below);
- `references`: the keys retained notifications name in a time range (orphans are the rest).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Protocol

from memq.clock import Clock, SystemClock
from memq.config import MemqConfig
from memq.errors import InvalidInputError, NotifyError
from memq.notify.admin import TopicAdmin
from memq.notify.consumer import NotificationConsumer, NotificationRecord
from memq.storage.naming import parse_key

log = logging.getLogger(__name__)

CLOCK_SKEW_MS = 60_000
"""Notifications are read from this long before the oldest object they may name: publish
time follows the object's time on one broker, brokers' clocks may differ a little."""
DELETE_RECORDS_RETRY_S = 3600.0
"""After Kafka refuses DeleteRecords for a topic, try again this much later (not every pass)."""
RETENTION_RECHECK_S = 3600.0
"""A notification topic's retention.ms found right is described again only after this long, or
when the topic's retention changes: one DescribeConfigs per topic and pass was 1000s of Kafka
requests a pass with 1000s of topics, to catch a change made outside memq."""


class RetentionAdmin(Protocol):
    """The admin calls retention makes (`TopicAdmin` fits)."""

    def retention_ms(self, name: str) -> int | None: ...

    def set_retention(self, name: str, retention_ms: int) -> None: ...

    def delete_records(self, name: str, before: Mapping[int, int]) -> None: ...


class KafkaNotificationLog:
    """Notification topics on Kafka, through one admin client and one reusing consumer."""

    def __init__(self, config: MemqConfig, timeout_s: float, clock: Clock | None = None,
                 admin: RetentionAdmin | None = None) -> None:
        self.config = config
        self.timeout_s = timeout_s
        self.clock = clock or SystemClock()
        self.admin = admin or TopicAdmin(config.kafka)
        self._no_delete_records: dict[str, float] = {}    # topic -> when Kafka refused
        self._retention_seen: dict[str, tuple[int, float]] = {}   # topic -> (retention.ms, when checked)
        self._reader: NotificationConsumer | None = None
        self._lock = threading.Lock()

    @contextmanager
    def _consumer(self, kafka_topic: str) -> Iterator[NotificationConsumer]:
        """The log's one consumer, reading `kafka_topic`: a consumer per topic cost ~86 ms of
        wall time (~9 ms of CPU) per topic and pass. One caller at a time (a call the janitor
        timed out may still run in its thread); after an error the next call starts afresh."""
        with self._lock:
            if self._reader is None:
                self._reader = NotificationConsumer(self.config.kafka, kafka_topic, fetch_wait_ms=10,
                                                    group_id=f"memq-janitor-{self.config.cluster.name}")
            try:
                self._reader.read_topic(kafka_topic)
                yield self._reader
            except BaseException:
                self._reader.close()
                self._reader = None
                raise

    def close(self) -> None:
        with self._lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None

    def sync_retention(self, kafka_topic: str, retention_ms: int) -> None:
        """Set `kafka_topic`'s `retention.ms` if Kafka reports another (asked again only when
        `retention_ms` changes or `RETENTION_RECHECK_S` later)."""
        seen = self._retention_seen.get(kafka_topic)
        now = self.clock.monotonic()
        if seen is not None and seen[0] == retention_ms and now - seen[1] < RETENTION_RECHECK_S:
            return
        if self.admin.retention_ms(kafka_topic) != retention_ms:
            self.admin.set_retention(kafka_topic, retention_ms)
            log.info("janitor: %s retention.ms set to %d", kafka_topic, retention_ms)
        self._retention_seen[kafka_topic] = (retention_ms, now)

    def expire(self, kafka_topic: str, before_ms: int) -> dict[str, int]:
        """Expire the notifications published before `before_ms`; per object home (`topics/<t>`,
        `groups/<g>`, "" for a key memq does not parse), the oldest object time the first retained
        notification of a partition names ({}: none retained)."""
        with self._consumer(kafka_topic) as c:
            cut = c.offsets_for_times(before_ms)
            marks = {p: c.watermarks(p) for p in cut}
            self._delete_records(kafka_topic, {p: o for p, o in cut.items() if o > marks[p][0]})
            floors: dict[str, int] = {}
            for r in self._scan(c, cut, {p: high for p, (_, high) in marks.items()}, first_only=True):
                home, ms = _object_home(r)
                floors[home] = min(ms, floors.get(home, ms))
            return floors

    def _delete_records(self, kafka_topic: str, before: dict[int, int]) -> None:
        refused = self._no_delete_records.get(kafka_topic)
        if not before or (refused is not None and self.clock.monotonic() - refused < DELETE_RECORDS_RETRY_S):
            return
        try:
            self.admin.delete_records(kafka_topic, before)
            self._no_delete_records.pop(kafka_topic, None)
        except NotifyError as e:
            self._no_delete_records[kafka_topic] = self.clock.monotonic()
            log.warning("janitor: %s; expired notifications stay until Kafka's retention.ms drops them "
                        "(retrying in %.0f s)", e, DELETE_RECORDS_RETRY_S)

    def references(self, kafka_topic: str, start_ms: int, end_ms: int) -> set[str]:
        """Keys of the objects stamped in [start_ms, end_ms) that retained notifications name."""
        with self._consumer(kafka_topic) as c:
            starts = c.offsets_for_times(start_ms - CLOCK_SKEW_MS)
            ends = {p: c.watermarks(p)[1] for p in starts}
            return {r.notification.key for r in self._scan(c, starts, ends)
                    if start_ms <= _object_home(r)[1] < end_ms}

    def _scan(self, c: NotificationConsumer, starts: Mapping[int, int], ends: Mapping[int, int],
              *, first_only: bool = False) -> Iterator[NotificationRecord]:
        """The records from `starts[p]` up to `ends[p]` of each partition (only the first with
        `first_only`); NotifyError if they do not all arrive within `timeout_s`."""
        todo = {p: o for p, o in starts.items() if o < ends[p]}
        if not todo:
            return
        c.assign(todo)
        deadline = self.clock.monotonic() + self.timeout_s
        while todo:
            if self.clock.monotonic() > deadline:
                raise NotifyError(f"janitor: reading {c.topic} partitions {sorted(todo)} "
                                  f"took over {self.timeout_s:g} s")
            for r in c.poll(0.5):
                if r.partition not in todo or r.offset >= ends[r.partition]:
                    continue
                yield r
                if first_only or r.offset + 1 >= ends[r.partition]:
                    del todo[r.partition]


def _object_home(record: NotificationRecord) -> tuple[str, int]:
    """The home (`topics/<t>`, `groups/<g>`; "" if memq does not parse the key) and time of
    the object a notification names (from its key, as listings see it)."""
    try:
        key = parse_key(record.notification.key)
    except InvalidInputError:
        return "", record.notification.created_ms
    return key.home, key.timestamp_ms
