"""The janitor: retention and orphan collection, run by the elected governor only.

Every `governor.janitor_interval_s`, while this process is the governor, for each topic:
1. the notification topic's `retention.ms` is set to the topic's `retention_ms` if Kafka
   reports another value (topics created by a broker's config file, or altered);
2. notifications published before the pointer cutoff (`retention_ms`, or the oldest beyond
   `retention_bytes`) expire: Kafka's `retention.ms` drops them, and the janitor advances each
   partition's start with DeleteRecords so expiry is exact (segments make `retention.ms` late);
3. objects stamped `governor.retention_grace_s` before that cutoff are deleted in bulk, and
   never one older than what the first retained notification of a partition names, so an
   object goes only after its pointers;
4. orphans: objects `governor.orphan_grace_s` old (no later than that can a publish land) that
   no notification names (failed notifies, superseded attempts) are deleted too, in sweeps at
   most once per grace, each over the objects stamped since the last sweep (a new janitor
   starts one grace back), so memory and LISTs stay bounded; an orphan no sweep saw (a
   failover) goes with retention. An object a pending entry of an open transaction names
   (`held`, memq.broker.txn: stored, published only at its commit) is never an orphan.

Brokers that ignore `retention.ms` or lack DeleteRecords (tansu 0.6 does both) keep expired
notifications readable: they name deleted objects, which readers report as expired data.

Leadership: the loop runs in every broker's agent and works only while `leading()` is true,
checked before each topic and each delete; deleting is idempotent, so the short overlap a
failover can cause costs requests, never data. A new governor simply carries on.

Before deleting a topic's expired objects the janitor tells the audit (an EXPIRED record with
the object cutoff), so Messages a group had not consumed count as expired, never as lost.

Storage groups: after the topics, a pass per group over its shared objects
(`<pp>/<cluster>/groups/<group>/`). An object holds a part of several topics, all stamped with
the object's time, so it is deleted only when it is past every member topic's object cutoff
and older than any object of the group that a still-retained notification of any topic names
(a topic that moved to another group keeps its old parts): every part has expired, and no
pointer outlives its part (`retention.group_cutoff`). Orphans of a group are the objects no
member topic's notification names. A group is skipped in a pass where a member topic failed.
`retention_bytes` counts a topic's own objects only, not its parts of shared objects: creating or
altering a shared-group topic with it is refused (`TopicConfig.check_byte_retention`).
A shared-group topic's own key space (`topics/<t>/`, objects written while it had no group) is
listed in full until a listing finds it empty, then no more: brokers write its batches into its
group's objects, and 256 LIST requests per topic and pass cost a thousand small topics ~$10k a
month at S3 prices. A new janitor lists each once again.

Compacted topics (`cleanup_policy` with compact, `memq.compaction`): every broker compacts its
share of the partitions (`memq.governor.agent`); the janitor releases what compaction replaced,
through the manifests' ZooKeeper pointers (`manifests`) and the manifests they name. A compact-only topic expires nothing by time;
its plain objects go once a manifest that has stood `retention_grace_s` covers them (wholly
below its `end`), and its compaction home (`groups/compacted.<topic>`) loses every object older
than `orphan_grace_s` that no manifest a reader may still hold names (`memq.compaction.release`).
A topic in a shared storage group keeps its shared objects until they expire by the group's rule.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter

from memq.audit.emitter import make_audit_sink
from memq.compaction.manifest import ManifestCache, ManifestPointers, compaction_group
from memq.compaction.release import Release, chain, release
from memq.clock import Clock, SystemClock
from memq.config import MemqConfig, TopicConfig
from memq.errors import MemqError
from memq.notify.log import KafkaNotificationLog
from memq.storage import StorageMetrics, make_storage
from memq.storage.base import DELETE_CHUNK, DeleteFailure, ObjectInfo, ObjectLocation, delete_chunks
from memq.storage.metrics import group_label
from memq.storage.naming import group_home

from . import retention

log = logging.getLogger(__name__)


class JanitorMetrics:
    """The janitor's counters. Its LIST and DeleteObjects requests are `memq_storage_attempts
    {op="list"|"delete_many"}` of its own storage handler, on the same registry."""

    def __init__(self, registry: CollectorRegistry, storage: StorageMetrics | None = None) -> None:
        self.storage = storage or StorageMetrics(registry)
        self.objects = Counter("memq_janitor_deleted_objects", "Objects deleted, by reason (expired, orphan)",
                               ["topic", "reason"], registry=registry)
        self.bytes = Counter("memq_janitor_deleted_bytes", "Object bytes deleted, by reason (expired, orphan)",
                             ["topic", "reason"], registry=registry)
        self.errors = Counter("memq_janitor_errors",
                              "Failures: a key a bulk delete refused, or a topic pass that failed",
                              ["topic", "stage"], registry=registry)
        self.passes = Counter("memq_janitor_passes", "Topic passes completed", ["topic"], registry=registry)


@dataclass(frozen=True)
class TopicReport:
    """What one pass did to one topic's own objects, or to a storage group's (`group:<g>`)."""

    topic: str
    pointer_ms: int                  # notifications before this expired
    object_ms: int                   # objects before this were deleted
    expired: tuple[ObjectInfo, ...]
    orphans: tuple[ObjectInfo, ...]
    failed: int                      # keys the store refused to delete (retried next pass)


class NotificationLog(Protocol):
    """What the janitor asks of the notification topics (blocking: it calls them in a thread);
    on Kafka, `memq.notify.log.KafkaNotificationLog`."""

    def sync_retention(self, kafka_topic: str, retention_ms: int) -> None: ...

    def expire(self, kafka_topic: str, before_ms: int) -> dict[str, int]:
        """Expire notifications before `before_ms`; per object home, the oldest object time a
        partition's first retained notification names."""
        ...

    def references(self, kafka_topic: str, start_ms: int, end_ms: int) -> set[str]:
        """Keys of the objects stamped in [start_ms, end_ms) that retained notifications name."""
        ...

    def close(self) -> None: ...


class ObjectStore(Protocol):
    """What the janitor asks of storage (any `StorageHandler` is one)."""

    async def list_topic(self, topic: str, start_ms: int, end_ms: int, *,
                         all_attempts: bool = False) -> list[ObjectInfo]: ...

    async def list_group(self, group: str, start_ms: int, end_ms: int, *,
                         all_attempts: bool = False) -> list[ObjectInfo]: ...

    async def delete_many(self, locs: Sequence[ObjectLocation]) -> list[DeleteFailure]: ...

    async def get(self, loc: ObjectLocation) -> bytes:
        """A whole object (compacted topics' manifests)."""

    async def close(self) -> None: ...


class ExpiryAudit(Protocol):
    """Where the janitor reports what it expired (an `AuditEmitter`)."""

    def expired(self, *, topic: str, before_ms: int) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class _Scope:
    """What one collection covers: a topic's own objects, or a storage group's shared ones."""

    label: str                       # reports and metrics: the topic, or `group:<g>`
    what: str                        # for the log: "topic <t>", "storage group <g>"
    kafka_topics: tuple[str, ...]    # the notification topics whose pointers name its objects
    audited: tuple[str, ...]         # the topics the audit hears EXPIRED for


class Janitor:
    """Retention and orphan collection for every topic; `run` loops while `leading()`."""

    def __init__(self, config: MemqConfig, registry: CollectorRegistry, *,
                 storage: ObjectStore | None = None, notifications: NotificationLog | None = None,
                 audit: ExpiryAudit | None = None, storage_metrics: StorageMetrics | None = None,
                 clock: Clock | None = None, manifests: ManifestPointers | None = None) -> None:
        gc = config.governor
        self.config = config
        self.interval_s = gc.janitor_interval_s
        self.timeout_s = gc.janitor_timeout_s
        self.grace_ms = round(gc.retention_grace_s * 1000)
        self.orphan_grace_ms = round(gc.orphan_grace_s * 1000)
        self.metrics = JanitorMetrics(registry, storage_metrics)
        self.storage: ObjectStore = storage or make_storage(config, metrics=self.metrics.storage)
        self._notifications = notifications
        self.audit = audit
        self.clock = clock or SystemClock()
        self._swept: dict[str, int] = {}     # topic -> end of its last orphan sweep
        self._warned_bytes: set[str] = set()   # shared-group topics told their retention_bytes does nothing
        self._no_own_objects: set[str] = set()   # shared-group topics whose own key space was found empty
        # the object keys open transactions' pending entries name (a blocking read; the broker sets it)
        self.held: Callable[[], set[str]] | None = None
        self._held_now: set[str] | None = None   # read once per pass, at its first orphan sweep
        self.pointers = manifests   # compacted topics' manifests (None: nothing of theirs released)
        self.manifests = ManifestCache(self.storage)

    async def run(self, topics: Callable[[], Mapping[str, TopicConfig]], leading: Callable[[], bool],
                  stopping: asyncio.Event) -> None:
        """Every `janitor_interval_s` while `leading()`, a pass over `topics()` (a blocking read)."""
        while not stopping.is_set():
            try:
                await asyncio.wait_for(stopping.wait(), self.interval_s)
                return
            except TimeoutError:
                pass
            if not leading():
                continue
            if self.audit is None:      # made by the governor only: other brokers hold no producer
                self.audit = make_audit_sink(self.config, client_id="memq-janitor")
            try:
                await self.run_once(await asyncio.to_thread(topics), leading)
            except MemqError as e:
                log.warning("janitor: cannot read topics, retrying next pass: %s", e)

    async def run_once(self, topics: Mapping[str, TopicConfig],
                       leading: Callable[[], bool] = lambda: True) -> list[TopicReport]:
        """One pass over `topics`, then over their storage groups (reports named `group:<g>`);
        a topic or group that fails is logged, counted and retried next pass."""
        reports: dict[str, TopicReport] = {}
        floors: dict[str, int] = {}     # object home -> oldest object a retained notification names
        self._held_now = None
        for name, cfg in sorted(topics.items()):
            if not leading():
                log.info("janitor: no longer the governor, pass stopped before topic %s", name)
                return list(reports.values())
            report = await self._guarded(name, self.collect(cfg, leading, floors))
            if report is not None:
                reports[name] = report
        for group, members in sorted(retention.groups_of(topics).items()):
            if not leading():
                log.info("janitor: no longer the governor, pass stopped before storage group %s", group)
                break
            done = [reports[m] for m in members if m in reports]
            if len(done) < len(members):
                log.info("janitor: storage group %s waits for the next pass: a member topic failed", group)
                continue
            report = await self._guarded(group_label(group), self.collect_group(
                group, [topics[m] for m in members], done, floors, leading))
            if report is not None:
                reports[report.topic] = report
        return list(reports.values())

    async def _guarded(self, name: str, work: Coroutine[Any, Any, TopicReport]) -> TopicReport | None:
        """`work` within `janitor_timeout_s`; None (logged and counted) if it failed."""
        try:
            return await asyncio.wait_for(work, self.timeout_s)
        except (MemqError, TimeoutError) as e:
            self.metrics.errors.labels(name, "pass").inc()
            log.warning("janitor: %s: pass failed, retrying next pass: %s", name,
                        e if isinstance(e, MemqError) else f"over governor.janitor_timeout_s {self.timeout_s:g} s")
            return None

    @property
    def notifications(self) -> NotificationLog:
        """Made on first use: a Kafka admin client connects at once, and most brokers never govern."""
        if self._notifications is None:
            self._notifications = KafkaNotificationLog(self.config, self.timeout_s, self.clock)
        return self._notifications

    def _now_ms(self) -> int:
        return int(self.clock.time() * 1000)

    async def collect(self, cfg: TopicConfig, leading: Callable[[], bool] = lambda: True,
                      floors: dict[str, int] | None = None) -> TopicReport:
        """Expire and collect one topic's own objects (steps 1-4 of the module doc); adds to
        `floors` the oldest object per home its retained notifications name."""
        now = self._now_ms()
        kafka_topic = cfg.notification_topic_for(self.config.cluster.name)
        scope = _Scope(cfg.name, f"topic {cfg.name}", (kafka_topic,), (cfg.name,))
        await asyncio.to_thread(self.notifications.sync_retention, kafka_topic, cfg.retention_ms)
        time_cut = now - cfg.retention_ms if cfg.expires else 0
        rel = await self._release(cfg, now) if cfg.compacted else None
        window = self._orphan_window(scope, now, time_cut)
        if cfg.retention_bytes is not None and cfg.storage_group and cfg.name not in self._warned_bytes:
            self._warned_bytes.add(cfg.name)   # stored before storage groups: creating one is refused
            log.warning("janitor: topic %s: retention_bytes counts its own objects only; its parts of storage "
                        "group %s's shared objects expire by retention_ms", cfg.name, cfg.storage_group)
        shared = bool(cfg.storage_group)
        if not shared:
            self._no_own_objects.discard(cfg.name)   # it writes objects of its own again
            ranges = ([(0, now)] if cfg.retention_bytes is not None and cfg.expires   # the byte budget counts every object
                      else retention.listing_ranges((0, max(time_cut - self.grace_ms, rel.plain_before_ms if rel else 0)),
                                                    window or (0, 0)))
        else:
            ranges = [] if cfg.name in self._no_own_objects else [(0, now)]
        listed = [o for start, end in ranges
                  for o in await self.storage.list_topic(cfg.name, start, end, all_attempts=True)]
        if shared and not listed:
            self._no_own_objects.add(cfg.name)
        pointer_ms = (retention.pointer_cutoff(listed, now, cfg.retention_ms, cfg.retention_bytes) if cfg.expires
                      else 0)
        named = await asyncio.to_thread(self.notifications.expire, kafka_topic, pointer_ms)
        if floors is not None:
            for home, ms in named.items():
                floors[home] = min(ms, floors.get(home, ms))
        object_ms = retention.object_cutoff(pointer_ms, min(named.values(), default=None), self.grace_ms)
        if rel is not None:
            object_ms = max(object_ms, rel.plain_before_ms if not shared else 0)
            await self._sweep_compacted(cfg.name, rel, now, leading)
        return await self._collect(scope, listed, window, pointer_ms, object_ms, leading)

    async def _release(self, cfg: TopicConfig, now: int) -> Release | None:
        """The compacted topic's release rule this pass (None without manifest pointers: nothing released)."""
        if self.pointers is None:
            return None
        pointers = await asyncio.to_thread(self.pointers.of_topic, cfg.name)
        chains = [(ptr, await chain(self.manifests, ptr, now, self.grace_ms)) for ptr in pointers.values()]
        return release(chains, cfg.read_partitions, now, self.grace_ms)

    async def _sweep_compacted(self, topic: str, rel: Release, now: int, leading: Callable[[], bool]) -> None:
        """Delete the objects of the topic's compaction home that `rel` no longer protects."""
        listed = await self.storage.list_group(compaction_group(topic), 0, now - self.orphan_grace_ms,
                                               all_attempts=True)
        gone = [o for o in listed if o.location.key not in rel.protected]
        if gone:
            failed = await self._delete(topic, "compacted", gone, leading)
            log.info("janitor: topic %s: %d replaced compacted objects (%d bytes) released, %d failed", topic,
                     len(gone), sum(o.size for o in gone), failed)

    async def collect_group(self, group: str, members: Sequence[TopicConfig], reports: Sequence[TopicReport],
                            floors: Mapping[str, int], leading: Callable[[], bool] = lambda: True) -> TopicReport:
        """Expire and collect a storage group's shared objects, after its member topics' passes
        (`reports`) expired their notifications."""
        now = self._now_ms()
        scope = _Scope(group_label(group), f"storage group {group}",
                       tuple(cfg.notification_topic_for(self.config.cluster.name) for cfg in members),
                       tuple(cfg.name for cfg in members))
        pointer_ms = min(r.pointer_ms for r in reports)
        object_ms = retention.group_cutoff([r.object_ms for r in reports], floors.get(group_home(group)), self.grace_ms)
        window = self._orphan_window(scope, now, pointer_ms)
        listed = [o for start, end in retention.listing_ranges((0, object_ms), window or (0, 0))
                  for o in await self.storage.list_group(group, start, end, all_attempts=True)]
        return await self._collect(scope, listed, window, pointer_ms, object_ms, leading)

    def _orphan_window(self, scope: _Scope, now: int, pointer_ms: int) -> tuple[int, int] | None:
        """This pass's orphan sweep window of `scope` (a new janitor starts one grace back)."""
        swept = self._swept.setdefault(scope.label, now - 2 * self.orphan_grace_ms)
        return retention.orphan_window(now, self.orphan_grace_ms, swept, pointer_ms)

    async def _collect(self, scope: _Scope, listed: list[ObjectInfo], window: tuple[int, int] | None,
                       pointer_ms: int, object_ms: int, leading: Callable[[], bool]) -> TopicReport:
        """The part of a pass topics and groups share, once the cutoffs are known: find the
        expired objects and the orphans among `listed`, tell the audit, delete, count, report."""
        expired = retention.expired(listed, object_ms)
        orphans: list[ObjectInfo] = []
        if window is not None:
            start, end = max(window[0], pointer_ms), window[1]
            candidates = [o for o in listed if start <= o.timestamp_ms < end]
            if candidates:
                referenced: set[str] = set()
                if self.held is not None:   # read first: a commit publishes, then drops its pending entries
                    if self._held_now is None:
                        self._held_now = await asyncio.to_thread(self.held)
                    referenced |= self._held_now
                for kafka_topic in scope.kafka_topics:
                    referenced |= await asyncio.to_thread(self.notifications.references, kafka_topic, start, end)
                orphans = retention.orphans(candidates, referenced)
        if expired and self.audit is not None:
            for topic in scope.audited:
                self.audit.expired(topic=topic, before_ms=object_ms)
        failed = 0
        for reason, objs in (("expired", expired), ("orphan", orphans)):
            if objs:
                failed += await self._delete(scope.label, reason, objs, leading)
        if window is not None and not failed:
            self._swept[scope.label] = window[1]
        self.metrics.passes.labels(scope.label).inc()
        if expired or orphans or failed:
            log.info("janitor: %s: %d expired (%d bytes, before %d), %d orphans (%d bytes), %d failed",
                     scope.what, len(expired), sum(o.size for o in expired), object_ms, len(orphans),
                     sum(o.size for o in orphans), failed)
        return TopicReport(scope.label, pointer_ms, object_ms, tuple(expired), tuple(orphans), failed)

    async def _delete(self, topic: str, reason: str, objs: list[ObjectInfo], leading: Callable[[], bool]) -> int:
        """Delete `objs` a request (`DELETE_CHUNK` keys) at a time, while still the governor;
        the number of keys the store refused."""
        failed = 0
        for i, chunk in enumerate(delete_chunks(objs)):
            if not leading():
                log.info("janitor: no longer the governor, topic %s: %d of %d %s objects left",
                         topic, len(objs) - i * DELETE_CHUNK, len(objs), reason)
                break
            failures = await self.storage.delete_many([o.location for o in chunk])
            refused = {f.location.key for f in failures}
            for f in failures[:5]:
                log.warning("janitor: topic %s: cannot delete %s: %s", topic, f.location, f.reason)
            gone = [o for o in chunk if o.location.key not in refused]
            self.metrics.objects.labels(topic, reason).inc(len(gone))
            self.metrics.bytes.labels(topic, reason).inc(sum(o.size for o in gone))
            if failures:
                self.metrics.errors.labels(topic, "delete").inc(len(failures))
                failed += len(failures)
            if i % 10 == 9:
                log.info("janitor: topic %s: %d of %d %s objects deleted", topic,
                         (i + 1) * DELETE_CHUNK, len(objs), reason)
        return failed

    async def close(self) -> None:
        if self._notifications is not None:
            await asyncio.to_thread(self._notifications.close)
        if self.audit is not None:
            await asyncio.to_thread(self.audit.close)
        await self.storage.close()

