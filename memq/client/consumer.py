"""The polling Consumer: notifications from a Kafka consumer group, batches from storage
(near the tail through a broker's read cache, `broker_source`).

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

The Consumer coordinates its parts, each with one job: `prefetch` (what to fetch ahead
within the byte budget), `handover` (what `poll()` returns, duplicates dropped),
`position_policy` (offset-range resets, expiry versus data loss, with the partition logs'
DeleteRecords starts, `memq.log.model.TopicLogs`, as the metadata said when the Consumer was made),
`commits`, `broker_source` (each part through a broker's read cache near the tail, from storage
far behind it, by `read_path`), `random_access` (`read()`), `compacted` (a compacted topic's prefix, read where the
position is below its compacted end, by the partition log model's segments: the latest record per
key, original offsets) and `by_key`
(`get()`: one key's latest value); `positions` keeps the offsets.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, Protocol

from memq.client.cluster import resolve, resolve_topic
from memq.client._auth import BrokerAuth
from memq.client.broker_source import BrokerParts
from memq.client.by_key import KeyLookup, KeyValue
from memq.client.commits import Committer
from memq.client.compacted import PartRead, Prefix
from memq.client.consumer_record import ConsumerRecord, DecodedBatch, batch_pointer, build_records, trim
from memq.client.dense_offsets import topic_offsets
from memq.client.handover import ConsumedSink, Handover
from memq.client.metrics import ConsumerMetrics
from memq.client.position_policy import PositionPolicy, RangeCheck
from memq.client.positions import Offsets, SequenceTracker
from memq.client.prefetch import Fetch, Prefetch, PrefetchBudget, Queued, object_size
from memq.client.random_access import RandomAccess
from memq.client.read_path import PathRule
from memq.client.reader import BatchReader, DataLossPolicy
from memq.clock import SystemClock
from memq.compaction.manifest import ManifestPointers
from memq.config import MemqConfig
from memq.errors import ConsumerError, DataLossError
from memq.format.batch import decode_batch_rows
from memq.log.model import TopicLogs
from memq.notify import NotificationConsumer, NotificationRecord

__all__ = ["ConsumedSink", "Consumer", "ConsumerMetrics", "ConsumerRecord", "NotificationSource",
           "notification_topic"]

log = logging.getLogger(__name__)


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


def notification_topic(config: MemqConfig, topic: str) -> str:
    """The Kafka topic carrying `topic`'s notifications by the config file alone (no brokers asked)."""
    return resolve(config, topic, None).topic.notification_topic


def _deserializing(value: Callable[[bytes], Any] | None,
                   key: Callable[[bytes], Any] | None) -> Callable[[ConsumerRecord], ConsumerRecord] | None:
    """What the Consumer applies to each record it hands over (None: nothing). A null key stays
    None; a value or key that does not deserialize raises the deserializer's error from `poll`."""
    if value is None and key is None:
        return None
    if key is None:
        assert value is not None
        return lambda r: r._replace(value=value(r.value))
    return lambda r: r._replace(value=r.value if value is None else value(r.value),
                                key=None if r.key is None else key(r.key))


class Consumer:
    """Reads one memq topic as a member of a consumer group. Not thread-safe: one thread
    (or one asyncio task) drives it, as with Kafka's consumer.

    The topic's Kafka topic and storage are found by memq's one resolver
    (`memq.client.cluster`): from the brokers in `producer.brokers` if any answers, else
    from the config file. `audit` (an `AuditSink`) is told when the last LogMessage of each
    Message was handed over. `on_assign`/`on_revoke` get read partition numbers on
    rebalances (called inside `poll`; on revocation, what was handed over was already
    committed). `pointers` (`memq.compaction.manifest.ManifestPointers` on the caller's ZooKeeper
    session) name a compacted topic's prefixes: with them the Consumer reads the latest record per
    key where compaction reached (`compacted`) and `get` looks in the compacted parts, without
    them it reads the notifications alone. `value_deserializer` and `key_deserializer` turn
    each record's value and key into what they mean before it is handed over (`poll`, `read`):
    `memq.client.serde.Serde(config.producer).decode` gives a framed value back decoded with the
    schema its id names, from the brokers' registry. `notifications` and `reader` replace the
    Kafka consumer and the batch reader (tests; the Consumer closes them).
    """

    def __init__(self, config: MemqConfig, topic: str, *, group_id: str | None = None,
                 audit: ConsumedSink | None = None, subscribe: bool = True,
                 on_assign: Callable[[list[int]], None] | None = None,
                 on_revoke: Callable[[list[int]], None] | None = None,
                 notifications: NotificationSource | None = None, reader: BatchReader | None = None,
                 pointers: ManifestPointers | None = None,
                 value_deserializer: Callable[[bytes], Any] | None = None,
                 key_deserializer: Callable[[bytes], Any] | None = None) -> None:
        cc = config.consumer if group_id is None else replace(config.consumer, group_id=group_id)
        self.topic = topic
        self.group_id = cc.group_id
        self.metrics = ConsumerMetrics()
        self._fetch_concurrency = cc.fetch_concurrency
        self._clock = clock = SystemClock()
        resolved = resolve_topic(config, topic)   # no I/O unless producer.brokers names brokers
        config = resolved.config
        kafka_topic = resolved.topic.notification_topic
        self._offsets = Offsets()
        self._logs = TopicLogs(resolved.topic.log_start)
        self._policy = PositionPolicy(topic, kafka_topic, cc.group_id, cc.auto_offset_reset,
                                      resolved.topic.retention_ms,
                                      DataLossPolicy(skip=cc.on_data_loss == "skip", logger=log, hint=""),
                                      self._logs)
        self._ranges = RangeCheck(self._policy)
        self._prefetch = Prefetch(PrefetchBudget(cc.prefetch_bytes), self._submit)
        self._handover = Handover(
            topic, cc.group_id, audit=audit, metrics=self.metrics, clock=clock, on_finished=self._finish,
            dedup=SequenceTracker(cc.dedup_max_producers, cc.dedup_window) if cc.dedup else None)
        self._closed = False
        self._notify: NotificationSource = notifications or NotificationConsumer(
            config.kafka, kafka_topic, group_id=cc.group_id, auto_offset_reset=cc.auto_offset_reset)
        try:
            self._reader = reader or BatchReader(config, cc.fetch_concurrency, decode=decode_batch_rows, parts=BrokerParts(
                resolved.brokers, PathRule(cc.read_path, cc.broker_read_max_age_ms), BrokerAuth.of(config.producer),
                self.metrics, clock, rack=cc.rack, timeout_s=cc.broker_read_timeout_ms / 1000,
                concurrency=cc.fetch_concurrency))
        except BaseException:
            self._notify.close()
            raise
        self._committer = Committer(self._notify, self._offsets, self.metrics, clock=clock, logger=log,
                                    interval_s=cc.auto_commit_interval_ms / 1000 if cc.enable_auto_commit else None)
        self._random = RandomAccess(
            topic, cc.group_id, self._reader, clock=clock,
            open_probe=lambda group: NotificationConsumer(config.kafka, kafka_topic, group_id=group))
        self._user_on_assign, self._user_on_revoke = on_assign, on_revoke
        self._config, self._kafka_topic, self._read_partitions = config, kafka_topic, resolved.topic.read_partitions
        self._earliest = cc.auto_offset_reset == "earliest"
        self._fresh: set[int] = set()        # assigned, nothing read yet: where does it start?
        self._begin: set[int] = set()        # sought to the beginning: a compacted prefix's, if any
        self._pointers = pointers
        # a dense topic's record offsets (None: sparse, offsets are notification offsets); a broker's
        # first answer for a partition may count it cold: Kafka's timeout, not a part read's
        self._dense = topic_offsets(resolved, config.kafka.request_timeout_ms / 1000)
        self._prefix = (Prefix(topic, pointers, self._reader.fetch_loop, self._logs, offsets=self._dense)
                        if pointers is not None and "compact" in resolved.topic.cleanup_policy else None)
        self._lookup: KeyLookup | None = None
        self._deserialize = _deserializing(value_deserializer, key_deserializer)
        self._cuts: dict[int, tuple[int, int]] = {}   # partition -> (note, index) a seek to a record moved it to
        if subscribe:
            self._notify.subscribe(on_assign=self._on_assign, on_revoke=self._on_revoke)

    # --- reading -------------------------------------------------------------------------

    def poll(self, timeout: float = 1.0) -> Iterator[ConsumerRecord]:
        """Records of the next batch (or the rest of an unfinished one); empty if none came
        within `timeout` seconds. Raises `DataLossError` for a missing or corrupt batch when
        `on_data_loss` is "raise" (again on every poll, until the application seeks past it)."""
        self._check_open()
        deadline = self._clock.monotonic() + timeout
        while True:
            if self._handover.current is not None:
                records = self._handover.deliver()
                return records if self._deserialize is None else map(self._deserialize, records)
            self._committer.tick()
            self._top_up(wait_s=0.0 if self._prefetch else max(0.0, deadline - self._clock.monotonic()))
            if self._prefetch:
                try:
                    taken = self._prefetch.take(timeout_s=max(0.0, deadline - self._clock.monotonic()))
                except DataLossError as e:
                    self._lost(self._prefetch.head.rec, e)   # raises unless skipped or expired
                    self._finish(self._prefetch.skip())
                    continue
                if taken is None:
                    return iter(())
                head, messages = taken
                if not self._handover.start(head, messages):   # nothing left after dropping duplicates
                    self._finish(head)
                continue
            if self._clock.monotonic() >= deadline:
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

    def read(self, partition: int, offset: int, index: int, timeout: float = 10.0) -> ConsumerRecord:
        """One LogMessage by position, with ranged GETs: the batch header, then its Message."""
        self._check_open()
        record = self._random.read(partition, offset, index, timeout)
        return record if self._deserialize is None else self._deserialize(record)

    def get(self, key: bytes, timeout: float = 10.0) -> KeyValue | None:
        """The latest record of `key` in a compacted topic (`deleted` if it is a tombstone), None
        when no record has it: the plain tail newest first, then the compacted parts' key
        indexes (`memq.client.by_key`). Independent of this consumer's position."""
        self._check_open()
        if self._lookup is None:
            notes = NotificationConsumer(self._config.kafka, self._kafka_topic, group_id=f"{self.group_id}-get")
            self._lookup = KeyLookup(self.topic, self._read_partitions, notes, self._reader.fetch_loop, self._pointers,
                                     dense=self._dense is not None)
        return self._lookup.get(key, timeout)

    def _top_up(self, wait_s: float) -> None:
        """Apply due offset-range resets, start fetches within the byte budget, and read more
        notifications if all are started."""
        for reset in self._ranges.resets(self._notify):
            self.metrics.offset_resets += 1
            self.metrics.expired += reset.expired
            self._seek(reset.partition, reset.target)
        self._prefetch.start()
        if not self._prefetch.wants_notifications():
            return
        # librdkafka's batch consume waits its whole timeout unless it fills up: wait for one
        # notification, then take what else is already there without waiting.
        polled = self._notify.poll(wait_s, max_records=1)
        if polled:
            polled += self._notify.poll(0.0, max_records=2 * self._fetch_concurrency)
        records: Sequence[Queued] = polled if self._prefix is None else self._enter_prefixes(self._prefix, polled)
        if self._dense is not None:
            for p in {r.partition for r in polled}:
                self._dense.count(p, ((r.offset, r.notification.logmessage_count) for r in polled if r.partition == p))
        for r in records:
            self._offsets.fetched(r.partition, r.offset)
        self._prefetch.add(records)

    def _enter_prefixes(self, prefix: Prefix, records: list[NotificationRecord]) -> list[Queued]:
        """A partition whose next notification lies below its compacted end reads its compacted
        parts from there instead (from a seek's record inside it), then the plain tail at `end`
        (its Kafka position moves there). A partition new to this consumer with no committed
        position starts at the prefix's beginning under auto_offset_reset = earliest (the
        notifications below `end` may be gone)."""
        out: list[Queued] = []
        moved: set[int] = set()
        for r in records:
            if r.partition in moved:
                continue   # read again from where the Kafka position moved
            note, index = r.offset, self._cut(r.partition, r.offset)
            if r.partition in self._begin or (r.partition in self._fresh and self._earliest
                                              and self._notify.committed([r.partition]).get(r.partition) is None):
                note = index = 0
            self._begin.discard(r.partition)
            self._fresh.discard(r.partition)
            entered = prefix.enter(r.partition, note, index)
            if entered is None:
                out.append(r)
                continue
            parts, end = entered
            moved.add(r.partition)
            out += parts
            self._notify.seek(r.partition, max(end, r.offset))
        return out

    def _lost(self, rec: Queued, e: DataLossError) -> None:
        """Count a lost batch as expired or skipped, or raise by the position policy."""
        if self._policy.lost(rec, e, int(self._clock.time() * 1000)) == "expired":
            self.metrics.expired += 1
        else:
            self.metrics.data_loss_skipped += 1

    def _submit(self, rec: Queued) -> concurrent.futures.Future[DecodedBatch]:
        if isinstance(rec, PartRead):
            assert self._prefix is not None   # only a prefix queues parts
            return self._reader.fetch_loop.submit(self._prefix.load(rec))
        plog = self._logs.partition(rec.partition)
        if plog.deleted(rec.offset):   # not fetched: lost as expired (position_policy)
            gone: concurrent.futures.Future[DecodedBatch] = concurrent.futures.Future()
            gone.set_exception(DataLossError(
                f"batch of topic {self.topic} at notification {rec.offset} of read partition {rec.partition} is "
                f"before the partition's log start {plog.first_note}",
                topic=self.topic, partition=rec.partition, offset=rec.offset))
            return gone
        base = None if self._dense is None else self._dense.offset_of(rec.partition, rec.offset)
        build = partial(build_records, self.topic, rec, base=base)
        skip = max(plog.skip(rec.offset), self._cut(rec.partition, rec.offset))
        return self._reader.submit(batch_pointer(self.topic, rec),
                                   (lambda decoded: trim(build(decoded), skip)) if skip else build)

    def _cut(self, partition: int, note: int) -> int:
        """Records of the part at `note` before where a seek to a record offset moved `partition`."""
        cut = self._cuts.get(partition)
        return cut[1] if cut is not None and cut[0] == note else 0

    def _finish(self, f: Fetch) -> None:
        """`f` is fully handed over (or skipped): its offset may be committed."""
        if self._cut(f.rec.partition, f.rec.offset):
            del self._cuts[f.rec.partition]
        self._offsets.finished(f.rec.partition, f.rec.offset)
        self._prefetch.done(f)
        self.metrics.batches += 1
        self.metrics.bytes += object_size(f.rec)

    # --- offsets -------------------------------------------------------------------------

    def commit(self, asynchronous: bool = False) -> dict[int, int]:
        """Commit every fully handed batch; returns the committed {partition: next offset}."""
        self._check_open()
        return self._offsets_of(self._committer.commit(asynchronous))

    def committed(self, partitions: Iterable[int] | None = None) -> dict[int, int | None]:
        self._check_open()
        found = self._notify.committed(list(self.assignment() if partitions is None else partitions))
        return {p: None if o is None else self._offset_of(p, o) for p, o in found.items()}

    def position(self) -> dict[int, int]:
        """Per assigned partition, the offset of the next batch to be handed over (on a dense
        topic, of its next record)."""
        self._check_open()
        cur = self._handover.current
        pending = [*([(cur.rec.partition, cur.rec.offset)] if cur else []), *self._prefetch.pending()]
        return self._offsets_of(self._offsets.position(self._notify.position(), self.assignment(), pending))

    def _offset_of(self, partition: int, note: int) -> int:
        """The offset the application sees for the position at notification `note`: `note` on a
        sparse topic, the record offset there (past a seek's cut inside the part) on a dense one.
        The notification Kafka keeps positions: a commit stores `note` either way."""
        return note if self._dense is None else self._dense.offset_of(partition, note, self._cut(partition, note))

    def _offsets_of(self, notes: Mapping[int, int]) -> dict[int, int]:
        return {p: self._offset_of(p, o) for p, o in notes.items()}

    @property
    def buffered_bytes(self) -> int:
        """Estimated memory held by batches fetched ahead (bounded by consumer.prefetch_bytes,
        or one batch if a single one is larger)."""
        return self._prefetch.budget.reserved

    def assignment(self) -> list[int]:
        return sorted(self._notify.assignment())

    def seek(self, partition: int, offset: int) -> None:
        """Continue `partition` at `offset`: a notification offset, or on a dense topic a record
        offset (its part is read from that record on); drops what was fetched ahead for it.
        De-duplication starts afresh: records read again after a seek are wanted again."""
        self._check_open()
        if self._dense is None:
            self._seek(partition, offset)
            return
        note, index = self._dense.position_of(partition, offset)
        self._seek(partition, note)
        if index:
            self._cuts[partition] = (note, index)

    def _seek(self, partition: int, offset: int) -> None:
        """Continue `partition` at notification `offset`."""
        self._check_open()
        self._cuts.pop(partition, None)
        self._ranges.discard({partition})          # the application chose where to read
        self._handover.clear_dedup()
        self._drop({partition})
        self._notify.seek(partition, offset)
        self._offsets.sought(partition, offset)
        self._fresh.discard(partition)
        self._begin.discard(partition)

    def seek_to_beginning(self, partitions: Iterable[int] | None = None) -> None:
        for p in self.assignment() if partitions is None else partitions:
            self._seek(p, dataclasses.replace(self._logs.partition(p), low=self._notify.watermarks(p)[0]).first_note)
            if self._prefix is not None:
                self._begin.add(p)

    def seek_to_end(self, partitions: Iterable[int] | None = None) -> None:
        for p in self.assignment() if partitions is None else partitions:
            self._seek(p, self._notify.watermarks(p)[1])

    def seek_to_timestamp(self, timestamp_ms: int) -> dict[int, int]:
        """Seek every assigned partition to the first batch notified at or after `timestamp_ms`
        (Kafka's offsets-for-times on the notification topic); past the end if none is."""
        self._check_open()
        found = self._notify.offsets_for_times(timestamp_ms)
        targets = {}
        for p in self.assignment():
            o = found.get(p, -1)
            targets[p] = o if o is not None and o >= 0 else self._notify.watermarks(p)[1]
            self._seek(p, targets[p])
        return self._offsets_of(targets)

    def _drop(self, partitions: set[int]) -> None:
        """Forget fetched-ahead and current batches of `partitions` (seek, revocation)."""
        self._prefetch.drop(partitions)
        dropped = self._handover.drop(partitions)
        if dropped is not None:
            self._prefetch.done(dropped)

    # --- rebalances and life cycle -------------------------------------------------------

    def _on_assign(self, partitions: list[int]) -> None:
        log.info("consumer %s/%s assigned %s", self.group_id, self.topic, partitions)
        self._ranges.add(partitions)
        self._fresh.update(partitions)
        if self._user_on_assign is not None:
            self._user_on_assign(partitions)

    def _on_revoke(self, partitions: list[int]) -> None:
        """Commit what was handed over for the partitions leaving us, then drop the rest."""
        mine = set(partitions)
        self._committer.revoked(mine)
        self._drop(mine)
        self._offsets.forget(mine)
        self._ranges.discard(mine)
        for p in mine:
            self._cuts.pop(p, None)
        self._fresh.difference_update(mine)
        if self._user_on_revoke is not None:
            self._user_on_revoke(partitions)

    def _check_open(self) -> None:
        if self._closed:
            raise ConsumerError(f"consumer of topic {self.topic} is closed")

    def close(self) -> None:
        """Commit (if auto-commit is on), leave the group, stop fetching."""
        if self._closed:
            return
        try:
            if self._committer.auto:
                self.commit()
        finally:
            self._closed = True
            self._drop(set(self.assignment()) | self._prefetch.partitions())
            try:
                self._notify.close()
                if self._lookup is not None:
                    self._lookup.close()
            finally:
                self._reader.close()


    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
