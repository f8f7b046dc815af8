"""Sans-I/O codec of Kafka's share-group messages (KIP-932), the versions librdkafka 2.16 sends.

ShareGroupHeartbeat v1 (key 76), ShareGroupDescribe v1 (77), ShareFetch v1 (78) and
ShareAcknowledge v1 (79): all flexible (`flexible`), topics named by id (`topic_ids`). Field
layouts follow Kafka's message JSON of KIP-932's v1 (ShareFetch v1 has MaxRecords and BatchSize
and no per-partition byte limit; its response has AcquisitionLockTimeoutMs).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import IntEnum

from memq.errors import ProtocolError

from .flexible import FlexReader, FlexWriter

SHARE_GROUP_HEARTBEAT = 76
SHARE_GROUP_DESCRIBE = 77
SHARE_FETCH = 78
SHARE_ACKNOWLEDGE = 79
SHARE_VERSION = 1   # the only version served of each


class ShareError(IntEnum):
    """Kafka error codes the share APIs answer with (Kafka's `Errors` numbering)."""

    NONE = 0
    UNKNOWN_SERVER_ERROR = -1
    UNKNOWN_TOPIC_OR_PARTITION = 3
    NOT_LEADER_OR_FOLLOWER = 6
    NOT_COORDINATOR = 16
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    INVALID_REQUEST = 42
    KAFKA_STORAGE_ERROR = 56
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    UNKNOWN_TOPIC_ID = 100
    FENCED_MEMBER_EPOCH = 110
    INVALID_RECORD_STATE = 121
    SHARE_SESSION_NOT_FOUND = 122
    INVALID_SHARE_SESSION_EPOCH = 123


class AckType(IntEnum):
    """AcknowledgeTypes of an acknowledgement batch."""

    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3


# --- ShareGroupHeartbeat -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int                  # 0: join, -1: leave
    rack_id: str | None
    topics: tuple[str, ...] | None     # None: unchanged since the last heartbeat


def decode_heartbeat(r: FlexReader) -> HeartbeatRequest:
    group_id, member_id, epoch = r.compact_string(), r.compact_string(), r.i32()
    rack = r.compact_nullable_string()
    n = r.compact_count(nullable=True)
    topics = None if n < 0 else tuple(r.compact_string() for _ in range(n))
    r.skip_tags()
    r.done()
    return HeartbeatRequest(group_id, member_id, epoch, rack, topics)


Assignment = dict[uuid.UUID, tuple[int, ...]]


def encode_heartbeat(correlation_id: int, error: ShareError, message: str | None, member_id: str | None,
                     member_epoch: int, interval_ms: int, assignment: Assignment | None) -> bytes:
    """`assignment` None: unchanged (sent as a null struct)."""
    w = FlexWriter(correlation_id).i32(0).i16(error).string(message).string(member_id)
    w.i32(member_epoch).i32(interval_ms)
    if assignment is None:
        w.i8(-1)
    else:
        w.i8(1).count(len(assignment))
        for tid, parts in sorted(assignment.items()):
            w.uuid(tid).count(len(parts))
            for p in parts:
                w.i32(p)
            w.tags()
        w.tags()
    return w.tags().frame()


# --- ShareGroupDescribe --------------------------------------------------------------------


def decode_describe(r: FlexReader) -> list[str]:
    groups = [r.compact_string() for _ in range(r.compact_count())]
    r.i8()   # include authorized operations: not computed
    r.skip_tags()
    r.done()
    return groups


@dataclass(frozen=True, slots=True)
class DescribedMember:
    member_id: str
    rack_id: str | None
    epoch: int
    client_id: str
    client_host: str
    topics: tuple[str, ...]
    assignment: tuple[tuple[uuid.UUID, str, tuple[int, ...]], ...]   # (topic id, name, partitions)


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    group_id: str
    error: ShareError = ShareError.NONE
    message: str | None = None
    state: str = "Dead"
    epoch: int = 0
    members: tuple[DescribedMember, ...] = ()


def encode_describe(correlation_id: int, groups: list[DescribedGroup]) -> bytes:
    w = FlexWriter(correlation_id).i32(0).count(len(groups))
    for g in groups:
        w.i16(g.error).string(g.message).string(g.group_id).string(g.state).i32(g.epoch).i32(g.epoch)
        w.string("simple").count(len(g.members))
        for m in g.members:
            w.string(m.member_id).string(m.rack_id).i32(m.epoch).string(m.client_id).string(m.client_host)
            w.count(len(m.topics))
            for t in m.topics:
                w.string(t)
            w.count(len(m.assignment))
            for tid, name, parts in m.assignment:
                w.uuid(tid).string(name).count(len(parts))
                for p in parts:
                    w.i32(p)
                w.tags()
            w.tags()   # assignment
            w.tags()   # member
        w.i32(-2147483648).tags()   # authorized operations: not computed
    return w.tags().frame()


# --- acknowledgements (ShareFetch and ShareAcknowledge) -----------------------------------


@dataclass(frozen=True, slots=True)
class AckBatch:
    first: int
    last: int                      # inclusive
    types: tuple[AckType, ...]     # one for the whole range, or one per offset


def _ack_batches(r: FlexReader) -> tuple[AckBatch, ...]:
    out = []
    for _ in range(r.compact_count()):
        first, last = r.i64(), r.i64()
        raw = [r.i8() for _ in range(r.compact_count())]
        r.skip_tags()
        try:
            types = tuple(AckType(t) for t in raw)
        except ValueError:
            raise ProtocolError(f"acknowledge type in {raw} is not 0-3") from None
        if first < 0 or last < first or len(types) not in (1, last - first + 1):
            raise ProtocolError(f"acknowledgement batch {first}..{last} with {len(types)} types is malformed")
        out.append(AckBatch(first, last, types))
    return tuple(out)


def _read_acknowledgements(r: FlexReader, into: dict[Key, tuple[AckBatch, ...]]) -> None:
    """The topics array of ShareFetch and ShareAcknowledge: each partition's acknowledgement
    batches, added to `into` in request order (a partition named twice keeps both)."""
    for _ in range(r.compact_count()):
        tid = r.uuid()
        for _ in range(r.compact_count()):
            key = (tid, r.i32())
            into[key] = into.get(key, ()) + _ack_batches(r)
            r.skip_tags()
        r.skip_tags()


Key = tuple[uuid.UUID, int]   # (topic id, partition)


# --- ShareFetch ----------------------------------------------------------------------------


@dataclass(slots=True)
class ShareFetchRequest:
    group_id: str
    member_id: str
    session_epoch: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    max_records: int
    batch_size: int
    partitions: dict[Key, tuple[AckBatch, ...]] = field(default_factory=dict)   # in request order
    forgotten: list[Key] = field(default_factory=list)


def decode_share_fetch(r: FlexReader) -> ShareFetchRequest:
    """A topic may come twice (librdkafka lists added partitions, then acknowledging ones): merged."""
    group_id = r.compact_nullable_string()
    member_id = r.compact_nullable_string()
    if not group_id or not member_id:
        raise ProtocolError("ShareFetch without a group id or member id")
    epoch, wait, min_bytes, max_bytes, max_records, batch_size = (r.i32() for _ in range(6))
    req = ShareFetchRequest(group_id, member_id, epoch, wait, min_bytes, max_bytes, max_records, batch_size)
    _read_acknowledgements(r, req.partitions)
    for _ in range(r.compact_count()):
        tid = r.uuid()
        req.forgotten += [(tid, r.i32()) for _ in range(r.compact_count())]
        r.skip_tags()
    r.skip_tags()
    r.done()
    return req


@dataclass(slots=True)
class SharePartitionData:
    partition: int
    error: ShareError = ShareError.NONE
    message: str | None = None
    ack_error: ShareError = ShareError.NONE
    ack_message: str | None = None
    leader: int = -1
    records: bytearray = field(default_factory=bytearray)
    acquired: list[tuple[int, int, int]] = field(default_factory=list)   # (first, last, delivery count)


@dataclass(frozen=True, slots=True)
class Endpoint:
    node_id: int
    host: str
    port: int
    rack: str | None = None


def _leader(w: FlexWriter, leader: int) -> None:
    w.i32(leader).i32(0 if leader >= 0 else -1).tags()


def _endpoints(w: FlexWriter, endpoints: list[Endpoint]) -> None:
    w.count(len(endpoints))
    for e in endpoints:
        w.i32(e.node_id).string(e.host).i32(e.port).string(e.rack).tags()


def encode_share_fetch(correlation_id: int, error: ShareError, message: str | None, lock_ms: int,
                       topics: dict[uuid.UUID, list[SharePartitionData]], endpoints: list[Endpoint]) -> bytes:
    w = FlexWriter(correlation_id).i32(0).i16(error).string(message).i32(lock_ms).count(len(topics))
    for tid, parts in topics.items():
        w.uuid(tid).count(len(parts))
        for p in parts:
            w.i32(p.partition).i16(p.error).string(p.message).i16(p.ack_error).string(p.ack_message)
            _leader(w, p.leader)
            w.blob(p.records).count(len(p.acquired))
            for first, last, count in p.acquired:
                w.i64(first).i64(last).i16(count).tags()
            w.tags()
        w.tags()
    _endpoints(w, endpoints)
    return w.tags().frame()


# --- ShareAcknowledge ----------------------------------------------------------------------


@dataclass(slots=True)
class ShareAckRequest:
    group_id: str
    member_id: str
    session_epoch: int
    partitions: dict[Key, tuple[AckBatch, ...]] = field(default_factory=dict)


def decode_share_acknowledge(r: FlexReader) -> ShareAckRequest:
    group_id = r.compact_nullable_string()
    member_id = r.compact_nullable_string()
    if not group_id or not member_id:
        raise ProtocolError("ShareAcknowledge without a group id or member id")
    req = ShareAckRequest(group_id, member_id, r.i32())
    _read_acknowledgements(r, req.partitions)
    r.skip_tags()
    r.done()
    return req


def encode_share_acknowledge(correlation_id: int, error: ShareError, message: str | None,
                             topics: dict[uuid.UUID, list[tuple[int, ShareError, str | None, int]]],
                             endpoints: list[Endpoint]) -> bytes:
    """`topics`: per topic id, (partition, error, message, leader) of each partition."""
    w = FlexWriter(correlation_id).i32(0).i16(error).string(message).count(len(topics))
    for tid, parts in topics.items():
        w.uuid(tid).count(len(parts))
        for partition, err, msg, leader in parts:
            w.i32(partition).i16(err).string(msg)
            _leader(w, leader)
            w.tags()
        w.tags()
    _endpoints(w, endpoints)
    return w.tags().frame()
