"""The compaction runner (I/O): reads a partition's dirty notifications and parts, plans, writes
the new parts and manifest, swaps the pointer.

Steps of one partition's run, and what a crash at each leaves (`memq.compaction.manifest`):
1. read the current pointer and manifest, the notifications [end, high watermark);
2. if due (`plan.due`), read the dirty parts and the old parts that lose a record, `plan.plan`
   (a dense topic's records numbered by counting the taken notifications from the offset the
   manifest stored for `end`, `Manifest.dense_tail`, which the new manifest stores for its own);
3. PUT the new parts, then the new manifest (a crash here: orphans, the old manifest stands);
4. swap the ZooKeeper pointer by compare-and-set: the commit point (a lost race changes nothing);
5. nothing is deleted here: the janitor releases replaced parts, old manifests and the plain
   objects wholly below `end` after its grace (`memq.compaction.release`).
Re-running after a crash at any step plans from whatever manifest stands, so it ends in the same
state. Every byte read or written first takes its share of a byte-rate budget
(`governor.compaction_mbps`), so compaction never starves produce and fetch of the store.

A broker builds its compactor (`memq.broker.server`) with its own storage handler (the requests
counted in its `memq_storage_*` metrics) and its read path (`CompactionReads`: the
notifications, and the dirty parts through its read cache); `start` runs a pass every
`governor.compaction_interval_s` over the partitions the governor's agent says are its share.
Without them (tests, benches, tools) it reads Kafka and the store directly (`DirectReads`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from memq.clock import Clock, SystemClock
from memq.config import MemqConfig, TopicConfig
from memq.errors import MemqError, NotifyError, OffsetUnknownError
from memq.format.codec import Compressors
from memq.format.notification import Notification
from memq.kafka_api.offsets import first_offset
from memq.kafka_api.records import framing_codec
from memq.kafka_api.dense import Checkpoint, PartitionBases
from memq.notify.consumer import NotificationConsumer, NotificationRecord
from memq.storage import make_storage
from memq.storage.base import Chunks, ObjectLocation
from memq.storage.naming import parse_key

from . import plan as planning
from .manifest import Manifest, ManifestCache, ManifestPointer, ManifestPointers, compaction_group
from .parts import PartRef, Survivor, encode_part, key_hash, part_survivors, plain_survivors
from .read import PartReader

log = logging.getLogger(__name__)


class Store(Protocol):
    """What the runner needs of storage (any `StorageHandler`)."""

    async def get(self, loc: ObjectLocation) -> bytes: ...

    async def get_range(self, loc: ObjectLocation, start: int, length: int) -> bytes: ...

    async def put_batch(self, topic: str, data: Chunks, *, first_request_id: int,
                        timestamp_ms: int, broker_id: str, group: str = "") -> ObjectLocation: ...


class CompactionReads(Protocol):
    """Where a compactor reads the plain log it compacts (`memq.broker.reads.Reads`, `DirectReads`)."""

    async def notes_from(self, notification_topic: str, partition: int, start: int,
                         timeout_s: float) -> list[NotificationRecord]:
        """The partition's notifications [start, high watermark) (from the first retained one if
        `start` is gone); NotifyError if they take over `timeout_s` to read."""

    async def part_bytes(self, note: Notification) -> bytes:
        """The plain part `note` names, as stored."""


class DirectReads:
    """`CompactionReads` of a compactor on its own: a Kafka consumer of its own and ranged GETs."""

    def __init__(self, config: MemqConfig, storage: Store) -> None:
        self.config = config
        self.storage = storage
        self._reader: NotificationConsumer | None = None
        self._lock = threading.Lock()

    async def notes_from(self, notification_topic: str, partition: int, start: int,
                         timeout_s: float) -> list[NotificationRecord]:
        return await asyncio.to_thread(self._notes, notification_topic, partition, start, timeout_s)

    async def part_bytes(self, note: Notification) -> bytes:
        return await self.storage.get_range(ObjectLocation(note.bucket, note.key), note.offset, note.size)

    def _notes(self, kafka_topic: str, partition: int, start: int, timeout_s: float) -> list[NotificationRecord]:
        """Blocking: run in a thread."""
        with self._lock:
            if self._reader is None:
                self._reader = NotificationConsumer(self.config.kafka, kafka_topic, fetch_wait_ms=10, partition_eof=True,
                                                    group_id=f"memq-compactor-{self.config.cluster.name}")
            c = self._reader
            try:
                c.read_topic(kafka_topic)
                high = c.watermarks(partition)[1]
                if start >= high:
                    return []
                c.assign({partition: start})
                out: list[NotificationRecord] = []
                deadline = time.monotonic() + timeout_s
                at = start
                while at < high and c.ends_reached().get(partition, -1) < high:
                    if time.monotonic() > deadline:
                        raise NotifyError(f"compaction: reading {kafka_topic}[{partition}] [{start}, {high}) "
                                          f"took over {timeout_s:g} s")
                    for r in c.poll(0.5):
                        if r.partition == partition and at <= r.offset < high:
                            out.append(r)
                            at = r.offset + 1
                c.unassign()
                return out
            except BaseException:
                c.close()
                self._reader = None
                raise

    def close(self) -> None:
        with self._lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None


class ByteBudget:
    """A token bucket of bytes per second (one second's worth of burst): `take` waits its turn."""

    def __init__(self, bytes_per_s: float, clock: Clock | None = None) -> None:
        self.rate = bytes_per_s
        self.clock = clock or SystemClock()
        self._tokens = bytes_per_s
        self._at = self.clock.monotonic()
        self.waited_s = 0.0

    async def take(self, n: int) -> None:
        now = self.clock.monotonic()
        self._tokens = min(self.rate, self._tokens + (now - self._at) * self.rate)
        self._at = now
        self._tokens -= n
        if self._tokens < 0:
            wait = -self._tokens / self.rate
            self.waited_s += wait
            await asyncio.sleep(wait)


class CompactionMetrics:
    """Per topic: dirty ratio, cleaner lag, bytes read and written, parts written, runs."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.dirty_ratio = Gauge("memq_compaction_dirty_ratio", "Share of a partition's bytes not compacted yet",
                                 ["topic", "partition"], registry=registry)
        self.lag = Gauge("memq_compaction_lag_seconds", "Age of a partition's oldest uncompacted record",
                         ["topic", "partition"], registry=registry)
        self.bytes = Counter("memq_compaction_bytes", "Bytes compaction read (dirty, old parts) and wrote (parts)",
                             ["topic", "direction"], registry=registry)
        self.objects = Counter("memq_compaction_objects", "Compacted parts written", ["topic"], registry=registry)
        self.records = Counter("memq_compaction_records", "Records compaction looked at, and kept",
                               ["topic", "what"], registry=registry)
        self.stored = Gauge("memq_compaction_stored_bytes", "Bytes of a partition's compacted parts",
                            ["topic", "partition"], registry=registry)
        self.runs = Counter("memq_compaction_runs", "Partition runs, by result (swapped, idle, lost_race, failed)",
                            ["topic", "result"], registry=registry)

    def forget(self, topic: str, partition: int) -> None:
        """Drop a partition's gauges: another broker compacts it now and reports them."""
        for gauge in (self.dirty_ratio, self.lag, self.stored):
            try:
                gauge.remove(topic, str(partition))
            except KeyError:
                pass


#: The dense offset where a partition's notification starts, as the broker counts it (`memq.broker.bases`).
BaseOf = Callable[[TopicConfig, int, int], Awaitable[int]]

#: A test's fault injection: called with each step's name ("parts_put", "manifest_put", "swapped").
Step = Callable[[str], None]


@dataclass(frozen=True)
class Outcome:
    """What one partition's run did."""

    topic: str
    partition: int
    result: str                   # swapped | idle | lost_race
    manifest: Manifest | None     # the manifest that stands after the run
    due: planning.Due | None
    read_bytes: int = 0
    written_bytes: int = 0


class Compactor:
    """Compacts the partitions of compacted topics; each broker runs one over the partitions
    `plan.compactor_of` gives it (its share, told by `memq.governor.agent`). `storage` and
    `reads`: the broker's (default: a storage handler and `DirectReads` of its own)."""

    def __init__(self, config: MemqConfig, pointers: ManifestPointers, registry: CollectorRegistry, *,
                 storage: Store | None = None, reads: CompactionReads | None = None, clock: Clock | None = None,
                 step: Step | None = None, broker_id: str = "compactor", base_of: BaseOf | None = None) -> None:
        self.config = config
        self.base_of = base_of
        self.pointers = pointers
        self.storage: Store = storage or make_storage(config)
        self._own_reads: DirectReads | None = None   # closed by `close`; the broker closes its own
        if reads is None:
            reads = self._own_reads = DirectReads(config, self.storage)
        self.reads: CompactionReads = reads
        self.clock = clock or SystemClock()
        self.metrics = CompactionMetrics(registry)
        self.budget = ByteBudget(config.governor.compaction_mbps * 1e6, self.clock)
        self.manifests = ManifestCache(self.storage)
        self.parts = PartReader(self.storage)
        self.step = step or (lambda _: None)
        self.broker_id = broker_id
        self.timeout_s = config.governor.janitor_timeout_s
        self._comp = Compressors()
        self._requests = 0
        self._reported: set[tuple[str, int]] = set()   # partitions whose gauges this compactor set
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _now_ms(self) -> int:
        return int(self.clock.time() * 1000)

    def start(self, topics: Callable[[], Mapping[str, TopicConfig]], mine: Callable[[str, int], bool]) -> None:
        """Every `governor.compaction_interval_s` until `close`, a pass (`run_once`) over the
        partitions of `topics()` that are `mine` (the share the governor's agent gives it)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._passes(topics, mine), name="memq-compactor")

    async def _passes(self, topics: Callable[[], Mapping[str, TopicConfig]], mine: Callable[[str, int], bool]) -> None:
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), self.config.governor.compaction_interval_s)
                return
            except TimeoutError:
                pass
            try:
                await self.run_once(topics(), mine)
            except MemqError as e:
                log.warning("compaction pass of broker %s failed, retrying next pass: %s", self.broker_id, e)
            except Exception:   # the loop must outlive any one failure: compaction depends on it
                log.exception("compaction pass of broker %s failed, retrying next pass", self.broker_id)

    async def run_once(self, topics: Mapping[str, TopicConfig], mine: Callable[[str, int], bool] = lambda t, p: True,
                       *, force: bool = False) -> list[Outcome]:
        """One pass over the partitions of compacted topics that are `mine(topic, partition)` (asked
        again before each: the cluster view may change during a pass); a failing partition is logged
        and counted. The gauges of a partition no longer this compactor's are dropped, so the cost
        view reads each partition from the broker that compacts it now."""
        out: list[Outcome] = []
        ran: set[tuple[str, int]] = set()
        for name, cfg in sorted(topics.items()):
            if not cfg.compacted:
                continue
            for p in range(cfg.read_partitions):
                if not mine(name, p):
                    continue
                ran.add((name, p))
                try:
                    out.append(await self.partition(cfg, p, force=force))
                except (MemqError, TimeoutError) as e:
                    self.metrics.runs.labels(name, "failed").inc()
                    log.warning("compaction: %s/%d failed, retrying next pass: %s", name, p, e)
        for name, p in self._reported - ran:
            self.metrics.forget(name, p)
        self._reported = ran
        return out

    async def partition(self, cfg: TopicConfig, partition: int, *, force: bool = False) -> Outcome:
        """Compact one partition if due (or `force` and anything is cleanable)."""
        topic = cfg.name
        pointer = await asyncio.to_thread(self.pointers.read, topic, partition)
        old = await self.manifests.load(pointer) if pointer else None
        end = pointer.end if pointer else 0
        notes = await self.reads.notes_from(cfg.notification_topic_for(self.config.cluster.name), partition, end,
                                            self.timeout_s)
        now = self._now_ms()
        dirty_notes = [planning.DirtyNote(r.offset, r.notification.max_timestamp_ms, r.notification.size)
                       for r in notes]
        clean = old.size if old else 0
        verdict = planning.due(cfg, clean, dirty_notes, now)
        self.metrics.dirty_ratio.labels(topic, str(partition)).set(verdict.dirty_ratio)
        self.metrics.lag.labels(topic, str(partition)).set(verdict.lag_ms / 1000)
        self.metrics.stored.labels(topic, str(partition)).set(clean)    # a new governor's too, before its first swap
        take = planning.cleanable(dirty_notes, now, cfg.min_compaction_lag_ms)
        if not take or not (verdict.due or force):
            self.metrics.runs.labels(topic, "idle").inc()
            return Outcome(topic, partition, "idle", old, verdict)
        taken, rest = notes[:take], notes[take:]
        bases = await self.dense_bases(cfg, partition, old, end, taken)
        read = 0
        dirty: list[Survivor] = []
        for r in taken:
            got, size = await self._dirty_records(cfg, r, first_offset(r.offset) if bases is None else bases.base(r.offset))
            dirty.extend(got)
            read += size
        hashes = {key_hash(s.key) for s in dirty}
        olds: list[tuple[PartRef, Sequence[Survivor] | None]] = []
        for part in (old.parts if old else ()):
            _, index = await self.parts.meta(part)
            hit = index.has_any(hashes)
            if planning.untouched(cfg, part.min_timestamp_ms, part.tombstones, hit, now):
                olds.append((part, None))
                continue
            await self.budget.take(part.size)
            read += part.size
            olds.append((part, part_survivors(await self.storage.get_range(part.location, 0, part.size))))
        result = planning.plan(cfg, olds, dirty, now)
        self.metrics.bytes.labels(topic, "read").inc(read)
        self.metrics.records.labels(topic, "read").inc(result.records_in)
        refs: list[PartRef] = []
        written = 0
        for seg in result.segments:
            if isinstance(seg, planning.Keep):
                refs.append(seg.part)
                continue
            encoded = await asyncio.to_thread(encode_part, seg.survivors, broker_id=self.broker_id, created_ms=now)
            size = sum(len(c) for c in encoded.chunks)
            await self.budget.take(size)
            loc = await self._put(topic, encoded.chunks, now)
            refs.append(encoded.ref(loc))
            written += size
            self.metrics.objects.labels(topic).inc()
        self.metrics.bytes.labels(topic, "written").inc(written)
        self.metrics.records.labels(topic, "kept").inc(result.written)
        self.step("parts_put")
        new_end = taken[-1].offset + 1
        floor = min([now - round(self.config.governor.orphan_grace_s * 1000)]
                    + [_object_ms(r) for r in rest])
        manifest = Manifest(topic, partition, new_end, (pointer.version + 1) if pointer else 1, now, tuple(refs),
                            pointer.key if pointer else None, floor,
                            {"records_in": result.records_in, "survivors": result.survivors,
                             "tombstones": result.tombstones, "dropped_tombstones": result.dropped_tombstones,
                             "expired": result.expired, "read_bytes": read, "written_bytes": written},
                            None if bases is None else bases.base(new_end))
        loc = await self._put(topic, [manifest.to_json()], now)
        self.step("manifest_put")
        new = ManifestPointer(loc.bucket, loc.key, new_end, manifest.version)
        if not await asyncio.to_thread(self.pointers.swap, topic, partition, pointer, new):
            self.metrics.runs.labels(topic, "lost_race").inc()
            log.warning("compaction: %s/%d: another run swapped the manifest first; this run's objects are orphans",
                        topic, partition)
            return Outcome(topic, partition, "lost_race", old, verdict, read, written)
        self.step("swapped")
        self.metrics.stored.labels(topic, str(partition)).set(manifest.size)
        self.metrics.dirty_ratio.labels(topic, str(partition)).set(      # as it stands now: the cost view reads both
            planning.dirty_ratio(manifest.size, sum(r.notification.size for r in rest)))
        self.metrics.runs.labels(topic, "swapped").inc()
        log.info("compaction: %s/%d: notifications [%d, %d) and %d old parts -> %d parts, %d survivors "
                 "(%d tombstones dropped), read %d B, wrote %d B", topic, partition, end, new_end,
                 len(old.parts) if old else 0, len(refs), result.survivors, result.dropped_tombstones, read, written)
        return Outcome(topic, partition, "swapped", manifest, verdict, read, written)

    async def _put(self, topic: str, chunks: list, now_ms: int) -> ObjectLocation:
        self._requests += 1
        return await self.storage.put_batch(topic, chunks, first_request_id=(time.time_ns() + self._requests) % 2**64,
                                            timestamp_ms=now_ms, broker_id=self.broker_id,
                                            group=compaction_group(topic))

    async def dense_bases(self, cfg: TopicConfig, partition: int, old: Manifest | None, end: int,
                     taken: Sequence[NotificationRecord]) -> PartitionBases | None:
        """A dense topic's bases of the notifications a run takes (None: sparse offsets): counted
        from the base of `end` the manifest stored (0 at notification 0), else, when retention took
        notifications after `end`, from the broker's count (`base_of`)."""
        if cfg.offsets != "dense" or not taken:
            return None
        first = taken[0].offset
        if first == end:
            at = Checkpoint(end, old.tail_offset if old is not None else 0)
        elif self.base_of is not None:
            at = Checkpoint(first, await self.base_of(cfg, partition, first))
        else:
            raise OffsetUnknownError(f"compaction of {cfg.name}/{partition}: notifications [{end}, {first}) expired "
                                     "and no count of the partition's offsets to start from")
        bases = PartitionBases(at)
        bases.add((r.offset, r.notification.logmessage_count) for r in taken)
        return bases

    async def _dirty_records(self, cfg: TopicConfig, r: NotificationRecord, first: int) -> tuple[list[Survivor], int]:
        """The records of the part notification `r` names, from Kafka offset `first` on, null values
        and codecs kept (memq's own records in the topic's framing codec, as Kafka readers get them)."""
        n = r.notification
        await self.budget.take(n.size)
        obj = await self.reads.part_bytes(n)
        own = framing_codec(cfg, self.config.broker)
        return await asyncio.to_thread(plain_survivors, first, obj, self._comp, own_codec=own), len(obj)

    async def close(self) -> None:
        """Stop the passes (`start`; one under way is waited for, bounded) and release what it owns."""
        self._stop.set()
        if self._task is not None:
            # a flag, not cancel(): wait_for() in 3.11 can swallow a cancel racing a wake-up
            _, pending = await asyncio.wait({self._task}, timeout=10)
            for task in pending:   # a pass stopped mid-way leaves what a crash would: old or new
                task.cancel()
            self._task = None
        if self._own_reads is not None:
            await asyncio.to_thread(self._own_reads.close)


def _object_ms(r: NotificationRecord) -> int:
    """The time stamped in the key of the object a notification names (its created time if not memq's)."""
    try:
        return parse_key(r.notification.key).timestamp_ms
    except MemqError:
        return r.notification.created_ms
