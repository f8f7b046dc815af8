"""TopicProcessor: one topic's bounded ring of batch slots on a broker.

One slot fills while the others upload concurrently. A batch seals when it holds at least
`batch_bytes` or `batch_messages` LogMessages, or when it is `batch_ms` old, before a Message
would take it past `MAX_PART_LOGMESSAGES` (record indexes fit Kafka offsets), or at once when a
Message asks for it (`seal=True`: the producer flushed and wants its acks now, not in
batch_ms). An early seal costs a smaller object, so more PUTs and notifications per GiB; a
producer flushing often trades storage requests for latency, which is its call. Each slot is a
permit of a semaphore, so at most `ring_slots` batches exist at once: when every slot is
busy, `append` waits up to `busy_wait_s` (the connection sets the request aside and goes on
with other topics, `can_append_now`), then answers BUSY. Memory is therefore bounded by
`ring_slots * (batch_bytes + max_message_bytes)`.
A small batch of a shared group (at most `SMALL_BATCH_BYTES`) gives its slot back as soon as
its group's object takes it, up to `SMALL_BATCHES` of them and `batch_bytes` in all per topic
(bounding memory by bytes, not by a count meant for full batches): a trickle topic has a part
in most of its group's objects, and while each waits seconds for its notification (tansu with
a thousand topics) four slots were full and its next Message waited for one.

The latency budget: a batch `batch_ms` old with fewer than `min_batch_bytes` keeps filling
until `max_batch_ms` (a trickle topic otherwise writes an object, a PUT and a notification every
`batch_ms`); size, count and flush seals still apply meanwhile. While the storage answers 503
SlowDown, every batch's age limit is stretched the same way (`GroupWriter.batch_age_s`).

Storing is the group's: a sealed batch goes to S3 as a part of its storage group's next object,
with the filling batches of the group's other topics (`memq.broker.storage_group.GroupWriter`), which
hands back one `Outcome` per batch (`settle`); the batch's slot is released then.

A stored batch is announced on Kafka before any ack=all Message in it is acked; if the PUT or
the publish fails for good, every ack=all Message of that batch gets an error ack naming why.
Nothing is deleted on such an ambiguous failure (see `_unannounced`).
Message bodies are never decoded: the caller has verified header and CRC.

A compacted topic of several read partitions has one processor per partition on its broker
(`memq.broker.placed.PlacedTopic`), each with `partition` set: its batches' notifications go to
that partition (the producer placed the records by key), not to one Kafka's partitioner picks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from operator import attrgetter

from memq.clock import Clock, SystemClock
from memq.config import TopicConfig
from memq.format import MessageHeader, Notification
from memq.format.batch import MAX_PART_LOGMESSAGES
from memq.format.wire import Ack, AckCode, AckLevel
from memq.storage import ObjectLocation, StorageHandler

from .batch import Batch, Failed, Outcome, Reply
from .dedup import Held, RecentMessages, message_id
from .storage_group import GroupWriter
from .metrics import BrokerMetrics
from .publish import Publisher, PublishPath

log = logging.getLogger(__name__)

_count = attrgetter("count")   # a Message header's LogMessage count, with no Python frame per Message
SMALL_BATCH_BYTES = 64 * 1024   # a shared-group batch this small gives its slot back when taken
SMALL_BATCHES = 16              # per topic: at most this many such batches waiting for their object

class TopicProcessor:
    def __init__(self, topic: TopicConfig, *, cluster: str, broker_id: str, storage: StorageHandler,
                 publisher: Publisher, metrics: BrokerMetrics, busy_wait_s: float = 5.0,
                 dedup_capacity: int = 50_000, dedup_window_s: float = 300.0,
                 group: GroupWriter | None = None, clock: Clock | None = None, partition: int = -1) -> None:
        """`group`: the writer of the topic's storage group (default: the topic's own objects,
        published through `publisher`); `partition`: the notification partition of every batch
        (-1: Kafka's partitioner picks each)."""
        self.config = topic
        self.partition = partition
        self.notification_topic = topic.notification_topic_for(cluster)
        self._clock = clock or SystemClock()
        self._group = group or GroupWriter("", storage=storage, path=PublishPath(publisher, metrics, clock=self._clock),
                                           broker_id=broker_id, metrics=metrics, clock=self._clock)
        self._group.join(self)
        self._busy_wait_s = busy_wait_s
        self._slots = asyncio.Semaphore(topic.ring_slots)
        self._busy = 0
        self._waiting = 0             # appends waiting for a batch slot
        self._small = 0               # taken small batches whose slot was given back, and their bytes
        self._small_bytes = 0
        self._filling: Batch | None = None
        self._uploads: set[asyncio.Task[None]] = set()
        self._closing = False
        self._recent = RecentMessages(dedup_capacity, dedup_window_s)
        name = topic.name
        shared = self._group.group
        self._m_stage = {s: metrics.stage(name, shared, s) for s in ("queue_wait", "batch_fill", "upload", "notify")}
        self.ack_stage = metrics.stage(name, shared, "ack")   # observed by the connection writing the ack
        self._m_messages = metrics.messages.labels(name)
        self._m_logmessages = metrics.logmessages.labels(name)
        self._m_bytes = metrics.bytes.labels(name)
        self._m_busy = metrics.busy_slots.labels(name)
        self._m_batch_bytes = metrics.batch_bytes.labels(name)
        self._m_flush_seals = metrics.flush_seals.labels(name)
        self._m_held = metrics.held_batches.labels(name)
        self._m_throttled = metrics.throttled_batches.labels(name)
        self._m_unannounced = metrics.unannounced_batches.labels(name)
        self._m_duplicates = metrics.duplicate_messages.labels(name)
        self._m_ok = metrics.batches.labels(name, "ok")
        self._m_group_bytes = metrics.group_bytes.labels(self._group.group, name)
        self._metrics = metrics

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def busy_slots(self) -> int:
        return self._busy

    @property
    def waiting_for_slot(self) -> int:
        """Appends now waiting for a free batch slot (each answers BUSY after `busy_wait_s`)."""
        return self._waiting

    def can_append_now(self) -> bool:
        """An `append` now would not wait for a batch slot (it may still answer CLOSING)."""
        return self._filling is not None or self._closing or not self._slots.locked()

    async def append(self, message: memoryview, header: MessageHeader, request_id: int, ack: AckLevel,
                     reply: Reply, *, seal: bool = False) -> None:
        """Put one verified Message into the filling batch, sealing it after when `seal`.

        `reply` gets the Message's ack exactly once, whatever its level: at once for ack=0 and
        ack=1 successes and for refusals (BUSY, CLOSING), once its batch is stored and announced
        (or failed) for ack=all. A Message this processor already holds or recently stored (same
        producer id, epoch, sequence) is not stored again: it gets the original's outcome.
        """
        mid = message_id(header)
        seen = self._recent.seen(mid)
        if seen is not None:
            self._duplicate(seen, request_id, ack, reply)
            return
        if header.count > MAX_PART_LOGMESSAGES:
            self._metrics.rejected.labels(str(AckCode.TOO_LARGE)).inc()
            reply(Ack(request_id, False, AckCode.TOO_LARGE, f"topic {self.config.name}: a Message of "
                      f"{header.count} LogMessages (a part holds at most {MAX_PART_LOGMESSAGES})"))
            return
        size = len(message)
        batch = self._filling
        if batch is not None and batch.logcount + header.count > MAX_PART_LOGMESSAGES:
            self._seal(batch)   # a part's record indexes must fit its Kafka offsets (kafka_api.offsets)
            batch = None
        if batch is None or self._closing:
            batch = await self._open_batch()
            if batch is None:
                code = AckCode.CLOSING if self._closing else AckCode.BUSY
                why = ("topic is closing on this broker" if self._closing else
                       f"all {self.config.ring_slots} batch slots busy for {self._busy_wait_s:g}s")
                self._metrics.rejected.labels(str(code)).inc()
                reply(Ack(request_id, False, code, f"topic {self.config.name}: {why}"))
                return
        if ack is AckLevel.ALL:
            batch.waiters.append((request_id, len(batch.messages), batch.logcount, reply))
        batch.messages.append(message)
        batch.headers.append(header)
        self._recent.hold(mid)
        batch.nbytes += size
        batch.logcount += header.count
        cfg = self.config
        if (batch.nbytes >= cfg.batch_bytes or batch.logcount >= cfg.batch_messages
                or (batch.held and batch.nbytes >= cfg.min_batch_bytes)):
            self._seal(batch)
        elif seal:
            self._m_flush_seals.inc()
            self._group.seal_soon()
        if ack is not AckLevel.ALL:
            reply(Ack(request_id, True))

    def _duplicate(self, seen: Held | Ack, request_id: int, ack: AckLevel, reply: Reply) -> None:
        self._m_duplicates.inc()
        if ack is not AckLevel.ALL:
            reply(Ack(request_id, True))
        elif isinstance(seen, Held):     # still in a batch: answered when that batch finishes
            seen.waiters.append((request_id, reply))
        else:
            reply(dataclasses.replace(seen, id=request_id))

    async def _open_batch(self) -> Batch | None:
        """The filling batch, opening one when a slot frees up; None if closing or still busy."""
        clock = self._clock
        t0 = clock.monotonic()
        while self._filling is None:
            if self._closing:
                return None
            if self._slots.locked():   # else acquire() returns at once: no timeout to arm
                remaining = self._busy_wait_s - (clock.monotonic() - t0)
                self._waiting += 1
                try:
                    async with asyncio.timeout(max(remaining, 0.0)):
                        await self._slots.acquire()
                except TimeoutError:
                    return None
                finally:
                    self._waiting -= 1
            else:
                await self._slots.acquire()
            if self._filling is not None or self._closing:   # another request opened one meanwhile
                self._slots.release()
                continue
            self._busy += 1
            self._m_busy.inc()   # inc/dec: a compacted topic's partitions share the gauge (placed.py)
            batch = Batch(opened=clock.monotonic())
            batch.timer = asyncio.get_running_loop().call_later(self.config.batch_ms / 1000, self._aged, batch)
            self._filling = batch
        self._m_stage["queue_wait"].observe(clock.monotonic() - t0)
        return self._filling

    def _aged(self, batch: Batch) -> None:
        """`batch_ms` passed: seal, unless the batch keeps filling: a small one under the latency
        budget (until max_batch_ms), or any while the storage throttles (`GroupWriter.batch_age_s`)."""
        if self._filling is not batch:
            return
        if not self._closing:
            cfg = self.config
            age_s = self._group.batch_age_s(cfg.batch_ms)
            held = batch.nbytes < cfg.min_batch_bytes and cfg.hold_until_ms / 1000 > age_s
            if held:
                age_s = cfg.hold_until_ms / 1000
            rest_s = batch.opened + age_s - self._clock.monotonic()
            if rest_s > 0:
                if held:
                    self._m_held.inc()
                    batch.held = True
                else:
                    self._m_throttled.inc()
                batch.timer = asyncio.get_running_loop().call_later(rest_s, self._seal, batch)
                return
        self._seal(batch)

    def _seal(self, batch: Batch) -> None:
        """`batch` must go: its group stores it now, with the other topics' filling batches."""
        if self._filling is batch:   # else already sealed (the age timer raced a size seal)
            self._group.seal()

    def seal_if_at_least(self, nbytes: int) -> bool:
        """Seal the filling batch now if it holds `nbytes` or more (a Kafka producer waiting on its
        acks: `memq.broker.doors.kafka`); counted with the flush seals. True if it did."""
        batch = self._filling
        if batch is None or batch.nbytes < nbytes:
            return False
        self._m_flush_seals.inc()
        self._seal(batch)
        return True

    def take(self) -> Batch | None:
        """The filling batch, sealed, for the group's object being stored (None if empty)."""
        batch = self._filling
        if batch is None:
            return None
        self._filling = None
        if batch.timer is not None:
            batch.timer.cancel()
        if not batch.messages:
            self._release_slot()
            return None
        # counted per batch, not per Message: three locked increments per Message were a tenth
        # of a broker's CPU with many small topics
        self._m_messages.inc(len(batch.messages))
        self._m_logmessages.inc(batch.logcount)
        self._m_bytes.inc(batch.nbytes)
        self._m_stage["batch_fill"].observe(self._clock.monotonic() - batch.opened)
        if (self._group.group and batch.nbytes <= SMALL_BATCH_BYTES and self._small < SMALL_BATCHES
                and self._small_bytes + batch.nbytes <= self.config.batch_bytes):
            batch.slot_returned = True
            self._small += 1
            self._small_bytes += batch.nbytes
            self._release_slot()
        return batch

    async def store_apart(self, messages: list[memoryview], headers: list[MessageHeader]) -> tuple[str, Notification]:
        """Messages stored as their own object, unpublished: (notification topic, its notification),
        for a transaction to publish at its commit (`GroupWriter.store_apart`)."""
        return self.notification_topic, await self._group.store_apart(self.name, messages, headers)

    def track(self, task: asyncio.Task[None]) -> None:
        """The task storing a batch of this topic: `close` waits for it."""
        self._uploads.add(task)
        task.add_done_callback(self._uploads.discard)

    def settle(self, batch: Batch, outcome: Outcome) -> None:
        """The group stored `batch` (and announced it, or not) or failed to: ack or fail its
        ack=all Messages (ack=1 ones were answered), then free its slot."""
        try:
            if isinstance(outcome, Failed):
                self._fail(batch, outcome.code, outcome.why)
            else:
                self._announced(batch, outcome.note, outcome.published, outcome.put_s, outcome.notify_s)
        finally:
            batch.messages.clear()   # drop the frames now, the acks are out
            if batch.slot_returned:
                self._small -= 1
                self._small_bytes -= batch.nbytes
            else:
                self._release_slot()

    def _release_slot(self) -> None:
        self._busy -= 1
        self._m_busy.dec()
        self._slots.release()

    def _announced(self, batch: Batch, note: Notification, published: tuple[int, int] | Exception,
                   put_s: float, notify_s: float) -> None:
        self._m_stage["upload"].observe(put_s)
        self._m_batch_bytes.observe(note.size)
        self._m_group_bytes.inc(note.size)
        if isinstance(published, Exception):   # the batch fails, the broker goes on
            self._fail(batch, AckCode.NOTIFY, f"notifying batch {note.key} of topic {note.topic} failed: "
                                              f"{published}")
            self._unannounced(note)
            return
        partition, offset = published
        self._m_stage["notify"].observe(notify_s)
        self._m_ok.inc()
        for request_id, index, record, reply in batch.waiters:
            reply(Ack(request_id, True, AckCode.OK, "", note.bucket, note.key, index, partition, offset, record=record))
        self._recent.stored(map(message_id, batch.headers), note.bucket, note.key, partition, offset,
                            self._clock.monotonic(), map(_count, batch.headers))

    def _fail(self, batch: Batch, code: AckCode, why: str) -> None:
        log.warning("%s (%d Messages get error acks)", why, len(batch.headers))
        self._metrics.batches.labels(self.config.name, str(code)).inc()
        for request_id, _index, _record, reply in batch.waiters:
            reply(Ack(request_id, False, code, why))
        self._recent.failed(map(message_id, batch.headers), Ack(0, False, code, why))

    def _unannounced(self, note: Notification) -> None:
        """Keep the object of a batch whose publish failed: a failure may still be delivered.

        librdkafka's "Message timed out" does not mean "not delivered": a notification queued
        before a Kafka stall can land after it. Deleting the object would leave that pointer
        dangling, so the object stays for the orphan collector (retention), counted and named.
        """
        self._m_unannounced.inc()
        log.warning("kept batch %s of topic %s after its failed publish: an orphan unless the "
                    "notification was delivered after all", ObjectLocation(note.bucket, note.key), self.config.name)

    async def close(self) -> None:
        """Stop taking writes, seal the filling batch and wait until every batch is acked."""
        self._closing = True
        if self._filling is not None:
            self._seal(self._filling)
        while self._uploads:
            await asyncio.gather(*list(self._uploads))
        self._group.leave(self)

