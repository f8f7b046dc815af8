"""TopicProcessor: one topic's bounded ring of batch slots on a broker.

One slot fills while the others upload concurrently. A batch seals when it holds at least
`batch_bytes` or `batch_messages` LogMessages, or when it is `batch_ms` old, or at once when a
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
`batch_ms`); size, count and flush seals still apply meanwhile.

Storing is the group's: a sealed batch goes to S3 as a part of its storage group's next object,
with the filling batches of the group's other topics (`memq.broker.group.GroupWriter`); a
batch's slot is released when its object is stored and its part announced.

A stored batch is announced on Kafka before any ack=all Message in it is acked; if the PUT or
the publish fails for good, every ack=all Message of that batch gets an error ack naming why.
Nothing is deleted on such an ambiguous failure (see `_unannounced`).
Message bodies are never decoded: the caller has verified header and CRC.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from memq.config import TopicConfig
from memq.errors import NotifyError
from memq.format import NOTIFICATION_VERSION, MessageHeader, Notification
from memq.format.wire import Ack, AckCode, AckLevel
from memq.storage import ObjectLocation, StorageHandler

from .dedup import Held, RecentMessages, message_id
from .group import GroupWriter, Part, Publisher
from .metrics import BrokerMetrics

log = logging.getLogger(__name__)

SMALL_BATCH_BYTES = 64 * 1024   # a shared-group batch this small gives its slot back when taken
SMALL_BATCHES = 16              # per topic: at most this many such batches waiting for their object

#: Called with an ack for a Message that asked for ack=all (from the processor's upload task).
Reply = Callable[[Ack], None]


@dataclass(slots=True)
class _Batch:
    opened: float
    messages: list[memoryview] = field(default_factory=list)
    headers: list[MessageHeader] = field(default_factory=list)
    waiters: list[tuple[int, int, Reply]] = field(default_factory=list)   # (request id, index, reply)
    nbytes: int = 0
    logcount: int = 0
    timer: asyncio.TimerHandle | None = None
    held: bool = False          # past batch_ms, under min_batch_bytes: filling until max_batch_ms
    slot_returned: bool = False  # a small shared-group batch: its slot was given back when taken


class TopicProcessor:
    def __init__(self, topic: TopicConfig, *, cluster: str, broker_id: str, storage: StorageHandler,
                 publisher: Publisher, metrics: BrokerMetrics, busy_wait_s: float = 5.0,
                 dedup_capacity: int = 50_000, dedup_window_s: float = 300.0,
                 group: GroupWriter | None = None) -> None:
        """`group`: the writer of the topic's storage group (default: the topic's own objects,
        published through `publisher`)."""
        self.config = topic
        self.notification_topic = topic.notification_topic_for(cluster)
        self._broker_id = broker_id
        self._group = group or GroupWriter("", storage=storage, publisher=publisher, broker_id=broker_id,
                                           metrics=metrics)
        self._group.join(self)
        self._busy_wait_s = busy_wait_s
        self._slots = asyncio.Semaphore(topic.ring_slots)
        self._busy = 0
        self._small = 0               # taken small batches whose slot was given back, and their bytes
        self._small_bytes = 0
        self._filling: _Batch | None = None
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
        self._m_notification_bytes = metrics.notification_bytes.labels(name)
        self._m_unannounced = metrics.unannounced_batches.labels(name)
        self._m_duplicates = metrics.duplicate_messages.labels(name)
        self._m_ok = metrics.batches.labels(name, "ok")
        self._m_group_bytes = metrics.group_bytes.labels(self._group.group, name)
        self._metrics = metrics

    @property
    def busy_slots(self) -> int:
        return self._busy

    def can_append_now(self) -> bool:
        """An `append` now would not wait for a batch slot (it may still answer CLOSING)."""
        return self._filling is not None or self._closing or not self._slots.locked()

    async def append(self, message: memoryview, header: MessageHeader, request_id: int, ack: AckLevel,
                     reply: Reply, *, seal: bool = False) -> Ack | None:
        """Put one verified Message into the filling batch, sealing it after when `seal`.

        Returns the ack to send now (ack=1 success, BUSY, CLOSING), or None when the ack comes
        later through `reply` (ack=all) or never (ack=0). A Message this processor already
        holds or recently stored (same producer id, epoch, sequence) is not stored again: it
        gets the original's outcome.
        """
        mid = message_id(header)
        seen = self._recent.seen(mid)
        if seen is not None:
            return self._duplicate(seen, request_id, ack, reply)
        size = len(message)
        batch = self._filling
        if batch is None or self._closing:
            batch = await self._open_batch()
            if batch is None:
                code = AckCode.CLOSING if self._closing else AckCode.BUSY
                why = ("topic is closing on this broker" if self._closing else
                       f"all {self.config.ring_slots} batch slots busy for {self._busy_wait_s:g}s")
                return Ack(request_id, False, code, f"topic {self.config.name}: {why}")
        if ack is AckLevel.ALL:
            batch.waiters.append((request_id, len(batch.messages), reply))
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
        if ack is AckLevel.LEADER:
            return Ack(request_id, True)
        return None

    def _duplicate(self, seen: Held | Ack, request_id: int, ack: AckLevel, reply: Reply) -> Ack | None:
        self._m_duplicates.inc()
        if ack is AckLevel.LEADER:
            return Ack(request_id, True)
        if ack is AckLevel.NONE:
            return None
        if isinstance(seen, Held):     # still in a batch: answered when that batch finishes
            seen.waiters.append((request_id, reply))
            return None
        return dataclasses.replace(seen, id=request_id)

    async def _open_batch(self) -> _Batch | None:
        """The filling batch, opening one when a slot frees up; None if closing or still busy."""
        t0 = time.monotonic()
        while self._filling is None:
            if self._closing:
                return None
            if self._slots.locked():   # else acquire() returns at once: no timeout to arm
                remaining = self._busy_wait_s - (time.monotonic() - t0)
                try:
                    async with asyncio.timeout(max(remaining, 0.0)):
                        await self._slots.acquire()
                except TimeoutError:
                    return None
            else:
                await self._slots.acquire()
            if self._filling is not None or self._closing:   # another request opened one meanwhile
                self._slots.release()
                continue
            self._busy += 1
            self._m_busy.set(self._busy)
            batch = _Batch(opened=time.monotonic())
            batch.timer = asyncio.get_running_loop().call_later(self.config.batch_ms / 1000, self._aged, batch)
            self._filling = batch
        self._m_stage["queue_wait"].observe(time.monotonic() - t0)
        return self._filling

    def _aged(self, batch: _Batch) -> None:
        """`batch_ms` passed: seal, unless the latency budget says a small batch keeps filling."""
        if self._filling is not batch:
            return
        if batch.nbytes < self.config.min_batch_bytes and not self._closing:
            rest_s = batch.opened + self.config.hold_until_ms / 1000 - time.monotonic()
            if rest_s > 0:
                self._m_held.inc()
                batch.held = True
                batch.timer = asyncio.get_running_loop().call_later(rest_s, self._seal, batch)
                return
        self._seal(batch)

    def _seal(self, batch: _Batch) -> None:
        """`batch` must go: its group stores it now, with the other topics' filling batches."""
        if self._filling is batch:   # else already sealed (the age timer raced a size seal)
            self._group.seal()

    def seal_if_at_least(self, nbytes: int) -> bool:
        """Seal the filling batch now if it holds `nbytes` or more (a Kafka producer waiting on its
        acks: `kafka_api.listener`); counted with the flush seals. True if it did."""
        batch = self._filling
        if batch is None or batch.nbytes < nbytes:
            return False
        self._m_flush_seals.inc()
        self._seal(batch)
        return True

    def take(self) -> _Batch | None:
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
        self._m_stage["batch_fill"].observe(time.monotonic() - batch.opened)
        if (self._group.group and batch.nbytes <= SMALL_BATCH_BYTES and self._small < SMALL_BATCHES
                and self._small_bytes + batch.nbytes <= self.config.batch_bytes):
            batch.slot_returned = True
            self._small += 1
            self._small_bytes += batch.nbytes
            self._release_slot()
        return batch

    def track(self, task: asyncio.Task[None]) -> None:
        """The task storing a batch of this topic: `close` waits for it."""
        self._uploads.add(task)
        task.add_done_callback(self._uploads.discard)

    def finished(self, batch: _Batch) -> None:
        """The batch's object is stored and its part announced, or it failed: free its slot."""
        batch.messages.clear()   # drop the frames now, the acks are out
        if batch.slot_returned:
            self._small -= 1
            self._small_bytes -= batch.nbytes
        else:
            self._release_slot()

    def _release_slot(self) -> None:
        self._busy -= 1
        self._m_busy.set(self._busy)
        self._slots.release()

    def notification(self, batch: _Batch, loc: ObjectLocation, part: Part, created_ms: int,
                     attempt: int) -> Notification:
        """The notification of `batch`, stored as `part` of the object at `loc`."""
        headers = batch.headers
        return Notification(
            v=NOTIFICATION_VERSION, topic=self.config.name, bucket=loc.bucket, key=loc.key, size=part.size,
            header_size=part.header_size, message_count=len(headers), logmessage_count=batch.logcount,
            min_timestamp_ms=min(h.min_timestamp_ms for h in headers),
            max_timestamp_ms=max(h.max_timestamp_ms for h in headers),
            crc32c=part.crc32c, broker_id=self._broker_id, attempt=attempt,
            created_ms=created_ms, offset=part.offset)

    def announced(self, batch: _Batch, note: Notification, published: tuple[int, int] | NotifyError,
                  put_s: float, notify_s: float) -> None:
        """The batch's part is stored (`put_s`) and its notification published (or not): ack its
        ack=all Messages, or fail them naming why."""
        self._m_stage["upload"].observe(put_s)
        self._m_batch_bytes.observe(note.size)
        self._m_group_bytes.inc(note.size)
        if isinstance(published, NotifyError):   # the batch fails, the broker goes on
            self.failed(batch, AckCode.NOTIFY, f"notifying batch {note.key} of topic {note.topic} failed: "
                                               f"{published}")
            self._unannounced(note)
            return
        partition, offset = published
        self._m_stage["notify"].observe(notify_s)
        self._m_ok.inc()
        self._m_notification_bytes.inc(len(note.to_bytes()))
        for request_id, index, reply in batch.waiters:   # ack=all Messages; ack=1 ones were answered
            reply(Ack(request_id, True, AckCode.OK, "", note.bucket, note.key, index, partition, offset))
        self._recent.stored(map(message_id, batch.headers), note.bucket, note.key, partition, offset,
                            time.monotonic())

    def failed(self, batch: _Batch, code: AckCode, why: str) -> None:
        """The batch failed for good (its object's PUT, or its publish): error acks to ack=all."""
        log.warning("%s (%d Messages get error acks)", why, len(batch.headers))
        self._metrics.batches.labels(self.config.name, str(code)).inc()
        for request_id, _index, reply in batch.waiters:
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

