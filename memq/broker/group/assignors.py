"""The server-side assignors of KIP-848 consumer groups, pure: `uniform` and `range`.

An assignor maps each member's subscription to the partitions it should own (the group's
target assignment). Both are deterministic (sorted members, sorted partitions), so every
coordinator that loads a group computes the same target.

- `uniform` spreads every subscribed partition as evenly as the subscriptions allow and is
  sticky: a member keeps what it had up to its fair share, so a join or a leave moves only
  the partitions it must (few revocations, quick rebalances).
- `range` gives each member of a topic's subscribers a contiguous range of that topic's
  partitions (the first `n % m` members one more), so co-partitioned topics stay together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

TP = tuple[str, int]   # (topic, partition)
Assignment = dict[str, frozenset[TP]]
Assignor = Callable[[Mapping[str, tuple[str, ...]], Mapping[str, int], Mapping[str, frozenset[TP]]], Assignment]
DEFAULT_ASSIGNOR = "uniform"


def range_assign(subscriptions: Mapping[str, tuple[str, ...]], partitions: Mapping[str, int],
                 current: Mapping[str, frozenset[TP]]) -> Assignment:
    """Each topic's partitions cut into contiguous ranges over its subscribers, sorted by id.
    `partitions`: topic -> partition count (a topic absent has none); `current` is unused."""
    out: dict[str, set[TP]] = {m: set() for m in subscriptions}
    for topic in sorted({t for ts in subscriptions.values() for t in ts}):
        members = sorted(m for m, ts in subscriptions.items() if topic in ts)
        count = partitions.get(topic, 0)
        each, extra = divmod(count, len(members))
        start = 0
        for i, m in enumerate(members):
            n = each + (1 if i < extra else 0)
            out[m].update((topic, p) for p in range(start, start + n))
            start += n
    return {m: frozenset(ps) for m, ps in out.items()}


def uniform_assign(subscriptions: Mapping[str, tuple[str, ...]], partitions: Mapping[str, int],
                   current: Mapping[str, frozenset[TP]]) -> Assignment:
    """Every subscribed partition to one subscriber, counts as even as the subscriptions allow,
    each member keeping its `current` partitions up to its fair share (sticky)."""
    members = sorted(subscriptions)
    if not members:
        return {}
    eligible: dict[TP, list[str]] = {}
    for topic in sorted({t for ts in subscriptions.values() for t in ts}):
        subscribers = [m for m in members if topic in subscriptions[m]]
        for p in range(partitions.get(topic, 0)):
            eligible[(topic, p)] = subscribers
    quota, extra = divmod(len(eligible), len(members))   # the fair share when subscriptions are alike
    out: dict[str, set[TP]] = {m: set() for m in members}
    taken: set[TP] = set()
    # keep: what each member had and may still own, up to its share (the extra ones by who had more)
    kept = {m: sorted(tp for tp in current.get(m, ()) if m in eligible.get(tp, ())) for m in members}
    for m in members:
        keep = kept[m][:quota]
        out[m].update(keep)
        taken.update(keep)
    for m in sorted(members, key=lambda m: (-len(kept[m]), m)):
        if extra and len(kept[m]) > quota and kept[m][quota] not in taken:
            out[m].add(kept[m][quota])
            taken.add(kept[m][quota])
            extra -= 1
    # place the rest, each on its least loaded subscriber
    for tp, subscribers in eligible.items():
        if tp not in taken:
            owner = min(subscribers, key=lambda m: (len(out[m]), m))
            out[owner].add(tp)
    return {m: frozenset(ps) for m, ps in out.items()}


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform_assign, "range": range_assign}
