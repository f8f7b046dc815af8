"""Read notifications from a Kafka topic: poll, commit, seek, seek by time.

A thin, typed wrapper over confluent-kafka's Consumer (manual commits of explicit offsets,
timeouts on every broker call). A payload that is not a valid notification raises the
format error, naming partition and offset; that partition's position stays on the bad
record, so the caller decides: fix, or `seek(partition, offset + 1)` past it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import (OFFSET_BEGINNING, OFFSET_END, OFFSET_INVALID, TIMESTAMP_NOT_AVAILABLE, Consumer,
                             KafkaError, KafkaException, Message, TopicPartition)

from memq.config import KafkaConfig
from memq.errors import FormatError, KafkaUnreachableError, NotifyError, OffsetOutOfRangeError, UnknownTopicError
from memq.format import Notification
from memq.notify._kafka import base_settings, ensure_reachable, timeout_s

log = logging.getLogger("memq.notify")

# Errors after which polling again cannot help; others (a broker restarting) librdkafka rides out.
_PERMANENT = frozenset({
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION,
    KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
})

PartitionsCallback = Callable[[list[int]], None]


@dataclass(frozen=True, slots=True)
class NotificationRecord:
    partition: int
    offset: int
    timestamp_ms: int          # Kafka record timestamp (publish time); 0 if the broker has none
    notification: Notification


class NotificationConsumer:
    """Consumer of one notification topic; `subscribe` (group) or `assign` (explicit)."""

    def __init__(self, kafka: KafkaConfig, kafka_topic: str, *, group_id: str,
                 auto_offset_reset: str = "earliest", fetch_wait_ms: int = 100,
                 partition_eof: bool = False) -> None:
        self.topic = kafka_topic
        self.group_id = group_id
        self._kafka = kafka
        self._timeout_s = timeout_s(kafka)
        self._settings = {
            # The first metadata answer replaces the bootstrap connection by one to the broker it
            # names, which the next request waits for: librdkafka spaces such connections by half
            # this (50 ms by default, 11 at 20), so a new consumer's second call took ~55 ms.
            # `kafka.properties` may still set it.
            "reconnect.backoff.ms": 20,
            **base_settings(kafka),
            "group.id": group_id,
            "auto.offset.reset": auto_offset_reset,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "session.timeout.ms": kafka.session_timeout_ms,
            "heartbeat.interval.ms": max(100, kafka.session_timeout_ms // 6),
            # bounds how late a seek takes effect (Kafka's default: 500), and how long a request
            # waits behind an idle fetch on brokers that answer a connection's requests in turn (tansu)
            "fetch.wait.max.ms": fetch_wait_ms,
            "enable.partition.eof": partition_eof,
        }
        try:
            self._consumer = Consumer(self._settings)
        except KafkaException as e:
            raise NotifyError(f"cannot create a consumer for Kafka topic {kafka_topic!r}: {e}") from None
        try:
            ensure_reachable(self._consumer, kafka)
        except KafkaUnreachableError:
            self._consumer.close()
            raise
        self._reader: Consumer | None = None     # see _side_reader
        self._reader_topic = ""                  # the topic whose metadata the side reader has
        self._warned_bisect = False
        self._ends: dict[int, int] = {}          # see ends_reached
        self._subscribed = False
        self._closed = False

    # --- membership ----------------------------------------------------------------------

    def subscribe(self, on_assign: PartitionsCallback | None = None,
                  on_revoke: PartitionsCallback | None = None) -> None:
        """Join the consumer group; callbacks get partition numbers (run inside `poll`)."""
        def assigned(_: Consumer, tps: list[TopicPartition]) -> None:
            if on_assign:
                on_assign([tp.partition for tp in tps])

        def revoked(_: Consumer, tps: list[TopicPartition]) -> None:
            if on_revoke:
                on_revoke([tp.partition for tp in tps])

        self._consumer.subscribe([self.topic], on_assign=assigned, on_revoke=revoked)
        self._subscribed = True

    def read_topic(self, kafka_topic: str) -> None:
        """Go on with another topic on the same clients (assigned reading only): the janitor
        visits every notification topic each pass, and a consumer per topic (two librdkafka
        clients and a metadata round trip) was most of its time with thousands of topics."""
        if self._subscribed:
            raise NotifyError(f"consumer of group {self.group_id!r} is subscribed to {self.topic!r}: "
                              "only an assigning consumer changes topics")
        self.unassign()
        self.topic = kafka_topic

    def assign(self, partitions_offsets: Mapping[int, int]) -> None:
        """Read exactly these partitions from these offsets (no group rebalancing)."""
        self._ends = {}
        self._consumer.assign([TopicPartition(self.topic, p, o) for p, o in partitions_offsets.items()])

    def unassign(self) -> None:
        """Stop fetching: an assigned consumer keeps long-polling at its end, and brokers that
        answer a connection's requests in turn (tansu) make other requests wait behind it."""
        self._ends = {}
        self._consumer.unassign()

    def assignment(self) -> list[int]:
        return sorted(tp.partition for tp in self._consumer.assignment())

    # --- reading -------------------------------------------------------------------------

    def poll(self, timeout_s: float, max_records: int = 500) -> list[NotificationRecord]:
        """Up to `max_records` notifications, waiting at most `timeout_s` for the first."""
        msgs = self._fetched(timeout_s, max_records)
        out: list[NotificationRecord] = []
        for i, m in enumerate(msgs):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self._ends.setdefault(m.partition(), m.offset())  # type: ignore[arg-type]  # set on EOF
                    continue
                if err.code() == KafkaError._AUTO_OFFSET_RESET:   # auto.offset.reset = error
                    self._rewind(msgs[i + 1:])
                    p, at = m.partition(), m.offset()
                    p = -1 if p is None else p
                    oldest = self.watermarks(p)[0]
                    raise OffsetOutOfRangeError(
                        f"Kafka topic {self.topic!r} partition {p}: no committed offset, or the position is "
                        f"outside the retained notifications (oldest available offset {oldest}); "
                        f"auto.offset.reset = error: {err.str()}",
                        topic=self.topic, partition=p, offset=-1 if at is None else at, oldest=oldest)
                if err.fatal() or err.code() in _PERMANENT:
                    self._rewind(msgs[i + 1:])
                    raise NotifyError(f"reading Kafka topic {self.topic!r}: {err.str()}")
                log.warning("reading Kafka topic %r: %s", self.topic, err.str())
                continue
            try:
                n = Notification.from_bytes(m.value() or b"")
            except FormatError as e:
                self._rewind(msgs[i:])
                if out:  # hand over the good records first; the next poll raises
                    return out
                raise type(e)(f"notification at Kafka topic {self.topic!r} partition {m.partition()} "
                              f"offset {m.offset()}: {e}") from e
            kind, ts = m.timestamp()
            out.append(NotificationRecord(m.partition(), m.offset(),  # type: ignore[arg-type]  # set: no error
                                          ts if kind != TIMESTAMP_NOT_AVAILABLE else 0, n))
        return out

    def _fetched(self, timeout_s: float, max_records: int) -> list[Message]:
        """What librdkafka has queued, else wait for one message and take what came with it.

        (`consume(n, timeout)` alone waits for all n messages or the full timeout.)
        """
        msgs = self._consumer.consume(num_messages=max_records, timeout=0)
        if not msgs and max_records > 0:
            msgs = self._consumer.consume(num_messages=1, timeout=timeout_s)
            if msgs and max_records > 1:
                msgs += self._consumer.consume(num_messages=max_records - 1, timeout=0)
        return msgs

    def _rewind(self, unreturned: list[Message]) -> None:
        """Move positions back so that records read but not returned are read again."""
        first: dict[int, int] = {}
        for m in unreturned:
            if m.error() is None:
                first.setdefault(m.partition(), m.offset())  # type: ignore[arg-type]  # set: no error
        for p, o in first.items():
            self.seek(p, o)

    def seek(self, partition: int, offset: int) -> None:
        """Continue reading `partition` at `offset` (the partition must be assigned)."""
        try:
            self._consumer.seek(TopicPartition(self.topic, partition, offset))
        except KafkaException as e:
            raise NotifyError(f"cannot seek Kafka topic {self.topic!r} partition {partition} "
                              f"to {offset}: {e}") from None

    def position(self, partitions: Iterable[int] | None = None) -> dict[int, int | None]:
        """Next offset to read per partition (None before the first fetch)."""
        parts = self.assignment() if partitions is None else list(partitions)
        tps = self._consumer.position([TopicPartition(self.topic, p) for p in parts])
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in tps}

    # --- offsets -------------------------------------------------------------------------

    def commit(self, offsets: Mapping[int, int], asynchronous: bool = False) -> None:
        """Commit `offsets` (partition -> next offset to read) for the group."""
        if not offsets:
            return
        tps = [TopicPartition(self.topic, p, o) for p, o in offsets.items()]
        try:
            result = (self._consumer.commit(offsets=tps, asynchronous=True) if asynchronous
                      else self._consumer.commit(offsets=tps, asynchronous=False))
        except KafkaException as e:
            raise NotifyError(f"cannot commit {dict(offsets)} on Kafka topic {self.topic!r} "
                              f"for group {self.group_id!r}: {e}") from None
        failed = [tp for tp in result or () if tp.error is not None]
        if failed:
            raise NotifyError(f"commit on Kafka topic {self.topic!r} for group {self.group_id!r} failed: "
                              + ", ".join(f"partition {tp.partition}: {tp.error}" for tp in failed))

    def committed(self, partitions: Iterable[int]) -> dict[int, int | None]:
        """The group's committed offset per partition (None if nothing is committed)."""
        tps = [TopicPartition(self.topic, p) for p in partitions]
        try:
            result = self._consumer.committed(tps, timeout=self._timeout_s)
        except KafkaException as e:
            raise NotifyError(f"cannot read committed offsets of group {self.group_id!r} on "
                              f"Kafka topic {self.topic!r}: {e}") from None
        return {tp.partition: (None if tp.offset == OFFSET_INVALID or tp.offset < 0 else tp.offset)
                for tp in result}

    def watermarks(self, partition: int) -> tuple[int, int]:
        """(first offset, next offset to be written) of `partition`.

        tansu 0.6 answers the "latest offset" query with the last record *batch's* first
        offset + 1, so the end is confirmed by fetching from there: a fetch response carries
        the true high watermark (one extra round trip on a correct broker).
        """
        tp = TopicPartition(self.topic, partition)
        try:
            low, high = self._consumer.get_watermark_offsets(tp, timeout=self._timeout_s, cached=False)
        except KafkaException as e:
            raise NotifyError(f"cannot read watermarks of Kafka topic {self.topic!r} "
                              f"partition {partition}: {e}") from None
        if high > low:
            self._read_one(partition, high - 1)
            high = max(high, self._side_reader().get_watermark_offsets(tp, cached=True)[1])
        return int(low), int(high)

    def ends_reached(self) -> dict[int, int]:
        """With `partition_eof`: per partition, the offset at which a fetch first found its end
        since the last `assign` (polled so far). That is its true next offset then: a fetch
        response carries the high watermark, also on tansu (see `watermarks`)."""
        return dict(self._ends)

    def list_offsets(self, partitions: Iterable[int], *, latest: bool = False) -> dict[int, int]:
        """Each partition's first offset, or with `latest` the broker's answer for its next one
        (short on tansu 0.6: see `watermarks`), in one ListOffsets request for all partitions."""
        which = "latest" if latest else "earliest"
        tps = [TopicPartition(self.topic, p, OFFSET_END if latest else OFFSET_BEGINNING) for p in partitions]
        if not tps:
            return {}
        try:
            answer = self._consumer.offsets_for_times(tps, timeout=self._timeout_s)
        except KafkaException as e:
            raise NotifyError(f"cannot list the {which} offsets of Kafka topic {self.topic!r}: {e}") from None
        failed = [tp for tp in answer if tp.error is not None or tp.offset < 0]
        if failed:
            raise NotifyError(f"cannot list the {which} offsets of Kafka topic {self.topic!r}: "
                              + ", ".join(f"partition {tp.partition}: {tp.error or tp.offset}" for tp in failed))
        return {tp.partition: int(tp.offset) for tp in answer}

    def cached_watermarks(self, partition: int) -> tuple[int, int] | None:
        """(first offset, next offset) as the last fetch of `partition` told it, without asking
        Kafka (a fetch response carries the true high watermark, also on tansu); None before one."""
        try:
            low, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, partition), cached=True)
        except KafkaException:
            return None
        return (int(low), int(high)) if high >= 0 else None

    def partitions(self) -> list[int]:
        try:
            md = self._consumer.list_topics(self.topic, timeout=self._timeout_s)   # not all topics
        except KafkaException as e:
            raise NotifyError(f"cannot read Kafka metadata for topic {self.topic!r}: {e}") from None
        topic = md.topics.get(self.topic)
        if topic is None or topic.error is not None:
            raise UnknownTopicError(f"Kafka topic {self.topic!r} does not exist")
        return sorted(topic.partitions)

    def offsets_for_times(self, ts_ms: int) -> dict[int, int]:
        """Per partition, the first offset whose record timestamp is >= `ts_ms`, or the end.

        The broker's answer is checked against the records on both sides of it; brokers that
        answer wrongly (tansu 0.6 always says 0) are answered by bisecting the partition,
        which assumes timestamps grow with offsets (publish time, one publisher per batch).
        A time before 1970 is asked as 0: Kafka reads -1 and -2 as "latest" and "earliest", and
        tansu drops the connection on other negative times.
        """
        parts = self.partitions()
        ts_ms = max(ts_ms, 0)
        try:
            answer = self._consumer.offsets_for_times(
                [TopicPartition(self.topic, p, ts_ms) for p in parts], timeout=self._timeout_s)
        except KafkaException as e:
            raise NotifyError(f"cannot look up offsets for time {ts_ms} on Kafka topic {self.topic!r}: {e}") from None
        result = {}
        for tp in answer:
            low, high = self.watermarks(tp.partition)
            offset = high if tp.error is not None or tp.offset < 0 else tp.offset
            if not self._first_at_or_after(tp.partition, offset, ts_ms, low, high):
                if not self._warned_bisect:
                    log.warning("Kafka answered offsets_for_times wrongly on %r; bisecting instead", self.topic)
                    self._warned_bisect = True
                offset = self._bisect(tp.partition, ts_ms, low, high)
            result[tp.partition] = offset
        return result

    def _first_at_or_after(self, partition: int, offset: int, ts_ms: int, low: int, high: int) -> bool:
        if not low <= offset <= high:
            return False
        at_or_after = offset == high or self._timestamp_at(partition, offset) >= ts_ms
        return at_or_after and (offset == low or self._timestamp_at(partition, offset - 1) < ts_ms)

    def _bisect(self, partition: int, ts_ms: int, low: int, high: int) -> int:
        while low < high:
            mid = (low + high) // 2
            if self._timestamp_at(partition, mid) >= ts_ms:
                high = mid
            else:
                low = mid + 1
        return low

    def _timestamp_at(self, partition: int, offset: int) -> int:
        """Timestamp of the record at `offset` (or the next one)."""
        return int(self._read_one(partition, offset).timestamp()[1])

    def _side_reader(self) -> Consumer:
        """A second consumer for lookups, so this one's positions stay untouched."""
        if self._reader is None:
            # no long-polling: a lookup re-assigns at once instead of waiting out a fetch
            self._reader = Consumer({**self._settings, "group.id": f"{self.group_id}.lookup",
                                     "fetch.wait.max.ms": 10})
        return self._reader

    def _read_one(self, partition: int, offset: int) -> Message:
        reader = self._side_reader()
        if self._reader_topic != self.topic:
            # learn where the topic's partitions lead first: else the first fetch after
            # `read_topic` waits ~140 ms for librdkafka's own metadata refresh
            try:
                reader.list_topics(self.topic, timeout=self._timeout_s)
            except KafkaException as e:
                raise NotifyError(f"cannot read Kafka metadata for topic {self.topic!r}: {e}") from None
            self._reader_topic = self.topic
        reader.assign([TopicPartition(self.topic, partition, offset)])
        deadline = time.monotonic() + self._timeout_s
        while (left := deadline - time.monotonic()) > 0:
            for m in reader.consume(num_messages=1, timeout=left):
                if m.error() is None:
                    return m
        raise NotifyError(f"no record at Kafka topic {self.topic!r} partition {partition} "
                          f"offset {offset} within {self._timeout_s} s")

    def close(self) -> None:
        """Leave the group (without committing) and release the clients. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._reader is not None:
            self._reader.close()
        self._consumer.close()
