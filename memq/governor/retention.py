"""Which objects and notifications of a topic expire, and which objects are orphans: pure rules.

Times are batch times in ms (an object's key timestamp, a notification's Kafka timestamp).
The promise: **no pointer outlives its object**. Notifications expire at the pointer cutoff;
an object goes only a grace period after every notification that may name it is gone. The
janitor (`memq.governor.janitor`) does the I/O around these functions.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from memq.config import TopicConfig
from memq.storage.base import ObjectInfo


@dataclass(frozen=True, slots=True)
class Cutoffs:
    """One pass's decision for one topic: notifications published before `pointer_ms` expire;
    objects stamped before `object_ms` are deleted."""

    pointer_ms: int
    object_ms: int


def pointer_cutoff(objects: Sequence[ObjectInfo], now_ms: int, retention_ms: int,
                   retention_bytes: int | None) -> int:
    """Notifications before this expire: those older than `retention_ms`, and with
    `retention_bytes`, those of every object beyond the newest `retention_bytes` of objects
    (`objects` sorted by time, as `list_topic` returns them)."""
    cutoff = now_ms - retention_ms
    if retention_bytes is None:
        return cutoff
    kept = 0
    for info in reversed(objects):
        kept += info.size
        if kept > retention_bytes:
            return max(cutoff, info.timestamp_ms + 1)
    return cutoff


def object_cutoff(pointer_ms: int, retained_floor_ms: int | None, grace_ms: int) -> int:
    """Objects before this are deleted: `grace_ms` before the pointer cutoff, and before the
    oldest object a still-retained notification names (`retained_floor_ms`, None if none is
    retained), so an object goes only after its pointers, whatever Kafka did with them."""
    floor = pointer_ms if retained_floor_ms is None else min(pointer_ms, retained_floor_ms)
    return floor - grace_ms


def group_cutoff(member_object_ms: Iterable[int], named_floor_ms: int | None, grace_ms: int) -> int:
    """A storage group's shared objects before this are deleted: past every member topic's
    object cutoff (each part of an object carries the object's time, so every part has
    expired), and `grace_ms` before the oldest group object a retained notification of any
    topic names (`named_floor_ms`, None if none), so no pointer outlives its part."""
    cut = min(member_object_ms)
    return cut if named_floor_ms is None else min(cut, named_floor_ms - grace_ms)


def groups_of(topics: Mapping[str, TopicConfig]) -> dict[str, list[str]]:
    """Storage group -> its member topics (by name); topics storing their own objects ("") have none."""
    groups: dict[str, list[str]] = {}
    for name, cfg in sorted(topics.items()):
        if cfg.storage_group:
            groups.setdefault(cfg.storage_group, []).append(name)
    return groups


def expired(objects: Iterable[ObjectInfo], object_ms: int) -> list[ObjectInfo]:
    """The objects stamped before `object_ms`."""
    return [o for o in objects if o.timestamp_ms < object_ms]


def orphan_window(now_ms: int, orphan_grace_ms: int, swept_until_ms: int, pointer_ms: int) -> tuple[int, int] | None:
    """[start, end) of object times to check for orphans now, or None when no sweep is due.

    A sweep covers the objects stamped since the last one ended (`swept_until_ms`) and at least
    `orphan_grace_ms` old (a late publish has landed or never will), so sweeps come at most once
    per grace: each lists every prefix once, the costly part. At most two graces are looked
    back (memory stays bounded after an outage), and nothing older than the pointer cutoff
    (those notifications may be gone: retention's business).
    """
    end = now_ms - orphan_grace_ms
    if end - swept_until_ms < orphan_grace_ms:
        return None
    return max(swept_until_ms, end - 2 * orphan_grace_ms, pointer_ms), end


def orphans(objects: Iterable[ObjectInfo], referenced: Collection[str]) -> list[ObjectInfo]:
    """The objects whose key no retained notification names (keys compared by name)."""
    return [o for o in objects if o.location.key not in referenced]


def listing_ranges(*ranges: tuple[int, int]) -> list[tuple[int, int]]:
    """The non-empty [start, end) ranges merged where they overlap or touch, so one LIST pass
    covers both the expired objects and the orphan window when they meet."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(r for r in ranges if r[0] < r[1]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
