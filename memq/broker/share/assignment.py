"""Which share-group member fetches which partitions (KIP-932's broker-side assignment), pure.

A share partition's records go to whoever fetches them, so members may share partitions:
with more members than partitions every member gets every partition (no member idles);
otherwise the partitions are dealt round robin, every partition to exactly one member.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

P = TypeVar("P", bound=Hashable)


def assign(members: Sequence[str], partitions: dict[str, Sequence[P]]) -> dict[str, tuple[P, ...]]:
    """`partitions`: per member, the partitions of the topics it subscribes to (sorted, so
    every broker computes the same). Members sharing no topics are assigned independently."""
    out: dict[str, list[P]] = {m: [] for m in members}
    by_set: dict[tuple[P, ...], list[str]] = {}
    for m in sorted(members):
        by_set.setdefault(tuple(partitions.get(m, ())), []).append(m)
    for parts, group in by_set.items():
        if len(group) > len(parts):
            for m in group:
                out[m] += parts
        else:
            for i, p in enumerate(parts):
                out[group[i % len(group)]].append(p)
    return {m: tuple(ps) for m, ps in out.items()}
