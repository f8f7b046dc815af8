"""Kafka consumer groups' messages memq itself sends or answers by hand, sans I/O.

memq coordinates Kafka clients' groups itself (`memq.broker.group`; the door's group calls are
decoded by `messages`). What stays here: FindCoordinator as the door answers it and as memq
asks the notification Kafka (where memq's own Consumer keeps its groups), the OffsetCommit a
committed transaction sends there for such a group, the OffsetFetch that reads a Kafka client
group's offsets committed through the relay memq used before (`mapped_group`: the migration
path), and how a share group is described (`Described`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from memq.errors import ProtocolError

from .protocol import ApiKey, ErrorCode, Reader, RequestHeader, Writer

_I16 = struct.Struct(">h")
_SIZE = struct.Struct(">i")


def mapped_group(cluster: str, group: str) -> str:
    """The notification Kafka's group that holds Kafka client group `group` of memq `cluster`
    (apart from memq's own consumer groups there)."""
    return f"memq.{cluster}.kafka.{group}"


def decode_find_coordinator(h: RequestHeader, r: Reader) -> tuple[str, int]:
    """(key, key type: 0 group, 1 transaction)."""
    key = r.string()
    key_type = r.i8() if h.api_version >= 1 else 0
    r.done()
    return key, key_type


def encode_find_coordinator(h: RequestHeader, error: ErrorCode, node_id: int, host: str, port: int,
                            message: str | None = None) -> bytes:
    w = Writer(h.correlation_id)
    if h.api_version >= 1:
        w.i32(0)
    w.i16(error)
    if h.api_version >= 1:
        w.nullable_string(message)
    return w.i32(node_id).nullable_string(host).i32(port).frame()


def find_coordinator_request(correlation_id: int, group: str, client_id: str) -> bytes:
    """A FindCoordinator v0 request for `group` (what memq asks the notification Kafka)."""
    body = struct.pack(">hhi", ApiKey.FIND_COORDINATOR, 0, correlation_id)
    for s in (client_id, group):
        raw = s.encode()
        body += _I16.pack(len(raw)) + raw
    return _SIZE.pack(len(body)) + body


def decode_find_coordinator_response(frame: bytes) -> tuple[int, str, int]:
    """(error code, host, port) of a FindCoordinator v0 response (size prefix removed)."""
    r = Reader(frame)
    r.i32()   # correlation id
    error, _node = r.i16(), r.i32()
    host, port = r.string(), r.i32()
    r.done()
    if not 0 < port < 65536 and not error:
        raise ProtocolError(f"FindCoordinator answered port {port}")
    return error, host, port


@dataclass(frozen=True, slots=True)
class Described:
    """A group DescribeGroups answers without relaying it: refused, or a share group memq keeps.
    `members`: (member id, client id, client host), with no protocol metadata or assignment."""

    group: str
    error: ErrorCode = ErrorCode.NONE
    state: str = ""
    protocol_type: str = ""
    members: tuple[tuple[str, str, str], ...] = ()


def commit_errors(h: RequestHeader, response: bytes) -> dict[tuple[str, int], int]:
    """(topic, partition) -> error code of an OffsetCommit response (size-prefixed)."""
    r = Reader(response, 8)
    if h.api_version >= 3:
        r.i32()
    out = {}
    for _ in range(r.count()):
        topic = r.string()
        for _ in range(r.count()):
            p = r.i32()
            out[(topic, p)] = r.i16()
    return out


def offset_fetch_request(correlation_id: int, client_id: str, group: str, topics: dict[str, list[int]]) -> bytes:
    """An OffsetFetch v1 request (size-prefixed) for (mapped) `group`'s offsets of `topics`."""
    w = Writer(0)
    w.out[4:8] = struct.pack(">hh", ApiKey.OFFSET_FETCH, 1)
    w.i32(correlation_id).nullable_string(client_id).nullable_string(group).i32(len(topics))
    for name, parts in topics.items():
        w.nullable_string(name).i32(len(parts))
        for p in parts:
            w.i32(p)
    return w.frame()


def decode_offset_fetch_v1(response: bytes) -> dict[tuple[str, int], int]:
    """(topic, partition) -> committed offset (-1: none) of an OffsetFetch v1 response (size-prefixed)."""
    r = Reader(response, 8)
    out = {}
    for _ in range(r.count()):
        topic = r.string()
        for _ in range(r.count()):
            p, offset = r.i32(), r.i64()
            r.nullable_string()
            error = r.i16()
            out[(topic, p)] = offset if not error else -1
    r.done()
    return out


def offset_commit_request(correlation_id: int, client_id: str, group: str, generation: int, member_id: str,
                          topics: dict[str, list[tuple[int, int, str]]]) -> bytes:
    """An OffsetCommit v2 request (size-prefixed) committing `topics` (notification topic ->
    [(partition, offset, metadata)]) for `group` as the member (`generation`, `member_id`): a
    committed transaction's offsets, or an OffsetDelete's -1s."""
    w = Writer(0)
    w.out[4:8] = struct.pack(">hh", ApiKey.OFFSET_COMMIT, 2)
    w.i32(correlation_id).nullable_string(client_id).nullable_string(group)
    w.i32(generation).nullable_string(member_id).i64(-1).i32(len(topics))   # retention time: the broker's
    for name, parts in topics.items():
        w.nullable_string(name).i32(len(parts))
        for p, offset, metadata in parts:
            w.i32(p).i64(offset).nullable_string(metadata)
    return w.frame()
