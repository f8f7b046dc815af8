"""The read path of the broker core: a topic's records by notification, for the Kafka fetch door.

A Kafka partition of a memq topic is its notification partition (`memq.kafka_api.offsets`), so
reading means: follow the notification partition (`PartitionTail`: one assigned consumer per
partition read through this broker, with its most recent notifications in memory, so the
readers at the tail, of any number of groups, share one Kafka fetch; a notification this broker
publishes lands there at once, `published`), then fetch each part
through the hot-object cache (`ReadCache`: what this broker just stored, or one ranged GET per
part however many readers want it), framed once as Kafka RecordBatches (`kafka_api.records`) in the topic's codec (`framing_codec`),
without the Messages already announced shortly before in its partition (`kafka_api.dedup`:
their ids are kept per part in the cache, so a reader at the tail costs no extra GET).

A compacted topic's partition starts with its compacted prefix (`memq.compaction`): the parts its
current manifest lists hold notifications [0, end) as Kafka RecordBatches with their original
offsets; `manifest` names it (the ZooKeeper pointer, given by `use_manifests`, then the manifest
object), `compacted_batches` reads a part's batches from an offset, by ranged GETs through the
same cache (the part's header and key index once, then a Message a GET).

The broker's compactor reads through here too (`memq.compaction.run.CompactionReads`): a
partition's notifications from the compacted end (`notes_from`, on a consumer of their own, so
the tails stay where their readers are) and the dirty parts through the cache (`part_bytes`).

What these reads say of a partition's log (its start, its end, the segments to read) is worked
out by the partition log model (`memq.log.model`), fed from here by `logs.Logs`.

Blocking Kafka calls run on this object's own threads, so a long poll at the tail never
starves the event loop's default executor; a tail's consumer is used by one call at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from itertools import accumulate
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from crc32c import crc32c

from memq.compaction.manifest import Manifest, ManifestCache, ManifestPointers
from memq.compaction.parts import PartRef
from memq.compaction.read import PartReader
from memq.config import BrokerConfig, KafkaConfig
from memq.errors import CorruptDataError, FormatError, NotifyError, ObjectNotFoundError, OffsetOutOfRangeError
from memq.format import Notification
from memq.format.kafka_records import KafkaCodec
from memq.kafka_api.dedup import WINDOW_NOTES, PartMessage, duplicates, part_messages
from memq.kafka_api.records import FramedPart, frame_part, framing_codec
from memq.notify.consumer import NotificationConsumer, NotificationRecord
from memq.storage import ObjectLocation, StorageHandler

from .metrics import BrokerMetrics
from .read_cache import ReadCache

log = logging.getLogger(__name__)

T = TypeVar("T")
RING_NOTES = 1024          # recent notifications a tail keeps in memory
MAX_TAILS = 256            # partitions followed at once; the least recently read is closed beyond
NOTES_PER_POLL = 500
THREADS = 64               # blocking Kafka calls in flight (long polls hold one each)
READ_INTEREST_S = 60.0     # a topic read through this broker this recently keeps the parts it stores (`wants`)
TAIL_FETCH_WAIT_MS = 20    # how long the notification Kafka holds a tail's fetch: the latency it adds to
                           # notifications other brokers publish (this broker's own land at once)
WINDOW_WAIT_S = 5.0        # reading a dedup window's notifications (they exist: never a long wait)

ConsumerFactory = Callable[[str], NotificationConsumer]   # for a notification topic
Compression = Callable[[str], KafkaCodec]                # a memq topic's framing codec


class PartitionTail:
    """One notification partition, followed by one assigned consumer; its recent notes in memory.

    One Kafka poll runs at a time (`_polling`); readers wait for notes to land in the ring,
    from that poll or from `offer` (what this broker itself just published), whichever is first."""

    def __init__(self, consumer: NotificationConsumer, partition: int, run: Callable[..., Any]) -> None:
        self._consumer = consumer
        self.partition = partition
        self._run = run
        self._ring: deque[NotificationRecord] = deque(maxlen=RING_NOTES)
        self._position: int | None = None   # the offset after the ring's last note
        self._skipped: deque[int] = deque(maxlen=RING_NOTES)   # offsets of bad notifications
        self._marks: tuple[int, int] | None = None   # watermarks as the last poll left them
        self._polling: asyncio.Task[None] | None = None
        # done when notes next land in the ring; taken synchronously by each waiting read, so a
        # landing between a read's look at the ring and its wait cannot be missed (a pulsed
        # Event was: its waiter registers only when its task first runs)
        self._landed: asyncio.Future[None] | None = None

    @property
    def busy(self) -> bool:
        return self._polling is not None and not self._polling.done()

    def _cached(self, offset: int, limit: int) -> list[NotificationRecord] | None:
        ring = self._ring
        if ring and ring[0].offset <= offset <= ring[-1].offset:
            return [r for r in ring if r.offset >= offset][:limit]
        return None

    def offer(self, record: NotificationRecord) -> None:
        """A notification just published to this partition: into the ring now when it is the
        next one the tail expects (else the tail's Kafka poll brings it, in order)."""
        if record.offset == self._position:
            self._land([record])

    def _land(self, got: list[NotificationRecord]) -> None:
        """Notes from Kafka or `offer`; those the ring has already (offered ones the consumer
        returns again) are dropped."""
        got = [r for r in got if r.partition == self.partition
               and (self._position is None or r.offset >= self._position)]
        if got:
            self._ring.extend(got)
            self._position = got[-1].offset + 1
            if self._landed is not None:
                if not self._landed.done():
                    self._landed.set_result(None)
                self._landed = None

    async def read(self, offset: int, wait_s: float, limit: int = NOTES_PER_POLL) -> list[NotificationRecord]:
        """Notifications from `offset` on (at most `limit`), waiting up to `wait_s` for the first
        when there is none yet; with `wait_s` 0 never waiting, not even for another read's poll.
        OffsetOutOfRangeError when `offset` is outside the partition."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            while offset in self._skipped:
                offset += 1
            hit = self._cached(offset, limit)
            if hit:
                return hit
            left = deadline - loop.time()
            if self.busy:   # a read is already waiting on Kafka (an earlier long poll): what it gets lands here
                if left <= 0:
                    return []
                await self._until_landed(self._polling, left)   # type: ignore[arg-type]  # busy: set
            else:
                poll = self._polling = loop.create_task(self._poll(offset, max(left, 0.0)))
                poll.add_done_callback(_retrieved)
                if left > 0:
                    await self._until_landed(poll, left)
                else:
                    await asyncio.shield(poll)
                if poll.done():   # this read's own poll: its OffsetOutOfRangeError is this read's
                    poll.result()
                    if left <= 0:
                        return self._cached(offset, limit) or []
                    # A poll ends early with nothing (librdkafka's end-of-partition event): wait on,
                    # or a note this broker publishes a moment later waits for the next Fetch (up
                    # to a fetch wait more of end-to-end latency); one poll a Kafka fetch wait at most
                    if not self._cached(offset, limit):
                        await self._until_landed(None, min(deadline - loop.time(), TAIL_FETCH_WAIT_MS / 1000))
            if loop.time() >= deadline:
                return self._cached(offset, limit) or []

    async def _until_landed(self, poll: asyncio.Task[None] | None, timeout_s: float) -> None:
        """Until notes land, `poll` (if any) ends or `timeout_s` passed."""
        if self._landed is None:
            self._landed = asyncio.get_running_loop().create_future()
        waits = (self._landed,) if poll is None else (poll, self._landed)
        await asyncio.wait(waits, timeout=max(timeout_s, 0.0), return_when=asyncio.FIRST_COMPLETED)

    async def _poll(self, offset: int, wait_s: float) -> None:
        """One Kafka poll from `offset`, its notes into the ring."""
        if self._position != offset:
            await self._run(self._consumer.assign, {self.partition: offset})
            self._ring.clear()
            self._position = offset
        try:
            got: list[NotificationRecord] = await self._run(self._consumer.poll, wait_s, NOTES_PER_POLL)
            # librdkafka's cached watermarks wait on its locks while a poll runs: never on the loop
            self._marks = await self._run(self._consumer.cached_watermarks, self.partition) or self._marks
        except OffsetOutOfRangeError:
            self._position = None
            raise
        except FormatError as e:   # not a notification: skip it, as memq's Consumer does (data-loss policy)
            bad = offset if self._position is None else self._position
            self._skipped.append(bad)
            log.warning("skipping a bad notification at offset %s of partition %d: %s", bad, self.partition, e)
            await self._run(self._consumer.assign, {self.partition: bad + 1})
            self._position = bad + 1
            return
        self._land(got)

    def last(self) -> NotificationRecord | None:
        """The most recent notification this tail read."""
        return self._ring[-1] if self._ring else None

    def watermarks(self) -> tuple[int, int] | None:
        """(first, next) notification offsets as the last fetch saw them, None before one."""
        marks = self._marks
        if self._position is not None:
            low, high = marks or (-1, 0)
            return low, max(high, self._position)
        return marks

    def close(self) -> None:
        self._consumer.close()


def _retrieved(task: asyncio.Task[None]) -> None:
    """A poll's error belongs to the read that started it; one that read gave up on is dropped."""
    if not task.cancelled():
        task.exception()


class Reads:
    """What a fetch door asks of the core. `consumers` makes a notification topic's consumer
    (default: an assigned `NotificationConsumer`, auto.offset.reset = error); `compression`
    gives a topic's framing codec (default: the broker default's)."""

    def __init__(self, kafka: KafkaConfig, storage: StorageHandler, cache: ReadCache, metrics: BrokerMetrics,
                 *, broker_id: str, consumers: ConsumerFactory | None = None,
                 compression: Compression | None = None) -> None:
        self._storage = storage
        self._compression = compression or (lambda _topic: framing_codec(None, BrokerConfig()))
        self.cache = cache
        self._m = metrics
        self._consumers = consumers or (lambda topic: NotificationConsumer(
            kafka, topic, group_id=f"memq-broker-{broker_id}-reads", auto_offset_reset="error",
            fetch_wait_ms=TAIL_FETCH_WAIT_MS))
        self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="memq-reads")
        self._tails: OrderedDict[tuple[str, int], PartitionTail] = OrderedDict()
        self._opening: dict[tuple[str, int], asyncio.Task[PartitionTail]] = {}
        self._lookup: NotificationConsumer | None = None   # ListOffsets: watermarks, offsets for times
        self._lookup_lock = asyncio.Lock()
        self._history: NotificationConsumer | None = None   # notifications far behind the tails (compaction)
        self._history_lock = asyncio.Lock()
        self._pointers: ManifestPointers | None = None    # compacted prefixes: none without ZooKeeper
        self._manifests = ManifestCache(storage)
        self._parts = PartReader(_CachedRanges(storage, cache))
        self._read_at: dict[str, float] = {}   # topic -> when a reader last asked this broker for its parts
        self._raw_read_at: dict[str, float] = {}   # ... a memq Consumer, which reads parts as stored

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # --- notifications -------------------------------------------------------------------------

    async def notes(self, notification_topic: str, partition: int, offset: int, wait_s: float
                    ) -> list[NotificationRecord]:
        """The partition's notifications from `offset`, waiting up to `wait_s` for one."""
        tail = await self._tail(notification_topic, partition)
        return await tail.read(offset, wait_s)

    def published(self, notification_topic: str, partition: int, offset: int, note: Notification) -> None:
        """A notification this broker just published: readers waiting at that partition's tail
        get it now, not a Kafka round trip later when the tail's own fetch brings it back."""
        tail = self._tails.get((notification_topic, partition))
        if tail is not None:
            tail.offer(NotificationRecord(partition, offset, int(time.time() * 1000), note))

    def watermarks_seen(self, notification_topic: str, partition: int) -> tuple[int, int] | None:
        """(first, next) notification offsets as this broker's tail last saw them (no Kafka call)."""
        tail = self._tails.get((notification_topic, partition))
        return None if tail is None else tail.watermarks()

    def last_seen(self, notification_topic: str, partition: int) -> NotificationRecord | None:
        """The most recent notification this broker's tail of the partition read (no Kafka call)."""
        tail = self._tails.get((notification_topic, partition))
        return None if tail is None else tail.last()

    async def watermarks(self, notification_topic: str, partition: int) -> tuple[int, int]:
        """(first, next) notification offsets, asked of Kafka."""
        async with self._lookup_lock:
            lookup = await self._lookup_of(notification_topic)
            return await self._run(lookup.watermarks, partition)

    async def offsets_for_time(self, notification_topic: str, ts_ms: int) -> dict[int, int]:
        """Per partition, the first notification published at or after `ts_ms` (or the end)."""
        async with self._lookup_lock:
            lookup = await self._lookup_of(notification_topic)
            return await self._run(lookup.offsets_for_times, ts_ms)

    async def notes_from(self, notification_topic: str, partition: int, start: int, timeout_s: float
                         ) -> list[NotificationRecord]:
        """The partition's notifications [start, high watermark), from the first retained one if
        `start` is gone (the compactor's dirty log); NotifyError past `timeout_s`."""
        async with self._history_lock:
            if self._history is None:
                self._history = await self._run(self._consumers, notification_topic)
            return await self._run(_read_range, self._history, notification_topic, partition, start, timeout_s)

    async def _lookup_of(self, topic: str) -> NotificationConsumer:
        if self._lookup is None:
            self._lookup = await self._run(self._consumers, topic)
        elif self._lookup.topic != topic:
            await self._run(self._lookup.read_topic, topic)
        return self._lookup

    async def _tail(self, topic: str, partition: int) -> PartitionTail:
        key = (topic, partition)
        tail = self._tails.get(key)
        if tail is not None:
            self._tails.move_to_end(key)
            return tail
        task = self._opening.get(key)
        if task is None:
            task = self._opening[key] = asyncio.get_running_loop().create_task(self._open(key))
        return await asyncio.shield(task)

    async def _open(self, key: tuple[str, int]) -> PartitionTail:
        try:
            consumer = await self._run(self._consumers, key[0])
            tail = self._tails[key] = PartitionTail(consumer, key[1], self._run)
            idle = [k for k, t in self._tails.items() if not t.busy][:max(len(self._tails) - MAX_TAILS, 0)]
            for k in idle:
                await self._run(self._tails.pop(k).close)
            return tail
        finally:
            del self._opening[key]

    # --- compacted prefixes ------------------------------------------------------------------

    def use_manifests(self, pointers: ManifestPointers) -> None:
        """Read compacted topics' prefixes through these ZooKeeper pointers."""
        self._pointers = pointers

    async def manifest(self, topic: str, partition: int) -> Manifest | None:
        """The current manifest of a compacted topic's partition; None before its first compaction
        (or without ZooKeeper). The pointer is cached (a watch refreshes it), the manifest by key."""
        if self._pointers is None:
            return None
        pointer = await self._run(self._pointers.get, topic, partition)
        return None if pointer is None else await self._manifests.load(pointer)

    async def compacted_batches(self, part: PartRef, offset: int) -> AsyncIterator[memoryview]:
        """A compacted part's RecordBatches as stored (original offsets), from the one holding
        the first survivor at or after Kafka `offset`."""
        async for batch in self._parts.batches_from(part, offset):
            yield batch

    # --- parts ---------------------------------------------------------------------------------

    def wants(self, topic: str) -> bool:
        """Whether a part of `topic` this broker just stored is worth keeping (`stored`): a reader,
        Kafka's or memq's Consumer, asked this broker for the topic's parts in the last
        `READ_INTEREST_S`. A broker nobody reads from pays no copy (`bench produce`: broker CPU per
        GiB 1.32 s without keeping parts, 1.68 s keeping every one); the first read after a quiet
        spell costs a GET."""
        at = self._read_at.get(topic)
        return at is not None and time.monotonic() - at < READ_INTEREST_S

    def _reading(self, topic: str) -> None:
        self._read_at[topic] = time.monotonic()

    def _raw_wanted(self, topic: str) -> bool:
        """Whether memq Consumers read `topic`'s parts as stored through this broker lately: then
        a part framed for Kafka readers keeps its stored bytes too (else a second GET for them)."""
        at = self._raw_read_at.get(topic)
        return at is not None and time.monotonic() - at < READ_INTEREST_S

    def stored(self, loc: ObjectLocation, offset: int, part: bytes) -> None:
        """A part this broker just stored, for readers at the tail (`wants`)."""
        self.cache.put(("part", loc.bucket, loc.key, offset), part, len(part))

    async def readable(self, notification_topic: str, partition: int, n: NotificationRecord) -> FramedPart:
        """The part `n` announces as a Kafka reader gets it: without its Messages announced
        earlier in the partition's window (`kafka_api.dedup`), the same on every broker."""
        return await self.part(n.notification, await self._drops(notification_topic, partition, n))

    async def delivered(self, notification_topic: str, partition: int, n: NotificationRecord
                        ) -> list[tuple[int, PartMessage]]:
        """(index of its first record, Message) of each Message of `n`'s part a Kafka reader gets."""
        messages = await self._messages(n.notification, keep_raw=False)
        drop = await self._drops(notification_topic, partition, n)
        firsts = accumulate((m.records for m in messages), initial=0)
        return [(first, m) for i, (first, m) in enumerate(zip(firsts, messages)) if i not in drop]

    async def end(self, notification_topic: str, partition: int, last: NotificationRecord) -> tuple[int, int]:
        """Where the last record a reader gets up to `last`'s part is: (its notification, the
        records of that part up to and with it), the partition log's end (`logs.Logs` makes it
        an offset). Copies dropped at the end lie past it, as no reader's position ever moves
        there. Looks back over parts that are copies alone (at most a window's worth)."""
        n = last
        for _ in range(WINDOW_NOTES):
            messages = await self._messages(n.notification, keep_raw=True)   # readers frame it next: keep it
            drop = await self._drops(notification_topic, partition, n)
            kept = [i for i in range(len(messages)) if i not in drop]
            if kept:
                return n.offset, sum(m.records for m in messages[:kept[-1] + 1])
            earlier = await self.notes_between(notification_topic, partition, n.offset - 1, n.offset)
            if not earlier:
                break
            n = earlier[0]
        return n.offset, 0

    async def _drops(self, notification_topic: str, partition: int, n: NotificationRecord) -> frozenset[int]:
        drop: frozenset[int] = await self.cache.get(
            ("drops", notification_topic, partition, n.offset),
            lambda: self._find_drops(notification_topic, partition, n))
        return drop

    async def _find_drops(self, notification_topic: str, partition: int, n: NotificationRecord
                          ) -> tuple[frozenset[int], int]:
        mine = [m.id for m in await self._messages(n.notification, keep_raw=True)]   # framed next: stays cached
        earlier = await self.notes_between(notification_topic, partition, n.offset - WINDOW_NOTES, n.offset)
        drop = duplicates([[m.id for m in await self._earlier_messages(e.notification)] for e in earlier], mine)
        return drop, 64 + 8 * len(drop)

    async def _earlier_messages(self, note: Notification) -> tuple[PartMessage, ...]:
        """A window part's Messages; none when it is gone (retention) or damaged, which every
        broker finds alike: such a part must not stop the reading of the parts after it."""
        try:
            return await self._messages(note, keep_raw=False)
        except (ObjectNotFoundError, FormatError):
            return ()

    async def notes_between(self, notification_topic: str, partition: int, start: int, end: int
                            ) -> list[NotificationRecord]:
        """The partition's notifications at offsets [start, end) that are still retained."""
        tail = await self._tail(notification_topic, partition)
        marks = tail.watermarks()
        at = max(start, marks[0] if marks else 0, 0)
        out: list[NotificationRecord] = []
        while at < end:
            try:
                got = [r for r in await tail.read(at, WINDOW_WAIT_S) if r.offset < end]
            except OffsetOutOfRangeError:   # retention took the start meanwhile
                got = []
            if not got:
                break
            out += got
            at = got[-1].offset + 1
        return out

    async def _messages(self, note: Notification, *, keep_raw: bool) -> tuple[PartMessage, ...]:
        where = (note.bucket, note.key, note.offset)
        return await self.cache.get(("messages", *where), lambda: self._load_messages(note, keep_raw))

    async def _load_messages(self, note: Notification, keep_raw: bool) -> tuple[tuple[PartMessage, ...], int]:
        raw_key = ("part", note.bucket, note.key, note.offset)
        loaded = self.cache.peek(raw_key) is None
        messages = part_messages(await self._raw(note))
        if loaded and not keep_raw:   # got for its Messages only (a part before the reader)
            self.cache.discard(raw_key)
        return messages, 64 + 96 * len(messages)

    async def part(self, note: Notification, drop: frozenset[int] = frozenset()) -> FramedPart:
        """The part `note` announces, as Kafka RecordBatches in its topic's codec without the
        Messages at the indexes in `drop` (CorruptDataError if damaged). Framed per codec: a
        topic whose codec changed is framed anew."""
        where = (note.bucket, note.key, note.offset)
        codec = self._compression(note.topic)
        self._reading(note.topic)
        return await self.cache.get(("framed", *where, drop, codec), lambda: self._frame(note, drop, codec))

    async def _raw(self, note: Notification) -> bytes:
        """The part's bytes (one GET however many ask), checked against its notification."""
        raw: bytes = await self.cache.get(("part", note.bucket, note.key, note.offset), lambda: self._get(note))
        if len(raw) != note.size or crc32c(raw) != note.crc32c:
            raise CorruptDataError(f"part {note.key} @{note.offset} of topic {note.topic}: size or CRC32C "
                                   "differs from its notification")
        return raw

    async def part_bytes(self, note: Notification) -> bytes:
        """The part `note` names as stored (checked against it), for the compactor: from the cache
        when a reader or this broker's write put it there, else one GET (shared with readers asking
        meanwhile) that is not kept: an old part read once must not push hot ones out."""
        key = ("part", note.bucket, note.key, note.offset)
        loaded = self.cache.peek(key) is None
        raw = await self._raw(note)
        if loaded:
            self.cache.discard(key)
        return raw

    async def _frame(self, note: Notification, drop: frozenset[int], codec: KafkaCodec) -> tuple[FramedPart, int]:
        raw = await self._raw(note)
        framed = (await asyncio.to_thread(frame_part, raw, drop, codec) if len(raw) > 64 * 1024
                  else frame_part(raw, drop, codec))
        if not self._raw_wanted(note.topic):   # framed once: the batches are what Kafka readers get
            self.cache.discard(("part", note.bucket, note.key, note.offset))
        return framed, framed.nbytes

    async def part_range(self, topic: str, loc: ObjectLocation, offset: int, size: int) -> bytes:
        """Bytes [offset, offset + size) of a part of `topic` for memq's own Consumer
        (`doors.read`): the part this broker just stored, else one GET however many ask. Kept
        under its size too, so a caller naming a wrong size gets (and caches) only its own
        answer, never what the Kafka path reads as the part; the caller checks the bytes against
        its notification."""
        self._reading(topic)
        self._raw_read_at[topic] = time.monotonic()
        stored = ("part", loc.bucket, loc.key, offset)
        hit = self.cache.peek(stored)
        if hit is not None and len(hit) == size:
            return await self.cache.get(stored, lambda: self._get_range(loc, offset, size))   # a hit: bumped
        got: bytes = await self.cache.get(("range", loc.bucket, loc.key, offset, size),
                                          lambda: self._get_range(loc, offset, size))
        return got

    async def _get_range(self, loc: ObjectLocation, offset: int, size: int) -> tuple[bytes, int]:
        data = await self._storage.get_range(loc, offset, size)
        self._m.read_gets.inc()
        self._m.read_get_bytes.inc(len(data))
        return data, len(data)

    async def _get(self, note: Notification) -> tuple[bytes, int]:
        return await self._get_range(ObjectLocation(note.bucket, note.key), note.offset, note.size)

    async def close(self) -> None:
        tails = list(self._tails.values())
        self._tails.clear()
        for t in tails:
            await self._run(t.close)
        if self._lookup is not None:
            await self._run(self._lookup.close)
        if self._history is not None:
            await self._run(self._history.close)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _read_range(consumer: NotificationConsumer, topic: str, partition: int, start: int, timeout_s: float
                ) -> list[NotificationRecord]:
    """Blocking: notifications [start, high watermark) of `topic`'s `partition` (`Reads.notes_from`)."""
    if consumer.topic != topic:
        consumer.read_topic(topic)
    low, high = consumer.watermarks(partition)
    at = max(start, low)
    out: list[NotificationRecord] = []
    if at >= high:
        return out
    consumer.assign({partition: at})
    deadline = time.monotonic() + timeout_s
    try:
        # done at `high`, or once the position passed it (offsets a notification topic skips)
        while at < high and (consumer.position([partition]).get(partition) or at) < high:
            if time.monotonic() > deadline:
                raise NotifyError(f"reading {topic}[{partition}] [{start}, {high}) took over {timeout_s:g} s")
            for r in consumer.poll(0.5):
                if r.partition == partition and at <= r.offset < high:
                    out.append(r)
                    at = r.offset + 1
    finally:
        consumer.unassign()
    return out


class _CachedRanges:
    """Ranged GETs of compacted parts through the read cache: one GET per range however many
    readers want it (a part's objects are immutable)."""

    def __init__(self, storage: StorageHandler, cache: ReadCache) -> None:
        self._storage = storage
        self._cache = cache

    async def get_range(self, loc: ObjectLocation, start: int, length: int) -> bytes:
        async def load() -> tuple[bytes, int]:
            data = await self._storage.get_range(loc, start, length)
            return data, len(data)
        got: bytes = await self._cache.get(("compacted", loc.bucket, loc.key, start, length), load)
        return got
