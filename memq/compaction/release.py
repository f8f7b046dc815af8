"""What the janitor may release of a compacted topic (pure but for reading manifests).

A reader may hold a manifest for up to `governor.retention_grace_s` after a newer one replaced
it, so objects are released by the newest manifest of each partition that has stood that long
(walking back the `previous` chain, which stops at a manifest the janitor already deleted):
- in the topic's compaction home: every object older than `orphan_grace_s` that no manifest still
  within grace (nor its parts) names: replaced parts, old manifests, orphans of crashed runs;
- of its plain objects: those stamped before that standing manifest's `floor_ms` (wholly below
  its `end`: no notification at or after `end` names them), even though old notifications do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memq.errors import ObjectNotFoundError

from .manifest import Manifest, ManifestCache, ManifestPointer


@dataclass(frozen=True)
class Release:
    """A compacted topic's release rule for one janitor pass."""

    protected: frozenset[str]     # compaction-home keys still named (manifests and their parts)
    plain_before_ms: int          # plain objects stamped before this may go (0: none)


async def chain(manifests: ManifestCache, pointer: ManifestPointer, now_ms: int, grace_ms: int) -> list[Manifest]:
    """The current manifest and every older one a reader may still hold (its successor is younger
    than the grace), newest first, ending with the newest one that has stood the whole grace."""
    out = [await manifests.load(pointer)]
    while out[-1].previous and out[-1].created_ms > now_ms - grace_ms:
        prev = ManifestPointer(pointer.bucket, out[-1].previous, 0, 1)
        try:
            out.append(await manifests.load(prev))
        except ObjectNotFoundError:
            break
    return out


def release(chains: Sequence[tuple[ManifestPointer, Sequence[Manifest]]], partitions: int, now_ms: int,
            grace_ms: int) -> Release:
    """The rule from each compacted partition's pointer and `chain` (while a partition has none,
    no plain object is released: its notifications name them all)."""
    protected: set[str] = set()
    floors: list[int] = []
    for pointer, ms in chains:
        protected.add(pointer.key)
        for m in ms:
            protected.update(p.key for p in m.parts)
            if m.previous and m.created_ms > now_ms - grace_ms:   # a reader may still hold the one it replaced
                protected.add(m.previous)
        standing = [m for m in ms if m.created_ms <= now_ms - grace_ms]
        floors.append(standing[0].floor_ms if standing else 0)
    plain = min(floors) if floors and len(floors) == partitions else 0
    return Release(frozenset(protected), plain)
