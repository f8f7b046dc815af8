"""KIP-848's consumer-group messages, sans I/O: ConsumerGroupHeartbeat (v0-1) and
ConsumerGroupDescribe (v0). Both are flexible in every version; partitions are named by topic
id (`metadata_flex.topic_id`), as in Metadata v10+.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from .flexible import FlexReader, FlexWriter

IdAssignment = dict[uuid.UUID, tuple[int, ...]]   # topic id -> partitions


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int                             # 0: join, -1: leave, -2: a static member leaves for now
    instance_id: str | None
    rack_id: str | None
    rebalance_timeout_ms: int                     # -1: unchanged
    topics: tuple[str, ...] | None                # None: unchanged since the last heartbeat
    regex: str | None                             # v1; None: unchanged, "": none
    assignor: str | None
    owned: IdAssignment | None                    # None: unchanged since the last heartbeat


def decode_heartbeat(version: int, r: FlexReader) -> HeartbeatRequest:
    group_id, member_id, epoch = r.compact_string(), r.compact_string(), r.i32()
    instance_id, rack = r.compact_nullable_string(), r.compact_nullable_string()
    rebalance_timeout_ms = r.i32()
    n = r.compact_count(nullable=True)
    topics = None if n < 0 else tuple(r.compact_string() for _ in range(n))
    regex = r.compact_nullable_string() if version >= 1 else None
    assignor = r.compact_nullable_string()
    n = r.compact_count(nullable=True)
    owned: IdAssignment | None = None
    if n >= 0:
        owned = {}
        for _ in range(n):
            tid = r.uuid()
            owned[tid] = tuple(r.i32() for _ in range(r.compact_count()))
            r.skip_tags()
    r.skip_tags()
    r.done()
    return HeartbeatRequest(group_id, member_id, epoch, instance_id, rack, rebalance_timeout_ms, topics, regex,
                            assignor, owned)


def _partitions(w: FlexWriter, assignment: IdAssignment) -> None:
    w.count(len(assignment))
    for tid, parts in sorted(assignment.items()):
        w.uuid(tid).count(len(parts))
        for p in parts:
            w.i32(p)
        w.tags()


def encode_heartbeat(correlation_id: int, error: int, message: str | None, member_id: str | None,
                     member_epoch: int, interval_ms: int, assignment: IdAssignment | None) -> bytes:
    """`assignment` None: unchanged (a null struct)."""
    w = FlexWriter(correlation_id).i32(0).i16(error).string(message).string(member_id)
    w.i32(member_epoch).i32(interval_ms)
    if assignment is None:
        w.i8(-1)
    else:
        w.i8(1)
        _partitions(w, assignment)
        w.tags()
    return w.tags().frame()


def decode_describe(r: FlexReader) -> list[str]:
    groups = [r.compact_string() for _ in range(r.compact_count())]
    r.i8()   # include authorized operations: not computed
    r.skip_tags()
    r.done()
    return groups


NamedAssignment = tuple[tuple[uuid.UUID, str, tuple[int, ...]], ...]   # (topic id, name, partitions)


@dataclass(frozen=True, slots=True)
class DescribedMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    epoch: int
    client_id: str
    client_host: str
    topics: tuple[str, ...]
    regex: str | None
    assignment: NamedAssignment
    target: NamedAssignment


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    group_id: str
    error: int = 0
    message: str | None = None
    state: str = "Dead"
    epoch: int = 0
    assignment_epoch: int = 0
    assignor: str = ""
    members: tuple[DescribedMember, ...] = ()


def _named(w: FlexWriter, assignment: NamedAssignment) -> None:
    w.count(len(assignment))
    for tid, name, parts in assignment:
        w.uuid(tid).string(name).count(len(parts))
        for p in parts:
            w.i32(p)
        w.tags()
    w.tags()


def encode_describe(correlation_id: int, groups: list[DescribedGroup]) -> bytes:
    w = FlexWriter(correlation_id).i32(0).count(len(groups))
    for g in groups:
        w.i16(g.error).string(g.message).string(g.group_id).string(g.state).i32(g.epoch).i32(g.assignment_epoch)
        w.string(g.assignor).count(len(g.members))
        for m in g.members:
            w.string(m.member_id).string(m.instance_id).string(m.rack_id).i32(m.epoch)
            w.string(m.client_id).string(m.client_host).count(len(m.topics))
            for t in m.topics:
                w.string(t)
            w.string(m.regex)
            _named(w, m.assignment)
            _named(w, m.target)
            w.tags()
        w.i32(-2147483648).tags()   # authorized operations: not computed
    return w.tags().frame()
