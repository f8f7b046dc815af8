"""Compaction planning, pure (no I/O): when a partition is due, how far its compacted prefix
grows, what survives, and which broker compacts it (`compactor_of`).

A partition's log is its compacted prefix (notifications [0, end), in compacted parts) and its
plain tail (notifications from `end`). A run takes the dirty notifications [end, new_end) (those
old enough: `min_compaction_lag_ms`), keeps the latest record per key among the old survivors and
the dirty records, drops tombstones `delete_retention_ms` past their timestamp (and, with
`compact,delete`, records older than `retention_ms`), and rewrites only the old parts that lose a
record: the others stay as they are, new survivors go into new parts after them.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from memq.config import TopicConfig

from .parts import Survivor

P = TypeVar("P")

#: Survivors per new part: a part is rewritten whole when one of its records goes, so parts stay moderate.
PART_RECORDS = 200_000


def compactor_of(topic: str, partition: int, hosts: Sequence[str], live: Sequence[str]) -> str | None:
    """The broker that compacts `topic`'s `partition`: its hosts (the live brokers the topic is
    assigned to, in assignment order) take its partitions in turn, so the work is spread as the
    placement spreads topics, and each broker's byte budget paces its own share; an unassigned
    topic's partitions are spread over every live broker by a hash. None with no live broker.

    Two brokers with different views may both run a partition for a moment: the manifest's
    compare-and-set keeps one result, the other's objects become orphans (`memq.compaction.run`)."""
    if hosts:
        return hosts[partition % len(hosts)]
    if not live:
        return None
    ranked = sorted(live)
    return ranked[(zlib.crc32(topic.encode()) + partition) % len(ranked)]


@dataclass(frozen=True, slots=True)
class DirtyNote:
    """A plain-tail notification as planning sees it."""

    offset: int
    max_timestamp_ms: int
    size: int


@dataclass(frozen=True)
class Due:
    """Whether a partition is due for compaction, and why (for the log and metrics)."""

    due: bool
    dirty_ratio: float
    lag_ms: int                       # age of its oldest dirty record (0: none)
    why: str


def dirty_ratio(clean_bytes: int, dirty_bytes: int) -> float:
    """Share of the partition's bytes not compacted yet (0 for an empty log)."""
    total = clean_bytes + dirty_bytes
    return dirty_bytes / total if total else 0.0


def due(cfg: TopicConfig, clean_bytes: int, dirty: Sequence[DirtyNote], now_ms: int) -> Due:
    """Due when the dirty ratio reaches `min_cleanable_dirty_ratio`, or the oldest dirty record is
    older than `max_compaction_lag_ms`; never while no dirty record is `min_compaction_lag_ms` old."""
    ratio = dirty_ratio(clean_bytes, sum(n.size for n in dirty))
    lag = max((now_ms - n.max_timestamp_ms for n in dirty[:1]), default=0)
    if not cleanable(dirty, now_ms, cfg.min_compaction_lag_ms):
        return Due(False, ratio, lag, "nothing past min_compaction_lag_ms")
    if cfg.max_compaction_lag_ms is not None and lag >= cfg.max_compaction_lag_ms:
        return Due(True, ratio, lag, f"oldest dirty record {lag} ms old >= max_compaction_lag_ms")
    if ratio >= cfg.min_cleanable_dirty_ratio:
        return Due(True, ratio, lag, f"dirty ratio {ratio:.2f} >= min_cleanable_dirty_ratio")
    return Due(False, ratio, lag, f"dirty ratio {ratio:.2f} < min_cleanable_dirty_ratio")


def cleanable(dirty: Sequence[DirtyNote], now_ms: int, min_lag_ms: int) -> int:
    """How many of the dirty notifications (in offset order, from `end`) a run may take: the
    leading ones whose newest record is at least `min_lag_ms` old."""
    n = 0
    for note in dirty:
        if now_ms - note.max_timestamp_ms < min_lag_ms:
            break
        n += 1
    return n


@dataclass(frozen=True)
class Keep(Generic[P]):
    """An old part that loses nothing: it stays as it is."""

    part: P


@dataclass(frozen=True)
class Write:
    """A new part to write with these survivors (offset order)."""

    survivors: tuple[Survivor, ...]


@dataclass(frozen=True)
class Plan(Generic[P]):
    """The new compacted prefix in offset order, and what the run did."""

    segments: tuple[Keep[P] | Write, ...]
    replaced: tuple[P, ...]            # old parts rewritten (or emptied): released after the swap
    records_in: int                    # old survivors + dirty records looked at
    survivors: int
    tombstones: int                    # tombstones kept
    dropped_tombstones: int
    expired: int                       # records dropped by retention (compact,delete)

    @property
    def written(self) -> int:
        return sum(len(s.survivors) for s in self.segments if isinstance(s, Write))


def untouched(cfg: TopicConfig, min_timestamp_ms: int, tombstones: int, key_hit: bool, now_ms: int) -> bool:
    """Whether an old part surely loses nothing, without reading it: no dirty key is in its key
    index (`key_hit`: a hash matched), no tombstone of it can have expired, no record passed retention."""
    if key_hit:
        return False
    if tombstones and min_timestamp_ms < now_ms - cfg.delete_retention_ms:
        return False
    return not (cfg.expires and min_timestamp_ms < now_ms - cfg.retention_ms)


def plan(cfg: TopicConfig, old: Sequence[tuple[P, Sequence[Survivor] | None]], dirty: Sequence[Survivor],
         now_ms: int, part_records: int = PART_RECORDS) -> Plan[P]:
    """The latest record per key of `old` (each old part with its survivors, or None when
    `untouched` said it keeps them all; in offset order) and `dirty` (the dirty records in offset
    order, all after the old parts)."""
    latest: dict[bytes, int] = {}
    for s in dirty:
        latest[s.key] = s.offset
    tomb_cut = now_ms - cfg.delete_retention_ms
    time_cut = now_ms - cfg.retention_ms if cfg.expires else None
    counts = {"tombstones": 0, "dropped": 0, "expired": 0}

    def keeps(s: Survivor, newest: bool) -> bool:
        if not newest:
            return False
        if time_cut is not None and s.timestamp_ms < time_cut:
            counts["expired"] += 1
            return False
        if s.value is None:
            if s.timestamp_ms < tomb_cut:
                counts["dropped"] += 1
                return False
            counts["tombstones"] += 1
        return True

    segments: list[Keep[P] | Write] = []
    replaced: list[P] = []
    survivors = 0
    for part, records in old:
        if records is None:
            segments.append(Keep(part))
            continue
        kept = [s for s in records if keeps(s, s.key not in latest)]
        survivors += len(kept)
        if len(kept) == len(records):
            segments.append(Keep(part))
            continue
        replaced.append(part)
        if kept:
            segments.append(Write(tuple(kept)))
    fresh = [s for s in dirty if keeps(s, latest[s.key] == s.offset)]
    survivors += len(fresh)
    segments.extend(Write(tuple(fresh[i:i + part_records])) for i in range(0, len(fresh), part_records))
    return Plan(tuple(segments), tuple(replaced), sum(len(r or ()) for _, r in old) + len(dirty), survivors,
                counts["tombstones"], counts["dropped"], counts["expired"])
