"""The polling Consumer: notifications from a Kafka consumer group, batches from storage.

Each notification on a topic's notification topic points at one batch object. `poll()`
reads pointers, fetches the objects ahead of the application (several at once, bounded in
bytes), checks them against the notification's size and CRC32C, decodes them in bulk and
hands LogMessages over as `ConsumerRecord`s, one batch per `poll()`.

Delivery is at-least-once: the offset of a notification becomes committable only once the
last record of its batch was handed to the application; the application commits after it
processed what it got. An iterator abandoned half way is resumed by the next `poll()`, so
records are neither skipped nor handed twice within one consumer's life.

Retried Messages (a producer resends a Message whose ack did not come, and both copies were
stored) are dropped by (producer id, epoch, sequence) unless `consumer.dedup = false`: one
`SequenceTracker` check per Message, none per record. Its state lives in this consumer's
memory: after a restart, or for a copy on a read partition another group member owns, a
resend is delivered again (at-least-once still holds; the Kafka in the dev cluster keeps no
commit metadata to carry the state in).

Retention: a position outside the retained notifications follows `consumer.auto_offset_reset`
(Kafka's OffsetOutOfRange), and an object gone because it is older than the topic's
retention counts as `metrics.expired`, not as data loss.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import islice, repeat
from operator import add, length_hint
from typing import NamedTuple, Protocol

from memq.client.cluster import resolve, resolve_topic
from memq.client.positions import Offsets, SequenceTracker, is_expired, out_of_range
from memq.client.reader import BatchPointer, BatchReader, DataLossPolicy, Decoded
from memq.config import MemqConfig
from memq.errors import ConsumerError, DataLossError, InvalidInputError, ObjectNotFoundError, OffsetOutOfRangeError
from memq.format import MessageHeader
from memq.notify import NotificationConsumer, NotificationRecord
from memq.storage import ObjectLocation

log = logging.getLogger(__name__)
_tuple_new = tuple.__new__
_RECORD_OVERHEAD = 200      # bytes of Python objects per record beyond its raw bytes (tuples, bytes headers)


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


class ConsumedSink(Protocol):
    """The consumer half of docs/ARCHITECTURE.md's AuditSink."""

    def consumed(self, *, topic: str, group: str, producer_id: int, epoch: int, sequence: int,
                 count: int, digest: int, created_ms: int, consumed_ms: int) -> None: ...


@dataclass
class ConsumerMetrics:
    """Counters of one Consumer (plain numbers: a client has no metrics endpoint)."""

    records: int = 0
    batches: int = 0
    bytes: int = 0
    duplicates_dropped: int = 0        # LogMessages of dropped duplicate Messages
    duplicate_messages: int = 0        # Messages dropped as duplicates
    data_loss_skipped: int = 0
    expired: int = 0                   # notifications and objects past retention, skipped (never "lost")
    offset_resets: int = 0             # positions outside the retained notifications, reset
    commits: int = 0


_Decoded = list[tuple[MessageHeader, list[ConsumerRecord]]]


class NotificationSource(Protocol):
    """The Consumer's notification queue (memq.notify.NotificationConsumer fits)."""

    def subscribe(self, on_assign: Callable[[list[int]], None] | None = None,
                  on_revoke: Callable[[list[int]], None] | None = None) -> None: ...
    def assignment(self) -> list[int]: ...
    def poll(self, timeout_s: float, max_records: int = 500) -> list[NotificationRecord]: ...
    def seek(self, partition: int, offset: int) -> None: ...
    def position(self, partitions: Iterable[int] | None = None) -> dict[int, int | None]: ...
    def commit(self, offsets: Mapping[int, int], asynchronous: bool = False) -> None: ...
    def committed(self, partitions: Iterable[int]) -> dict[int, int | None]: ...
    def watermarks(self, partition: int) -> tuple[int, int]: ...
    def offsets_for_times(self, ts_ms: int) -> dict[int, int]: ...
    def close(self) -> None: ...


@dataclass(slots=True, eq=False)
class _Batch:
    """One notification on its way to the application."""

    rec: NotificationRecord
    future: concurrent.futures.Future[_Decoded] | None = None
    messages: _Decoded = field(default_factory=list)
    next_msg: int = 0
    cur: Iterator[ConsumerRecord] = field(default_factory=lambda: iter(()))
    cur_header: MessageHeader | None = None
    cost: int = 0                                   # bytes reserved in the prefetch budget


def _pointer(topic: str, rec: NotificationRecord) -> BatchPointer:
    n = rec.notification
    return BatchPointer(topic, ObjectLocation(n.bucket, n.key), n.size, n.crc32c, rec.partition, rec.offset,
                        n.offset)


def notification_topic(config: MemqConfig, topic: str) -> str:
    """The Kafka topic carrying `topic`'s notifications by the config file alone (no brokers asked)."""
    return resolve(config, topic, None).topic.notification_topic


class Consumer:
    """Reads one memq topic as a member of a consumer group. Not thread-safe: one thread
    (or one asyncio task) drives it, as with Kafka's consumer.

    The topic's Kafka topic and storage are found by memq's one resolver
    (`memq.client.cluster`): from the brokers in `producer.brokers` if any answers, else
    from the config file. `audit` (an `AuditSink`) is told when the last LogMessage of each
    Message was handed over. `on_assign`/`on_revoke` get read partition numbers on
    rebalances (called inside `poll`; on revocation, what was handed over was already
    committed). `notifications` and `reader` replace the Kafka consumer and the batch reader
    (tests; the Consumer closes them).
    """

    def __init__(self, config: MemqConfig, topic: str, *, group_id: str | None = None,
                 audit: ConsumedSink | None = None, subscribe: bool = True,
                 on_assign: Callable[[list[int]], None] | None = None,
                 on_revoke: Callable[[list[int]], None] | None = None,
                 notifications: NotificationSource | None = None, reader: BatchReader | None = None) -> None:
        cc = config.consumer if group_id is None else replace(config.consumer, group_id=group_id)
        self.topic = topic
        self.group_id = cc.group_id
        self.metrics = ConsumerMetrics()
        self._cc = cc
        self._audit = audit
        resolved = resolve_topic(config, topic)   # no I/O unless producer.brokers names brokers
        config = resolved.config
        self._kafka_topic = resolved.topic.notification_topic
        self._retention_ms = resolved.topic.retention_ms   # None: no missing object counts as expired
        self._queue: deque[_Batch] = deque()        # polled, in order; some being fetched
        self._current: _Batch | None = None         # the batch being handed over
        self._inflight_bytes = 0                    # estimated memory of submitted, unfinished batches
        self._expansion = 1.0                       # decoded bytes per object byte, measured
        self._offsets = Offsets()
        self._dedup = SequenceTracker(cc.dedup_max_producers, cc.dedup_max_ranges) if cc.dedup else None
        self._unchecked: set[int] = set()           # assigned partitions whose start is not range-checked yet
        self._loss = DataLossPolicy(skip=cc.on_data_loss == "skip", logger=log, hint="")
        self._last_auto_commit = time.monotonic()
        self._closed = False
        self._notify: NotificationSource = notifications or NotificationConsumer(
            config.kafka, self._kafka_topic, group_id=cc.group_id, auto_offset_reset=cc.auto_offset_reset)
        try:
            self._reader = reader or BatchReader(config, cc.fetch_concurrency)
        except BaseException:
            self._notify.close()
            raise
        self._kafka_config = config.kafka
        self._user_on_assign, self._user_on_revoke = on_assign, on_revoke
        if subscribe:
            self._notify.subscribe(on_assign=self._on_assign, on_revoke=self._on_revoke)

    # --- reading -------------------------------------------------------------------------

    def poll(self, timeout: float = 1.0) -> Iterator[ConsumerRecord]:
        """Records of the next batch (or the rest of an unfinished one); empty if none came
        within `timeout` seconds. Raises `DataLossError` for a missing or corrupt batch when
        `on_data_loss` is "raise" (again on every poll, until the application seeks past it)."""
        self._check_open()
        deadline = time.monotonic() + timeout
        while True:
            if self._current is not None:
                return self._deliver(self._current)
            self._maybe_auto_commit()
            self._top_up(wait_s=0.0 if self._queue else max(0.0, deadline - time.monotonic()))
            if self._queue:
                head = self._queue[0]
                assert head.future is not None
                try:
                    head.messages = head.future.result(timeout=max(0.0, deadline - time.monotonic()))
                except concurrent.futures.TimeoutError:
                    return iter(())
                except DataLossError as e:
                    if self._expired(head.rec, e):
                        self.metrics.expired += 1
                    else:
                        self._loss.handle(e)   # raises unless consumer.on_data_loss = "skip"
                        self.metrics.data_loss_skipped += 1
                    self._queue.popleft()
                    self._finish(head)
                    continue
                except Exception:
                    head.future = self._submit(head.rec)   # transient: retry next poll
                    raise
                self._queue.popleft()
                self._measure(head)
                if self._next_message(head):
                    self._current = head
                else:                               # nothing left after dropping duplicates
                    self._finish(head)
                continue
            if time.monotonic() >= deadline:
                return iter(())

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """Every record, forever (until `close()`); a blocking loop around `poll()`."""
        while not self._closed:
            yield from self.poll(1.0)

    async def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        """`async for record in consumer`: waits in a worker thread, hands records on the loop."""
        while not self._closed:
            batch = await asyncio.to_thread(self.poll, 0.5)
            for record in batch:
                yield record

    def _next_message(self, b: _Batch) -> bool:
        """Move `b` to its next not-duplicate Message; False when the batch is exhausted."""
        while b.next_msg < len(b.messages):
            header, records = b.messages[b.next_msg]
            b.next_msg += 1
            if self._dedup is not None and self._dedup.seen(header.producer_id, header.epoch, header.sequence):
                self.metrics.duplicate_messages += 1
                self.metrics.duplicates_dropped += len(records)
                continue
            b.cur_header, b.cur = header, iter(records)
            self.metrics.records += len(records)
            return True
        b.cur_header, b.cur = None, iter(())
        return False

    def _deliver(self, b: _Batch) -> Iterator[ConsumerRecord]:
        """Hand over `b`'s records. All but the last of a Message stream from the shared list
        iterator (an abandoned poll resumes there); the last one is yielded after its Message
        was accounted for (audit, and the batch made committable when it is its last)."""
        while self._current is b:
            left = length_hint(b.cur)
            if left > 1:
                yield from islice(b.cur, left - 1)
                continue
            last = next(b.cur, None)
            self._message_done(b)
            if last is not None:
                yield last

    def _message_done(self, b: _Batch) -> None:
        header = b.cur_header
        if header is not None and self._audit is not None:
            self._audit.consumed(topic=self.topic, group=self.group_id, producer_id=header.producer_id,
                                 epoch=header.epoch, sequence=header.sequence, count=header.count,
                                 digest=header.body_crc32c, created_ms=header.created_ms,
                                 consumed_ms=int(time.time() * 1000))
        if not self._next_message(b):
            self._current = None
            self._finish(b)

    def _expired(self, rec: NotificationRecord, e: DataLossError) -> bool:
        """A missing object older than the topic's retention expired (raises if that is an
        error by `consumer.auto_offset_reset`); any other loss is data loss."""
        missing = isinstance(e.__cause__, ObjectNotFoundError)
        if not is_expired(missing, rec.timestamp_ms, int(time.time() * 1000), self._retention_ms):
            return False
        log.info("%s; expired (older than the topic's retention of %s ms), skipped", e, self._retention_ms)
        if self._cc.auto_offset_reset == "error":
            raise OffsetOutOfRangeError(
                f"topic {self.topic}: {e}: older than the topic's retention ({self._retention_ms} ms); "
                f"consumer.auto_offset_reset = error", topic=self.topic, partition=rec.partition,
                offset=rec.offset, oldest=rec.offset + 1) from e
        return True

    def _finish(self, b: _Batch) -> None:
        """`b` is fully handed over (or skipped): its offset may be committed."""
        self._offsets.finished(b.rec.partition, b.rec.offset)
        self._inflight_bytes -= b.cost
        self.metrics.batches += 1
        self.metrics.bytes += b.rec.notification.size

    # --- fetching ahead ------------------------------------------------------------------

    def _top_up(self, wait_s: float) -> None:
        """Start fetches within the byte budget; read more notifications if all are started."""
        self._check_ranges()
        self._submit_queued()
        if self._inflight_bytes >= self._cc.prefetch_bytes or any(b.future is None for b in self._queue):
            return
        # librdkafka's batch consume waits its whole timeout unless it fills up: wait for one
        # notification, then take what else is already there without waiting.
        records = self._notify.poll(wait_s, max_records=1)
        if records:
            records += self._notify.poll(0.0, max_records=2 * self._cc.fetch_concurrency)
        for r in records:
            self._offsets.fetched(r.partition, r.offset)
        self._queue.extend(_Batch(r) for r in records)
        self._submit_queued()

    def _check_ranges(self) -> None:
        """Kafka's OffsetOutOfRange for newly assigned partitions: a committed offset outside
        the retained notifications follows `consumer.auto_offset_reset`. Checked here rather
        than left to the Kafka client, since not every Kafka reports it (tansu reads nothing)."""
        if not self._unchecked:
            return
        positions = self._notify.committed(sorted(self._unchecked))   # one request for all of them
        self._unchecked.clear()
        for p, committed in positions.items():
            if committed is None:           # nothing committed: Kafka's reset policy applies anyway
                continue
            low, high = self._notify.watermarks(p)
            if not out_of_range(committed, low, high):
                continue
            where = (f"topic {self.topic} read partition {p}: committed position {committed} of group "
                     f"{self.group_id} is outside the retained notifications {low}..{high - 1} "
                     f"(oldest available offset {low}) of Kafka topic {self._kafka_topic}")
            if self._cc.auto_offset_reset == "error":
                self._unchecked.update(q for q in positions if q >= p)   # raised again on the next poll
                raise OffsetOutOfRangeError(f"{where}; consumer.auto_offset_reset = error: seek, or set it "
                                            f"to earliest or latest", topic=self.topic, partition=p,
                                            offset=committed, oldest=low)
            target = low if self._cc.auto_offset_reset == "earliest" else high
            log.warning("%s; reset to %s (%d) by consumer.auto_offset_reset", where, self._cc.auto_offset_reset, target)
            self.metrics.offset_resets += 1
            self.metrics.expired += max(0, low - committed)
            self.seek(p, target)

    def _measure(self, b: _Batch) -> None:
        """Learn how much memory a batch takes once decoded (records are Python objects, the
        object is compressed), so the budget bounds memory rather than object bytes."""
        decoded = sum(h.raw_length + _RECORD_OVERHEAD * h.count for h, _ in b.messages)
        ratio = decoded / max(1, b.rec.notification.size)
        self._expansion = ratio if self.metrics.batches == 0 else 0.8 * self._expansion + 0.2 * ratio

    def _submit_queued(self) -> None:
        for b in self._queue:
            if b.future is not None:
                continue
            # always let one batch through, however large, so progress never stops
            if self._inflight_bytes >= self._cc.prefetch_bytes and self._inflight_bytes > 0:
                break
            b.cost = int(b.rec.notification.size * self._expansion)
            self._inflight_bytes += b.cost
            b.future = self._submit(b.rec)

    def _submit(self, rec: NotificationRecord) -> concurrent.futures.Future[_Decoded]:
        return self._reader.submit(_pointer(self.topic, rec), partial(self._records, rec))

    def _records(self, rec: NotificationRecord, decoded: Decoded) -> _Decoded:
        """Bulk-build ConsumerRecords: LogMessage + position tuple, concatenated and re-typed in C
        (in the reader's CPU worker)."""
        n = rec.notification
        topic, partition, offset, loc = self.topic, rec.partition, rec.offset, ObjectLocation(n.bucket, n.key)
        _, messages = decoded
        out: _Decoded = []
        first = 0
        for h, logs in messages:
            pid, epoch, seq = h.producer_id, h.epoch, h.sequence
            tails = [(topic, partition, offset, i, pid, epoch, seq, loc)
                     for i in range(first, first + len(logs))]
            out.append((h, list(map(_tuple_new, repeat(ConsumerRecord), map(add, logs, tails)))))
            first += len(logs)
        return out

    # --- random access -------------------------------------------------------------------

    def read(self, partition: int, offset: int, index: int, timeout: float = 10.0) -> ConsumerRecord:
        """One LogMessage by position, with ranged GETs: the batch header, then its Message."""
        self._check_open()
        rec = self._notification_at(partition, offset, timeout)
        n = rec.notification
        ptr = _pointer(self.topic, rec)
        if not 0 <= index < n.logmessage_count:
            raise InvalidInputError(f"index {index} is outside {ptr.describe()} ({n.logmessage_count} LogMessages)")
        header, log_message = self._reader.read_one(ptr, n.header_size, index, timeout)
        return ConsumerRecord(*log_message, self.topic, rec.partition, rec.offset, index,
                              header.producer_id, header.epoch, header.sequence, ptr.location)

    def _notification_at(self, partition: int, offset: int, timeout: float) -> NotificationRecord:
        """The notification at (partition, offset), read by a throw-away assigned consumer so
        this consumer's own positions are untouched."""
        probe = NotificationConsumer(self._kafka_config, self._kafka_topic,
                                     group_id=f"{self.group_id}.read.{uuid.uuid4().hex[:8]}")
        try:
            probe.assign({partition: offset})
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                for r in probe.poll(min(0.5, max(0.0, deadline - time.monotonic())), max_records=1):
                    if r.partition == partition and r.offset == offset:
                        return r
                    raise InvalidInputError(f"no notification at topic {self.topic} read partition "
                                            f"{partition} offset {offset} (next is {r.offset})")
        finally:
            probe.close()
        raise ConsumerError(f"no notification at topic {self.topic} read partition {partition} "
                            f"offset {offset} within {timeout}s")

    # --- offsets -------------------------------------------------------------------------

    def commit(self, asynchronous: bool = False) -> dict[int, int]:
        """Commit every fully handed batch; returns the committed {partition: next offset}."""
        self._check_open()
        offsets = self._offsets.to_commit()
        if offsets:
            self._notify.commit(offsets, asynchronous=asynchronous)
            self._offsets.did_commit(offsets)
            self.metrics.commits += 1
        return offsets

    def _maybe_auto_commit(self) -> None:
        if not self._cc.enable_auto_commit:
            return
        now = time.monotonic()
        if now - self._last_auto_commit >= self._cc.auto_commit_interval_ms / 1000:
            self._last_auto_commit = now
            self.commit(asynchronous=True)

    def committed(self, partitions: Iterable[int] | None = None) -> dict[int, int | None]:
        self._check_open()
        return self._notify.committed(list(self.assignment() if partitions is None else partitions))

    def position(self) -> dict[int, int]:
        """Per assigned partition, the notification offset of the next batch to be handed over."""
        self._check_open()
        pending = [*([self._current] if self._current else []), *self._queue]
        return self._offsets.position(self._notify.position(), self.assignment(),
                                      [(b.rec.partition, b.rec.offset) for b in pending])

    @property
    def buffered_bytes(self) -> int:
        """Estimated memory held by batches fetched ahead (bounded by consumer.prefetch_bytes,
        or one batch if a single one is larger)."""
        return self._inflight_bytes

    def assignment(self) -> list[int]:
        return sorted(self._notify.assignment())

    def seek(self, partition: int, offset: int) -> None:
        """Continue `partition` at notification `offset`; drops what was fetched ahead for it.
        De-duplication starts afresh: records read again after a seek are wanted again."""
        self._check_open()
        self._unchecked.discard(partition)          # the application chose where to read
        if self._dedup is not None:
            self._dedup.clear()
        self._drop({partition})
        self._notify.seek(partition, offset)
        self._offsets.sought(partition, offset)

    def seek_to_beginning(self, partitions: Iterable[int] | None = None) -> None:
        for p in self.assignment() if partitions is None else partitions:
            self.seek(p, self._notify.watermarks(p)[0])

    def seek_to_end(self, partitions: Iterable[int] | None = None) -> None:
        for p in self.assignment() if partitions is None else partitions:
            self.seek(p, self._notify.watermarks(p)[1])

    def seek_to_timestamp(self, timestamp_ms: int) -> dict[int, int]:
        """Seek every assigned partition to the first batch notified at or after `timestamp_ms`
        (Kafka's offsets-for-times on the notification topic); past the end if none is."""
        self._check_open()
        found = self._notify.offsets_for_times(timestamp_ms)
        targets = {}
        for p in self.assignment():
            o = found.get(p, -1)
            targets[p] = o if o is not None and o >= 0 else self._notify.watermarks(p)[1]
            self.seek(p, targets[p])
        return targets

    def _drop(self, partitions: set[int]) -> None:
        """Forget fetched-ahead and current batches of `partitions` (seek, revocation)."""
        for b in [b for b in self._queue if b.rec.partition in partitions]:
            self._queue.remove(b)
            if b.future is not None:
                b.future.cancel()
                self._inflight_bytes -= b.cost
        cur = self._current
        if cur is not None and cur.rec.partition in partitions:
            deque(cur.cur, maxlen=0)                # exhaust it: a live poll iterator stops too
            cur.next_msg = len(cur.messages)
            self._current = None
            self._inflight_bytes -= cur.cost

    def _on_assign(self, partitions: list[int]) -> None:
        log.info("consumer %s/%s assigned %s", self.group_id, self.topic, partitions)
        self._unchecked.update(partitions)
        if self._user_on_assign is not None:
            self._user_on_assign(partitions)

    def _on_revoke(self, partitions: list[int]) -> None:
        """Commit what was handed over for the partitions leaving us, then drop the rest."""
        mine = set(partitions)
        offsets = self._offsets.to_commit(mine)
        if offsets:
            try:
                self._notify.commit(offsets, asynchronous=False)
                self._offsets.did_commit(offsets)
            except Exception as e:  # the group already moved on; at-least-once covers it
                log.warning("commit on revoke failed for %s: %s", sorted(offsets), e)
        self._drop(mine)
        self._offsets.forget(mine)
        self._unchecked -= mine
        if self._user_on_revoke is not None:
            self._user_on_revoke(partitions)

    # --- life cycle ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ConsumerError(f"consumer of topic {self.topic} is closed")

    def close(self) -> None:
        """Commit (if auto-commit is on), leave the group, stop fetching."""
        if self._closed:
            return
        try:
            if self._cc.enable_auto_commit:
                self.commit()
        finally:
            self._closed = True
            self._drop(set(self.assignment()) | {b.rec.partition for b in self._queue})
            try:
                self._notify.close()
            finally:
                self._reader.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
