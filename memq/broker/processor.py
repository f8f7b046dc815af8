"""TopicProcessor: one topic's bounded ring of batch slots on a broker.

One slot fills while the others upload concurrently. What a slot holds is a `Fill`: a batch per
read partition written to, each stored as a part of the same object and published to its
partition, so a record is read from the partition its producer chose (a Kafka producer's, or
memq's Producer's key placement) while the fill's limits below count the fill as a whole: objects,
PUTs and memory per GiB do not grow with partitions (notifications do: one per part). A Message
that names no partition (memq's Producer's records without a key, older producers) goes to the
fill's `sticky` partition: one it already has, else the next in a rotation, so such traffic keeps
one part per fill. A fill seals when it holds at least
`batch_bytes` or `batch_messages` LogMessages, or when it is `batch_ms` old, before a Message
would take it past `MAX_PART_LOGMESSAGES` (record indexes fit Kafka offsets), or at once when a
Message asks for it (`seal=True`: the producer flushed and wants its acks now, not in
batch_ms). An early seal costs a smaller object, so more PUTs and notifications per GiB; a
producer flushing often trades storage requests for latency, which is its call. Each slot is a
permit of a semaphore, so at most `ring_slots` batches exist at once: when every slot is
busy, `append` waits up to `busy_wait_s` (the connection sets the request aside and goes on
with other topics, `can_append_now`), then answers BUSY. Memory is therefore bounded by
`ring_slots * (batch_bytes + max_message_bytes)`.
A small fill of a shared group (at most `SMALL_BATCH_BYTES`) gives its slot back as soon as
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
hands back one `Outcome` per batch (`settle`); the fill's slot is released then.

A stored batch is announced on Kafka before any ack=all Message in it is acked; if the PUT or
the publish fails for good, every ack=all Message of that batch gets an error ack naming why.
Nothing is deleted on such an ambiguous failure (see `_unannounced`).
Message bodies are never decoded: the caller has verified header and CRC.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Sequence
from operator import attrgetter

from memq.clock import Clock, SystemClock
from memq.config import TopicConfig
from memq.format import MessageHeader, Notification
from memq.format.batch import MAX_PART_LOGMESSAGES
from memq.format.wire import Ack, AckCode, AckLevel
from memq.storage import ObjectLocation, StorageHandler

from .batch import Batch, Failed, Fill, Outcome, Reply
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
                 group: GroupWriter | None = None, clock: Clock | None = None) -> None:
        """`group`: the writer of the topic's storage group (default: the topic's own objects,
        published through `publisher`)."""
        self.config = topic
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
        self._filling: Fill | None = None
        self._rotation = random.randrange(topic.read_partitions)   # brokers do not all start at partition 0
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
                     reply: Reply, *, seal: bool = False, partition: int = -1) -> None:
        """Put one verified Message into the filling batch of `partition` (-1: the fill's sticky
        one), sealing the fill after when `seal`. The caller checked `partition` is the topic's.

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
        fill = self._filling
        if fill is not None and fill.logcount + header.count > MAX_PART_LOGMESSAGES:
            self._seal(fill)   # a part's record indexes must fit its Kafka offsets (kafka_api.offsets)
            fill = None
        if fill is None or self._closing:
            fill = await self._open_fill()
            if fill is None:
                code = AckCode.CLOSING if self._closing else AckCode.BUSY
                why = ("topic is closing on this broker" if self._closing else
                       f"all {self.config.ring_slots} batch slots busy for {self._busy_wait_s:g}s")
                self._metrics.rejected.labels(str(code)).inc()
                reply(Ack(request_id, False, code, f"topic {self.config.name}: {why}"))
                return
        if partition < 0:
            partition = fill.sticky if fill.sticky >= 0 else self._stick(fill)
        batch = fill.batches.get(partition)
        if batch is None:
            batch = fill.batches[partition] = Batch(partition)
        if ack is AckLevel.ALL:
            batch.waiters.append((request_id, len(batch.messages), batch.logcount, reply))
        batch.messages.append(message)
        batch.headers.append(header)
        self._recent.hold(mid)
        batch.nbytes += size
        batch.logcount += header.count
        fill.nbytes += size
        fill.logcount += header.count
        cfg = self.config
        if (fill.nbytes >= cfg.batch_bytes or fill.logcount >= cfg.batch_messages
                or (fill.held and fill.nbytes >= cfg.min_batch_bytes)):
            self._seal(fill)
        elif seal:
            self._m_flush_seals.inc()
            self._group.seal_soon()
        if ack is not AckLevel.ALL:
            reply(Ack(request_id, True))

    def _stick(self, fill: Fill) -> int:
        """The partition of `fill`'s Messages that name none: one it already has a batch of (no
        extra part), else the next of the rotation (spread over fills, as Kafka's sticky partitioner)."""
        if fill.batches:
            fill.sticky = next(iter(fill.batches))
        else:
            self._rotation = fill.sticky = (self._rotation + 1) % self.config.read_partitions
        return fill.sticky

    def _duplicate(self, seen: Held | Ack, request_id: int, ack: AckLevel, reply: Reply) -> None:
        self._m_duplicates.inc()
        if ack is not AckLevel.ALL:
            reply(Ack(request_id, True))
        elif isinstance(seen, Held):     # still in a batch: answered when that batch finishes
            seen.waiters.append((request_id, reply))
        else:
            reply(dataclasses.replace(seen, id=request_id))

    async def _open_fill(self) -> Fill | None:
        """The filling fill, opening one when a slot frees up; None if closing or still busy."""
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
            self._m_busy.inc()
            fill = Fill(opened=clock.monotonic())
            fill.timer = asyncio.get_running_loop().call_later(self.config.batch_ms / 1000, self._aged, fill)
            self._filling = fill
        self._m_stage["queue_wait"].observe(clock.monotonic() - t0)
        return self._filling

    def _aged(self, fill: Fill) -> None:
        """`batch_ms` passed: seal, unless the fill keeps filling: a small one under the latency
        budget (until max_batch_ms), or any while the storage throttles (`GroupWriter.batch_age_s`)."""
        if self._filling is not fill:
            return
        if not self._closing:
            cfg = self.config
            age_s = self._group.batch_age_s(cfg.batch_ms)
            held = fill.nbytes < cfg.min_batch_bytes and cfg.hold_until_ms / 1000 > age_s
            if held:
                age_s = cfg.hold_until_ms / 1000
            rest_s = fill.opened + age_s - self._clock.monotonic()
            if rest_s > 0:
                if held:
                    self._m_held.inc()
                    fill.held = True
                else:
                    self._m_throttled.inc()
                fill.timer = asyncio.get_running_loop().call_later(rest_s, self._seal, fill)
                return
        self._seal(fill)

    def _seal(self, fill: Fill) -> None:
        """`fill` must go: its group stores it now, with the other topics' filling batches."""
        if self._filling is fill:   # else already sealed (the age timer raced a size seal)
            self._group.seal()

    def seal_if_at_least(self, nbytes: int) -> bool:
        """Seal the filling batches now if they hold `nbytes` or more (a Kafka producer waiting on
        its acks: `memq.broker.doors.kafka`); counted with the flush seals. True if it did."""
        fill = self._filling
        if fill is None or fill.nbytes < nbytes:
            return False
        self._m_flush_seals.inc()
        self._seal(fill)
        return True

    def take(self) -> Fill | None:
        """The filling batches, sealed, for the group's object being stored (None if empty)."""
        fill = self._filling
        if fill is None:
            return None
        self._filling = None
        if fill.timer is not None:
            fill.timer.cancel()
        if not fill.batches:
            self._release_slot()
            return None
        # counted per fill, not per Message: three locked increments per Message were a tenth
        # of a broker's CPU with many small topics
        self._m_messages.inc(sum(len(b.messages) for b in fill.batches.values()))
        self._m_logmessages.inc(fill.logcount)
        self._m_bytes.inc(fill.nbytes)
        self._m_stage["batch_fill"].observe(self._clock.monotonic() - fill.opened)
        if (self._group.group and fill.nbytes <= SMALL_BATCH_BYTES and self._small < SMALL_BATCHES
                and self._small_bytes + fill.nbytes <= self.config.batch_bytes):
            fill.slot_returned = True
            self._small += 1
            self._small_bytes += fill.nbytes
            self._release_slot()
        return fill

    async def store_apart(self, messages: list[memoryview], headers: list[MessageHeader]) -> tuple[str, Notification]:
        """Messages stored as their own object, unpublished: (notification topic, its notification),
        for a transaction to publish at its commit (`GroupWriter.store_apart`)."""
        return self.notification_topic, await self._group.store_apart(self.name, messages, headers)

    def track(self, task: asyncio.Task[None]) -> None:
        """The task storing a batch of this topic: `close` waits for it."""
        self._uploads.add(task)
        task.add_done_callback(self._uploads.discard)

    def settle(self, fill: Fill, outcomes: Sequence[Outcome]) -> None:
        """The group stored `fill`'s batches (and announced them, or not) or failed to, an outcome
        per batch in order: ack or fail their ack=all Messages (ack=1 ones were answered), then
        free the fill's slot."""
        try:
            stored = [o for o in outcomes if not isinstance(o, Failed)]
            if stored:   # one object, one PUT and one publish call for the whole fill
                self._m_stage["upload"].observe(stored[0].put_s)
                if any(not isinstance(o.published, Exception) for o in stored):
                    self._m_stage["notify"].observe(stored[0].notify_s)
            for batch, outcome in zip(fill.batches.values(), outcomes):
                if isinstance(outcome, Failed):
                    self._fail(batch, outcome.code, outcome.why)
                else:
                    self._announced(batch, outcome.note, outcome.published)
        finally:
            for batch in fill.batches.values():
                batch.messages.clear()   # drop the frames now, the acks are out
            if fill.slot_returned:
                self._small -= 1
                self._small_bytes -= fill.nbytes
            else:
                self._release_slot()

    def _release_slot(self) -> None:
        self._busy -= 1
        self._m_busy.dec()
        self._slots.release()

    def _announced(self, batch: Batch, note: Notification, published: tuple[int, int] | Exception) -> None:
        self._m_batch_bytes.observe(note.size)
        self._m_group_bytes.inc(note.size)
        if isinstance(published, Exception):   # the batch fails, the broker goes on
            self._fail(batch, AckCode.NOTIFY, f"notifying batch {note.key} of topic {note.topic} failed: "
                                              f"{published}")
            self._unannounced(note)
            return
        partition, offset = published
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

