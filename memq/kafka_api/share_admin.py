"""Sans-I/O codec of the share-group offset admin calls (KIP-932), v0 of each, all flexible.

DescribeShareGroupOffsets (key 90) reads each share-partition's start offset, AlterShareGroupOffsets
(91) sets it, DeleteShareGroupOffsets (92) forgets it (the group starts again by its reset policy).
Field layouts follow Kafka's message JSON (Alter and Delete answer a top-level error besides the
per-partition ones; Describe's topics may be null: every share-partition the group has state for).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from .flexible import FlexReader, FlexWriter
from .share import ShareError

DESCRIBE_SHARE_GROUP_OFFSETS = 90
ALTER_SHARE_GROUP_OFFSETS = 91
DELETE_SHARE_GROUP_OFFSETS = 92
APIS = frozenset({DESCRIBE_SHARE_GROUP_OFFSETS, ALTER_SHARE_GROUP_OFFSETS, DELETE_SHARE_GROUP_OFFSETS})


@dataclass(frozen=True, slots=True)
class PartitionResult:
    partition: int
    error: ShareError = ShareError.NONE
    message: str | None = None
    start_offset: int = -1   # Describe only: -1 when the share-partition has no state


TopicResults = list[tuple[str, uuid.UUID, list[PartitionResult]]]   # (name, topic id, partitions)


def _topics(r: FlexReader, nullable: bool = False) -> dict[str, tuple[int, ...]] | None:
    """Topic name -> partitions, as the request lists them (None: a null array)."""
    n = r.compact_count(nullable=nullable)
    if n < 0:
        return None
    out: dict[str, tuple[int, ...]] = {}
    for _ in range(n):
        name = r.compact_string()
        out[name] = out.get(name, ()) + tuple(r.i32() for _ in range(r.compact_count()))
        r.skip_tags()
    return out


def decode_describe_offsets(r: FlexReader) -> list[tuple[str, dict[str, tuple[int, ...]] | None]]:
    """(group, topics or None for all) of each group asked."""
    groups = []
    for _ in range(r.compact_count()):
        gid = r.compact_string()
        groups.append((gid, _topics(r, nullable=True)))
        r.skip_tags()
    r.skip_tags()
    r.done()
    return groups


def encode_describe_offsets(correlation_id: int,
                            groups: list[tuple[str, TopicResults, ShareError, str | None]]) -> bytes:
    """`groups`: (group, its topics, group error, message)."""
    w = FlexWriter(correlation_id).i32(0).count(len(groups))
    for gid, topics, error, message in groups:
        w.string(gid).count(len(topics))
        for name, tid, parts in topics:
            w.string(name).uuid(tid).count(len(parts))
            for p in parts:
                w.i32(p.partition).i64(p.start_offset).i32(0).i16(p.error).string(p.message).tags()
            w.tags()
        w.i16(error).string(message).tags()
    return w.tags().frame()


def decode_alter_offsets(r: FlexReader) -> tuple[str, dict[str, dict[int, int]]]:
    """The group and, per topic, partition -> new start offset."""
    gid = r.compact_string()
    topics: dict[str, dict[int, int]] = {}
    for _ in range(r.compact_count()):
        parts = topics.setdefault(r.compact_string(), {})
        for _ in range(r.compact_count()):
            p = r.i32()
            parts[p] = r.i64()
            r.skip_tags()
        r.skip_tags()
    r.skip_tags()
    r.done()
    return gid, topics


def decode_delete_offsets(r: FlexReader) -> tuple[str, dict[str, tuple[int, ...]]]:
    gid = r.compact_string()
    topics = _topics(r) or {}
    r.skip_tags()
    r.done()
    return gid, topics


def encode_changed_offsets(correlation_id: int, error: ShareError, message: str | None, topics: TopicResults) -> bytes:
    """The answer to AlterShareGroupOffsets and DeleteShareGroupOffsets (one shape)."""
    w = FlexWriter(correlation_id).i32(0).i16(error).string(message).count(len(topics))
    for name, tid, parts in topics:
        w.string(name).uuid(tid).count(len(parts))
        for p in parts:
            w.i32(p.partition).i16(p.error).string(p.message).tags()
        w.tags()
    return w.tags().frame()
