"""The audit arithmetic: match produced and consumed Messages and balance the books (pure).

A Message is identified by (producer id, epoch, sequence) within its topic. Every consumer
group that has consumed from a topic is expected to consume every Message of that topic
created at or after the oldest Message the group ever consumed (so a group that starts at
"latest" is not blamed for history it never meant to read). A new group gets its own grace
period (from its first record) for the Messages acked before it appeared. Per (topic, group) and window:

- produced (topic level, window of the Message's creation), consumed (distinct Messages'
  LogMessages, window of consumption), duplicates (re-deliveries), mismatches (consumed
  digest differs from the produced one: corruption), lost (counted in the creation window, and
  taken back if it arrives late),
- end-to-end latency (consume time - producer seal time) as a log histogram, so windows merge,
- lag (the backlog): LogMessages acked and neither consumed nor lost, and the age of the oldest
  of them; a window holds the latest lag measured in it.

Lost means the group moved past a Message without delivering it: `grace_ms` after its ack it is
still not consumed although the group has consumed a Message sealed `skew_ms` or more after it
(the group's position is the newest seal time it consumed). A Message the group has not reached
yet is backlog, however old: a group whose process exited keeps its backlog and shows STOPPED,
never loss. A consumer reads its partitions interleaved, so at a stop the newest Messages of one
partition may be older than the last one delivered from another: `skew_ms` keeps those backlog.
A partition lagging the others by more than that can be reported lost early; the loss is taken
back when it is delivered.

Expired is not lost: when the janitor reports that retention deleted a topic's data created
before a time (an EXPIRED record), what each group had not consumed of it counts as `expired`
for that group (a loss already reckoned for it is taken back) and the books forget it.

Aborted is not produced: a transaction's coordinator reports the LogMessages of each topic an
aborted transaction held (an ABORTED record); no reader ever sees them, so they count apart, per
topic (`aborted`), and no group expects them.

Time comes in as arguments (`advance(now_ms)`), so this module is deterministic. Changes since
the last `drain_changes()` are tracked so the store can persist them incrementally.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Iterable

from memq.audit.records import AuditRecord, Kind

MsgKey = tuple[int, int, int]
LIVE_MS = 10_000
BOOKS_MS = 60_000
_LOG_STEP = math.log(1.04)      # latency histogram buckets are 4% wide


class Status(IntEnum):
    """A group's state, ordered worst last, so `max()` and sorting by it put trouble first.

    IDLE: nothing to consume and nothing consumed for `stall_ms`. LAG: the oldest backlog is
    `warn_lag_ms` old. STALLED: still consuming, but the oldest backlog is `stall_ms` old.
    STOPPED: a backlog and nothing consumed for `stall_ms` (e.g. its consumers exited).
    LOSS: loss or corruption within `alert_ms`.
    """

    OK = 0
    IDLE = 1
    LAG = 2
    STALLED = 3
    STOPPED = 4
    LOSS = 5


@dataclass(frozen=True)
class BooksSettings:
    grace_ms: int = 60_000
    retention_ms: int = 900_000
    warn_lag_ms: int = 30_000
    stall_ms: int = 60_000
    skew_ms: int = 5_000              # how far (seal time) one consumer's partitions interleave
    alert_ms: int = 300_000           # loss or corruption this recent makes a group LOSS
    memory_ms: int = 3_600_000        # window history kept in memory (the store keeps all)
    window_sizes_ms: tuple[int, ...] = (LIVE_MS, BOOKS_MS)


@dataclass(slots=True)
class Produced:
    count: int
    digest: int
    created_ms: int
    acked_ms: int
    settled: bool = False             # grace period over: loss was decided


@dataclass(slots=True)
class Delivery:
    """What one group got of one Message. `lost` rows (deliveries == 0) record a loss verdict."""

    deliveries: int
    digest: int
    consumed_ms: int
    lost: bool = False


@dataclass(slots=True)
class GroupState:
    since_ms: int
    last_consumed_ms: int
    first_seen_ms: int                # consume time of its first record
    caught_up: bool = False           # Messages settled before it appeared were checked
    consumed: int = 0
    lost: int = 0
    duplicates: int = 0
    mismatches: int = 0
    lag_messages: int = 0
    lag_ms: int = 0
    position_ms: int = 0              # newest seal time consumed: older Messages were passed
    expired: int = 0                  # LogMessages retention deleted before the group consumed them
    deliveries: dict[MsgKey, Delivery] = field(default_factory=dict)


@dataclass(slots=True)
class Window:
    produced: int = 0
    consumed: int = 0
    lost: int = 0
    duplicates: int = 0
    mismatches: int = 0
    latency: dict[int, int] = field(default_factory=dict)   # bucket -> LogMessages
    latency_max_ms: int = 0
    lag_messages: int = 0
    lag_ms: int = 0

    def merge(self, other: Window) -> None:
        """Add `other`, the later window: its lag (the later measurement) replaces this one's."""
        self.produced += other.produced
        self.consumed += other.consumed
        self.lost += other.lost
        self.duplicates += other.duplicates
        self.mismatches += other.mismatches
        for b, n in other.latency.items():
            self.latency[b] = self.latency.get(b, 0) + n
        self.latency_max_ms = max(self.latency_max_ms, other.latency_max_ms)
        self.lag_messages, self.lag_ms = other.lag_messages, other.lag_ms

    def percentile_ms(self, q: float) -> float | None:
        """Latency at quantile q (0..1), within the 4% bucket width; None without samples."""
        total = sum(self.latency.values())
        if not total:
            return None
        rank = q * total
        seen = 0
        for b in sorted(self.latency):
            seen += self.latency[b]
            if seen >= rank:
                return min(bucket_upper_ms(b), float(self.latency_max_ms))
        return float(self.latency_max_ms)


def latency_bucket(ms: int) -> int:
    return 0 if ms <= 1 else math.ceil(math.log(ms) / _LOG_STEP)


def bucket_upper_ms(bucket: int) -> float:
    return math.exp(bucket * _LOG_STEP)


@dataclass(frozen=True)
class Changes:
    """Rows to persist since the last drain. `None` values mean "delete"."""

    produced: dict[tuple[str, MsgKey], Produced | None]
    deliveries: dict[tuple[str, str, MsgKey], Delivery | None]
    groups: dict[tuple[str, str], GroupState]
    topics: dict[str, tuple[int, int]]                      # topic -> (produced, aborted) totals
    windows: dict[tuple[int, str, str, int], Window]        # (size, topic, group, start)


@dataclass(frozen=True)
class GroupSummary:
    topic: str
    group: str
    status: Status
    produced: int
    consumed: int
    lost: int
    duplicates: int
    mismatches: int
    lag_messages: int
    lag_s: float
    p50_ms: float | None
    p99_ms: float | None
    max_ms: int
    expired: int
    aborted: int = 0                  # the topic's LogMessages in aborted transactions


class Books:
    """All audit state of one cluster; feed it records, advance its clock, read its views."""

    def __init__(self, settings: BooksSettings = BooksSettings()) -> None:
        self.settings = settings
        self._produced: dict[str, dict[MsgKey, Produced]] = {}
        self._open: dict[str, dict[MsgKey, Produced]] = {}        # not yet settled
        self._groups: dict[str, dict[str, GroupState]] = {}
        self._produced_total: dict[str, int] = {}
        self._aborted_total: dict[str, int] = {}
        self._windows: dict[int, dict[tuple[str, str], dict[int, Window]]] = {
            s: {} for s in settings.window_sizes_ms}
        self._settle_heap: list[tuple[int, str, MsgKey]] = []
        self._evict_heap: list[tuple[int, str, MsgKey]] = []
        self._orphan_heap: list[tuple[int, str, str, MsgKey]] = []  # consumed, never produced
        self._catchup_heap: list[tuple[int, str, str]] = []        # new groups' own grace
        self._d_produced: set[tuple[str, MsgKey]] = set()
        self._d_deliveries: set[tuple[str, str, MsgKey]] = set()
        self._d_groups: set[tuple[str, str]] = set()
        self._d_topics: set[str] = set()
        self._d_windows: set[tuple[int, str, str, int]] = set()

    # --- input ---------------------------------------------------------------------------

    def add(self, rec: AuditRecord) -> None:
        if rec.kind is Kind.PRODUCED:
            self._on_produced(rec)
        elif rec.kind is Kind.EXPIRED:
            self._on_expired(rec.topic, rec.created_ms)
        elif rec.kind is Kind.ABORTED:
            self._aborted_total[rec.topic] = self._aborted_total.get(rec.topic, 0) + rec.count
            self._d_topics.add(rec.topic)
        else:
            self._on_consumed(rec)

    def add_all(self, records: Iterable[AuditRecord]) -> None:
        for rec in records:
            self.add(rec)

    def _on_produced(self, rec: AuditRecord) -> None:
        topic, key = rec.topic, rec.key
        entries = self._produced.setdefault(topic, {})
        if key in entries:          # the same ack reported twice: count the Message once
            return
        p = Produced(rec.count, rec.digest, rec.created_ms, rec.ts_ms)
        entries[key] = p
        self._open.setdefault(topic, {})[key] = p
        self._produced_total[topic] = self._produced_total.get(topic, 0) + rec.count
        self._d_topics.add(topic)
        self._d_produced.add((topic, key))
        for w in self._touch(topic, "", rec.created_ms):
            w.produced += rec.count
        heapq.heappush(self._settle_heap, (rec.ts_ms + self.settings.grace_ms, topic, key))
        heapq.heappush(self._evict_heap, (rec.ts_ms + self.settings.retention_ms, topic, key))
        for group, g in self._groups.get(topic, {}).items():   # consumed before its ack arrived
            d = g.deliveries.get(key)
            if d is not None and not d.lost and d.digest != rec.digest:
                self._mismatch(topic, group, g, rec.count * d.deliveries, d.consumed_ms)

    def _on_expired(self, topic: str, before_ms: int) -> None:
        """Messages of `topic` created before `before_ms` are gone: unconsumed ones are expired for
        each group that expected them (taking back a loss reckoned meanwhile); all are forgotten."""
        entries = self._produced.get(topic, {})
        for key in [k for k, p in entries.items() if p.created_ms < before_ms]:
            p = entries.pop(key)
            self._open.get(topic, {}).pop(key, None)
            self._d_produced.add((topic, key))
            for group, g in self._groups.get(topic, {}).items():
                d = g.deliveries.pop(key, None)
                if d is not None:
                    self._d_deliveries.add((topic, group, key))
                if p.created_ms < g.since_ms or (d is not None and not d.lost):
                    continue
                if d is not None:      # reckoned lost before the janitor's record came
                    g.lost -= p.count
                    for w in self._touch(topic, group, p.created_ms):
                        w.lost -= p.count
                g.expired += p.count
                self._d_groups.add((topic, group))

    def _on_consumed(self, rec: AuditRecord) -> None:
        topic, group, key = rec.topic, rec.group, rec.key
        groups = self._groups.setdefault(topic, {})
        g = groups.get(group)
        if g is None:
            g = groups[group] = GroupState(rec.created_ms, rec.ts_ms, rec.ts_ms)
            heapq.heappush(self._catchup_heap, (rec.ts_ms + self.settings.grace_ms, topic, group))
        g.since_ms = min(g.since_ms, rec.created_ms)
        g.last_consumed_ms = max(g.last_consumed_ms, rec.ts_ms)
        g.position_ms = max(g.position_ms, rec.created_ms)
        self._d_groups.add((topic, group))
        latency = max(0, rec.ts_ms - rec.created_ms)
        bucket = latency_bucket(latency)
        windows = self._touch(topic, group, rec.ts_ms)
        for w in windows:
            w.latency[bucket] = w.latency.get(bucket, 0) + rec.count
            w.latency_max_ms = max(w.latency_max_ms, latency)
        p = self._produced.get(topic, {}).get(key)
        d = g.deliveries.get(key)
        self._d_deliveries.add((topic, group, key))
        if d is None or d.lost:
            if d is None:
                g.deliveries[key] = Delivery(1, rec.digest, rec.ts_ms)
                if p is None:
                    heapq.heappush(self._orphan_heap,
                                   (rec.ts_ms + self.settings.retention_ms, topic, group, key))
            else:                   # declared lost, then arrived after all: take the loss back
                d.deliveries, d.digest, d.consumed_ms, d.lost = 1, rec.digest, rec.ts_ms, False
                g.lost -= rec.count
                for w in self._touch(topic, group, p.created_ms if p else rec.created_ms):
                    w.lost -= rec.count
            g.consumed += rec.count
            for w in windows:
                w.consumed += rec.count
        else:
            d.deliveries += 1
            g.duplicates += rec.count
            for w in windows:
                w.duplicates += rec.count
        if p is not None and rec.digest != p.digest:
            self._mismatch(topic, group, g, rec.count, rec.ts_ms)

    def _mismatch(self, topic: str, group: str, g: GroupState, count: int, at_ms: int) -> None:
        g.mismatches += count
        self._d_groups.add((topic, group))
        for w in self._touch(topic, group, at_ms):
            w.mismatches += count

    def _touch(self, topic: str, group: str, ts_ms: int) -> list[Window]:
        """The windows (one per size) that hold time ts_ms, created if needed, marked dirty."""
        out = []
        for size, per in self._windows.items():
            start = ts_ms - ts_ms % size
            series = per.setdefault((topic, group), {})
            w = series.get(start)
            if w is None:
                w = series[start] = Window()
            self._d_windows.add((size, topic, group, start))
            out.append(w)
        return out

    # --- clock ---------------------------------------------------------------------------

    def advance(self, now_ms: int) -> None:
        """Decide losses whose grace is over, forget old state, measure the backlog at now_ms."""
        self._settle(now_ms)
        self._catch_up(now_ms)
        self._evict(now_ms)
        self._reckon(now_ms)
        horizon = now_ms - self.settings.memory_ms
        for size, per in self._windows.items():
            for series in per.values():
                for start in [s for s in series if s + size < horizon]:
                    del series[start]

    def _settle(self, now_ms: int) -> None:
        heap = self._settle_heap
        while heap and heap[0][0] <= now_ms:
            _, topic, key = heapq.heappop(heap)
            p = self._open.get(topic, {}).pop(key, None)
            if p is None:
                continue
            p.settled = True
            self._d_produced.add((topic, key))

    def _catch_up(self, now_ms: int) -> None:
        """A new group's own grace is over: from now on it can be blamed for loss."""
        heap = self._catchup_heap
        while heap and heap[0][0] <= now_ms:
            _, topic, group = heapq.heappop(heap)
            self._groups[topic][group].caught_up = True
            self._d_groups.add((topic, group))

    def _lose(self, topic: str, group: str, g: GroupState, key: MsgKey, p: Produced) -> None:
        g.deliveries[key] = Delivery(0, 0, 0, lost=True)
        g.lost += p.count
        self._d_groups.add((topic, group))
        self._d_deliveries.add((topic, group, key))
        for w in self._touch(topic, group, p.created_ms):
            w.lost += p.count

    def _evict(self, now_ms: int) -> None:
        heap = self._evict_heap
        while heap and heap[0][0] <= now_ms:
            _, topic, key = heapq.heappop(heap)
            if self._produced.get(topic, {}).pop(key, None) is None:
                continue
            self._open.get(topic, {}).pop(key, None)
            self._d_produced.add((topic, key))
            for group, g in self._groups.get(topic, {}).items():
                if g.deliveries.pop(key, None) is not None:
                    self._d_deliveries.add((topic, group, key))
        orphans = self._orphan_heap
        while orphans and orphans[0][0] <= now_ms:
            _, topic, group, key = heapq.heappop(orphans)
            if key in self._produced.get(topic, {}):
                continue            # its ack arrived later: evicted with the produced entry
            owner = self._groups.get(topic, {}).get(group)
            if owner is not None and owner.deliveries.pop(key, None) is not None:
                self._d_deliveries.add((topic, group, key))

    def _reckon(self, now_ms: int) -> None:
        """Each group's losses and backlog at now_ms, for the table and the window holding now_ms.

        A Message the group expects and has not got is lost once settled and passed by the
        group's position (and the group's own grace is over), otherwise it is backlog. A window
        keeps the latest measurement in it (not its peak), so the newest window always shows
        the table's figure.
        """
        for topic, groups in self._groups.items():
            entries = self._produced.get(topic, {})
            for group, g in groups.items():
                messages, oldest = 0, now_ms
                for key, p in entries.items():
                    if p.created_ms < g.since_ms or key in g.deliveries:
                        continue
                    if p.settled and g.caught_up and p.created_ms + self.settings.skew_ms <= g.position_ms:
                        self._lose(topic, group, g, key, p)
                    else:
                        messages += p.count
                        oldest = min(oldest, p.created_ms)
                lag = (messages, now_ms - oldest if messages else 0)
                if lag != (g.lag_messages, g.lag_ms):
                    self._d_groups.add((topic, group))
                g.lag_messages, g.lag_ms = lag
                for w in self._touch(topic, group, now_ms):
                    w.lag_messages, w.lag_ms = lag

    # --- persistence ---------------------------------------------------------------------

    def drain_changes(self) -> Changes:
        """Everything modified since the last call (the store writes it in one transaction)."""
        ch = Changes(
            produced={(t, k): self._produced.get(t, {}).get(k) for t, k in self._d_produced},
            deliveries={(t, g, k): self._delivery(t, g, k) for t, g, k in self._d_deliveries},
            groups={(t, g): self._groups[t][g] for t, g in self._d_groups},
            topics={t: (self._produced_total.get(t, 0), self._aborted_total.get(t, 0)) for t in self._d_topics},
            windows={(s, t, g, st): w for s, t, g, st in self._d_windows
                     if (w := self._windows[s].get((t, g), {}).get(st)) is not None},
        )
        self._d_produced, self._d_deliveries, self._d_groups = set(), set(), set()
        self._d_topics, self._d_windows = set(), set()
        return ch

    def _delivery(self, topic: str, group: str, key: MsgKey) -> Delivery | None:
        g = self._groups.get(topic, {}).get(group)
        return None if g is None else g.deliveries.get(key)

    def restore(self, changes: Changes) -> None:
        """Load persisted state (a `Changes` holding every row) into empty books."""
        for (topic, key), p in changes.produced.items():
            if p is None:
                continue
            self._produced.setdefault(topic, {})[key] = p
            heapq.heappush(self._evict_heap, (p.acked_ms + self.settings.retention_ms, topic, key))
            if not p.settled:
                self._open.setdefault(topic, {})[key] = p
                heapq.heappush(self._settle_heap, (p.acked_ms + self.settings.grace_ms, topic, key))
        for (topic, group), g in changes.groups.items():
            self._groups.setdefault(topic, {})[group] = g
            if not g.caught_up:
                heapq.heappush(self._catchup_heap,
                               (g.first_seen_ms + self.settings.grace_ms, topic, group))
        for (topic, group, key), d in changes.deliveries.items():
            owner = self._groups.get(topic, {}).get(group)
            if d is None or owner is None:
                continue
            owner.deliveries[key] = d
            if key not in self._produced.get(topic, {}):
                heapq.heappush(self._orphan_heap,
                               (d.consumed_ms + self.settings.retention_ms, topic, group, key))
        for topic, (produced, aborted) in changes.topics.items():
            self._produced_total[topic] = produced
            if aborted:
                self._aborted_total[topic] = aborted
        for (size, topic, group, start), w in changes.windows.items():
            if size in self._windows:
                self._windows[size].setdefault((topic, group), {})[start] = w

    # --- views ---------------------------------------------------------------------------

    def topics(self) -> list[str]:
        return sorted(set(self._produced_total) | set(self._aborted_total) | set(self._groups))

    def groups(self, topic: str) -> list[str]:
        return sorted(self._groups.get(topic, {}))

    def window(self, size_ms: int, topic: str, group: str, start_ms: int) -> Window:
        """One window's figures (group "" holds the topic's produced count); empty if none."""
        return self._windows[size_ms].get((topic, group), {}).get(start_ms, Window())

    def series(self, size_ms: int, topic: str, group: str, since_ms: int) -> list[tuple[int, Window]]:
        """Windows of one (topic, group) starting at or after since_ms, oldest first."""
        s = self._windows[size_ms].get((topic, group), {})
        return sorted((start, w) for start, w in s.items() if start >= since_ms)

    def merged(self, size_ms: int, topic: str, group: str, since_ms: int) -> Window:
        out = Window()
        for _, w in self.series(size_ms, topic, group, since_ms):
            out.merge(w)
        return out

    def status(self, topic: str, group: str, now_ms: int) -> Status:
        g = self._groups.get(topic, {}).get(group)
        if g is None:
            return Status.OK
        recent = self.merged(BOOKS_MS, topic, group, now_ms - self.settings.alert_ms)
        if recent.lost > 0 or recent.mismatches > 0:
            return Status.LOSS
        quiet = now_ms - g.last_consumed_ms >= self.settings.stall_ms
        if g.lag_messages and quiet:
            return Status.STOPPED
        if g.lag_ms >= self.settings.stall_ms:
            return Status.STALLED
        if g.lag_ms >= self.settings.warn_lag_ms:
            return Status.LAG
        return Status.IDLE if quiet and not g.lag_messages else Status.OK

    def summary(self, now_ms: int) -> list[GroupSummary]:
        """One row per (topic, group) (group "" for a topic nobody consumes), worst first."""
        rows = []
        for topic in self.topics():
            produced = self._produced_total.get(topic, 0)
            groups = self._groups.get(topic) or {"": GroupState(0, 0, 0)}
            for group, g in groups.items():
                last = self.merged(LIVE_MS, topic, group, now_ms - BOOKS_MS)
                rows.append(GroupSummary(
                    topic, group, self.status(topic, group, now_ms), produced, g.consumed, g.lost,
                    g.duplicates, g.mismatches, g.lag_messages, g.lag_ms / 1000,
                    last.percentile_ms(0.5), last.percentile_ms(0.99), last.latency_max_ms, g.expired,
                    self._aborted_total.get(topic, 0)))
        rows.sort(key=lambda r: (-r.status, -r.lost, -r.mismatches, -r.lag_s, -r.duplicates,
                                 r.topic, r.group))
        return rows
