"""Kafka consumer groups, sans I/O: what memq relays to the notification Kafka's coordinator.

memq keeps no group state of its own: a Kafka client's group (membership, rebalances,
committed offsets) lives in the notification Kafka's group coordinator, under a mapped name
(`mapped_group`), so it is as durable and as failover-safe as that Kafka's `__consumer_offsets`,
and any memq broker can be a client's coordinator. The group APIs' requests (JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch) all start with the group id, so a
request is relayed with that one field rewritten (`with_group`) and its response goes back
unchanged; assignments and protocol metadata are opaque to a coordinator, and committed
offsets are memq's Kafka offsets stored as they are, under the memq topic's name.
DeleteGroups is relayed one group at a time (each group to its own coordinator) and answered
as one response. A group request the ACLs refuse is answered here (`refusal`, in its API's
shape), never relayed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from collections.abc import Callable, Sequence

from memq.errors import ProtocolError

from .flexible import FlexReader, FlexWriter
from .protocol import ApiKey, ErrorCode, Reader, RequestHeader, Writer


#: The group APIs relayed as they are (FindCoordinator is answered by the broker itself).
RELAYED = frozenset({ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.JOIN_GROUP, ApiKey.HEARTBEAT,
                     ApiKey.LEAVE_GROUP, ApiKey.SYNC_GROUP})

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_SIZE = struct.Struct(">i")


def mapped_group(cluster: str, group: str) -> str:
    """The notification Kafka's group that holds Kafka client group `group` of memq `cluster`
    (apart from memq's own consumer groups there)."""
    return f"memq.{cluster}.kafka.{group}"


def group_of(body: Reader) -> str:
    """The group id a relayed request starts with (the reader is left where it was)."""
    return Reader(body.buf, body.pos).string()


def with_group(frame: bytes | memoryview, body_at: int, group: str) -> bytes:
    """The size-prefixed request `frame` (no size prefix given) with its leading group id, at
    `body_at`, replaced by `group`."""
    r = Reader(frame, body_at)
    r.string()
    raw = group.encode()
    out = bytes(frame[:body_at]) + _I16.pack(len(raw)) + raw + bytes(frame[r.pos:])
    return _SIZE.pack(len(out)) + out


def with_size(frame: bytes | memoryview) -> bytes:
    """A request frame relayed unchanged, size-prefixed."""
    return _SIZE.pack(len(frame)) + bytes(frame)


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


class _Rewrite:
    """Copies a frame field by field, renaming topic strings through a mapping."""

    def __init__(self, frame: bytes | memoryview, at: int, names: dict[str, str]) -> None:
        self.r = Reader(frame, at)
        self.out = bytearray(frame[:at])
        self.names = names

    def copy(self, n: int) -> None:
        start = self.r.pos
        raw = self.r.nullable_bytes(n)
        assert raw is not None
        self.out += self.r.buf[start:self.r.pos]

    def string(self, rename: bool = False) -> None:
        start = self.r.pos
        s = self.r.nullable_string()
        if rename and s is not None and s in self.names:
            raw = self.names[s].encode()
            self.out += _I16.pack(len(raw)) + raw
        else:
            self.out += self.r.buf[start:self.r.pos]

    def count(self, nullable: bool = False) -> int:
        start = self.r.pos
        n = self.r.count(nullable)
        self.out += self.r.buf[start:self.r.pos]
        return max(n, 0)

    def rest(self) -> bytes:
        self.out += self.r.buf[self.r.pos:]
        return bytes(self.out)


def offsets_request(h: RequestHeader, frame: bytes | memoryview, body_at: int, group: str,
                    topics: dict[str, str]) -> bytes:
    """An OffsetCommit (v2-7) or OffsetFetch (v1-5) request for the mapped `group`, its memq topic
    names renamed to their notification topics (the coordinator knows only topics of its Kafka),
    size-prefixed. Other requests: `with_group`."""
    if h.api_key not in (ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH):
        return with_group(frame, body_at, group)
    w = _Rewrite(with_group(frame, body_at, group)[4:], body_at, topics)
    w.string()   # the group, already mapped
    v = h.api_version
    if h.api_key == ApiKey.OFFSET_COMMIT:
        w.copy(4)
        w.string()          # generation, member id
        if v >= 7:
            w.string()      # group instance id
        if v <= 4:
            w.copy(8)       # retention time
        for _ in range(w.count()):
            w.string(rename=True)
            for _ in range(w.count()):
                w.copy(12 + (4 if v >= 6 else 0))
                w.string()  # metadata
    else:
        for _ in range(w.count(nullable=v >= 2)):
            w.string(rename=True)
            w.copy(4 * w.count())
    w.r.done()
    out = w.rest()
    return _SIZE.pack(len(out)) + out


def offsets_response(h: RequestHeader, response: bytes, topics: dict[str, str]) -> bytes:
    """An OffsetCommit or OffsetFetch response (size-prefixed) with notification topic names
    renamed back to memq's (`topics`: notification topic -> memq topic)."""
    if h.api_key not in (ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH):
        return response
    v = h.api_version
    w = _Rewrite(response[4:], 4, topics)   # after the correlation id
    if v >= 3:
        w.copy(4)   # throttle time
    for _ in range(w.count()):
        w.string(rename=True)
        for _ in range(w.count()):
            if h.api_key == ApiKey.OFFSET_COMMIT:
                w.copy(6)
            else:
                w.copy(12 + (4 if v >= 5 else 0))
                w.string()
                w.copy(2)
    out = w.rest()
    return _SIZE.pack(len(out)) + out


def describe_groups_request(h: RequestHeader, frame: bytes | memoryview, body_at: int, cluster: str,
                            only: Sequence[str] | None = None) -> bytes:
    """A DescribeGroups (v0-4) request with every group id mapped (of `only` when given: the
    groups the principal may describe), size-prefixed."""
    r = Reader(frame, body_at)
    asked = [r.string() for _ in range(r.count())]
    groups = [mapped_group(cluster, g) for g in (asked if only is None else only)]
    out = bytearray(frame[:body_at]) + _I32.pack(len(groups))
    for g in groups:
        raw = g.encode()
        out += _I16.pack(len(raw)) + raw
    out += r.buf[r.pos:]   # include_authorized_operations (v3+)
    return _SIZE.pack(len(out)) + bytes(out)


def describe_groups_response(h: RequestHeader, response: bytes, cluster: str) -> bytes:
    """A DescribeGroups response with the mapped group ids named as the client knows them."""
    prefix = mapped_group(cluster, "")
    w = _Rewrite(response[4:], 4, {})
    if h.api_version >= 1:
        w.copy(4)
    for _ in range(w.count()):
        w.copy(2)
        start = w.r.pos
        group = w.r.string()
        if group.startswith(prefix):
            raw = group[len(prefix):].encode()
            w.out += _I16.pack(len(raw)) + raw
        else:
            w.out += w.r.buf[start:w.r.pos]
        for _ in range(3):
            w.string()   # state, protocol type, protocol data
        for _ in range(w.count()):
            w.string()
            if h.api_version >= 4:
                w.string()   # group instance id
            w.string()
            w.string()       # client id, client host
            for _ in range(2):
                w.copy(4 + max(Reader(w.r.buf, w.r.pos).i32(), 0))   # member metadata, assignment
        if h.api_version >= 3:
            w.copy(4)
    w.r.done()
    out = w.rest()
    return _SIZE.pack(len(out)) + out


def list_groups_response(h: RequestHeader, response: bytes, cluster: str,
                         visible: Callable[[str], bool] = lambda _group: True,
                         also: Sequence[tuple[str, str]] = ()) -> bytes:
    """A ListGroups (v0-2) response listing only this cluster's Kafka client groups that are
    `visible` (the principal may describe them), by their names, then the (group, protocol type)
    of `also` (groups kept by memq itself: share groups)."""
    prefix = mapped_group(cluster, "")
    r = Reader(response[4:])
    w = Writer(r.i32())
    if h.api_version >= 1:
        w.i32(r.i32())
    w.i16(r.i16())
    listed = []
    for _ in range(r.count()):
        group, protocol_type = r.string(), r.string()
        if group.startswith(prefix) and visible(group[len(prefix):]):
            listed.append((group[len(prefix):], protocol_type))
    r.done()
    listed += also
    w.i32(len(listed))
    for group, protocol_type in listed:
        w.nullable_string(group).nullable_string(protocol_type)
    return w.frame()


#: A group ListGroups lists: (group id, protocol type, state, type); state and type from v4 and v5.
Listed = tuple[str, str, str, str]


def list_groups_filters(h: RequestHeader, r: FlexReader) -> tuple[frozenset[str], frozenset[str]]:
    """The (states, types) a flexible ListGroups (v3-5) request lists only, lowercased (empty: any)."""
    states = frozenset(r.compact_string().lower() for _ in range(r.compact_count())) if h.api_version >= 4 else frozenset()
    types = frozenset(r.compact_string().lower() for _ in range(r.compact_count())) if h.api_version >= 5 else frozenset()
    r.skip_tags()
    r.done()
    return states, types


def list_groups_flex_response(h: RequestHeader, response: bytes, cluster: str, visible: Callable[[str], bool],
                              also: Sequence[Listed], types: frozenset[str] = frozenset()) -> bytes:
    """`list_groups_response` for the flexible versions (v3-5): the coordinator's answer with this
    cluster's visible groups by their names, only those of `types` when given (tansu answers
    every type whatever the filter), then `also` (in the request's version's fields)."""
    v = h.api_version
    prefix = mapped_group(cluster, "")
    r = FlexReader(response, 4)
    w = FlexWriter(r.i32())
    r.skip_tags()
    w.i32(r.i32()).i16(r.i16())
    listed: list[Listed] = []
    for _ in range(r.compact_count()):
        group, protocol_type = r.compact_string(), r.compact_string()
        state = r.compact_string() if v >= 4 else ""
        group_type = r.compact_string() if v >= 5 else ""
        r.skip_tags()
        if group.startswith(prefix) and visible(group[len(prefix):]) and (not types or group_type.lower() in types):
            listed.append((group[len(prefix):], protocol_type, state, group_type))
    r.skip_tags()
    r.done()
    listed += also
    w.count(len(listed))
    for group, protocol_type, state, group_type in listed:
        w.string(group).string(protocol_type)
        if v >= 4:
            w.string(state)
        if v >= 5:
            w.string(group_type)
        w.tags()
    return w.tags().frame()


@dataclass(frozen=True, slots=True)
class Described:
    """A group DescribeGroups answers without relaying it: refused, or a share group memq keeps.
    `members`: (member id, client id, client host), with no protocol metadata or assignment."""

    group: str
    error: ErrorCode = ErrorCode.NONE
    state: str = ""
    protocol_type: str = ""
    members: tuple[tuple[str, str, str], ...] = ()


def with_described(h: RequestHeader, response: bytes, described: Sequence[Described]) -> bytes:
    """A DescribeGroups response (size-prefixed) with an entry for each of `described` added."""
    if not described:
        return response
    head = 8 + (4 if h.api_version >= 1 else 0)   # size, correlation id, throttle time
    (count,) = _I32.unpack_from(response, head)
    w = Writer(0)
    for d in described:
        w.i16(d.error).nullable_string(d.group)
        w.nullable_string(d.state).nullable_string(d.protocol_type).nullable_string("").i32(len(d.members))
        for member_id, client_id, client_host in d.members:
            w.nullable_string(member_id)
            if h.api_version >= 4:
                w.nullable_string(None)   # group instance id
            w.nullable_string(client_id).nullable_string(client_host).i32(0).i32(0)   # no metadata, assignment
        if h.api_version >= 3:
            w.i32(-2147483648)   # authorized operations: not asked for
    entries = w.frame()[8:]      # without the size and correlation id
    out = response[4:head] + _I32.pack(count + len(described)) + response[head + 4:] + entries
    return _SIZE.pack(len(out)) + out


def describe_groups_of(r: Reader) -> list[str]:
    """The group ids a DescribeGroups request names (the reader is left where it was)."""
    r = Reader(r.buf, r.pos)
    return [r.string() for _ in range(r.count())]


def refusal(h: RequestHeader, frame: bytes | memoryview, body_at: int, error: ErrorCode) -> bytes:
    """The answer to a group request (one of RELAYED) refused without relaying it: `error` in its
    API's response shape; for OffsetCommit on each partition it names, as Kafka answers."""
    w = Writer(h.correlation_id)
    v = h.api_version
    if h.api_key == ApiKey.OFFSET_COMMIT:
        if v >= 3:
            w.i32(0)
        topics = _commit_partitions(v, Reader(frame, body_at))
        w.i32(len(topics))
        for name, parts in topics:
            w.nullable_string(name).i32(len(parts))
            for p, _offset in parts:
                w.i32(p).i16(error)
        return w.frame()
    if h.api_key == ApiKey.OFFSET_FETCH:
        if v >= 3:
            w.i32(0)
        if v >= 2:
            return w.i32(0).i16(error).frame()
        asked = _fetch_partitions(Reader(frame, body_at))   # v1: no group-level error code
        w.i32(len(asked))
        for name, partitions in asked:
            w.nullable_string(name).i32(len(partitions))
            for p in partitions:
                w.i32(p).i64(-1).nullable_string("").i16(error)
        return w.frame()
    if h.api_key == ApiKey.JOIN_GROUP:
        if v >= 2:
            w.i32(0)
        return w.i16(error).i32(-1).nullable_string("").nullable_string("").nullable_string("").i32(0).frame()
    if v >= 1:   # SyncGroup, Heartbeat, LeaveGroup
        w.i32(0)
    w.i16(error)
    if h.api_key == ApiKey.SYNC_GROUP:
        w.nullable_bytes(b"")
    elif h.api_key == ApiKey.LEAVE_GROUP and v >= 3:
        w.i32(0)   # no members
    return w.frame()


def committed_offsets(h: RequestHeader, frame: bytes | memoryview, body_at: int) -> list[tuple[str, int, int]]:
    """(topic, partition, offset) of each offset an OffsetCommit v2-7 request commits."""
    return [(t, p, o) for t, parts in _commit_partitions(h.api_version, Reader(frame, body_at)) for p, o in parts]


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


def _commit_partitions(v: int, r: Reader) -> list[tuple[str, list[tuple[int, int]]]]:
    """(topic, [(partition, offset)]) an OffsetCommit v2-7 request commits."""
    r.string()
    r.i32()
    r.string()                  # group, generation, member id
    if v >= 7:
        r.nullable_string()     # group instance id
    if v <= 4:
        r.i64()                 # retention time
    out = []
    for _ in range(r.count()):
        name, parts = r.string(), []
        for _ in range(r.count()):
            parts.append((r.i32(), r.i64()))
            if v >= 6:
                r.i32()         # leader epoch
            r.nullable_string()
        out.append((name, parts))
    return out


def _fetch_partitions(r: Reader) -> list[tuple[str, list[int]]]:
    """(topic, partitions) an OffsetFetch v1 request asks for."""
    r.string()
    out = []
    for _ in range(r.count()):
        name = r.string()
        out.append((name, [r.i32() for _ in range(r.count())]))
    return out


def decode_delete_groups(r: Reader) -> list[str]:
    """The groups a DeleteGroups (v0-1) request names."""
    groups = [r.string() for _ in range(r.count())]
    r.done()
    return groups


def delete_group_request(frame: bytes | memoryview, body_at: int, group: str) -> bytes:
    """The DeleteGroups request `frame` (same header) for the one (mapped) `group`, size-prefixed."""
    raw = group.encode()
    out = bytes(frame[:body_at]) + _I32.pack(1) + _I16.pack(len(raw)) + raw
    return _SIZE.pack(len(out)) + out


def delete_group_result(response: bytes) -> int:
    """The error code a DeleteGroups response (size-prefixed, for one group) gives its group."""
    r = Reader(response, 8)   # size, correlation id
    r.i32()                   # throttle time
    if r.count() != 1:
        raise ProtocolError("DeleteGroups answered for other than the one group asked")
    r.string()
    error = r.i16()
    r.done()
    return error


def encode_delete_groups(h: RequestHeader, results: Sequence[tuple[str, int]]) -> bytes:
    w = Writer(h.correlation_id).i32(0).i32(len(results))
    for group, error in results:
        w.nullable_string(group).i16(error)
    return w.frame()


def rejoin_as(h: RequestHeader, response: bytes) -> str | None:
    """The member id to join again with, when a coordinator answered a JoinGroup v0-3 (`response`,
    size-prefixed) MEMBER_ID_REQUIRED: an answer Kafka gives only from v4 on (KIP-394), which such
    a member cannot act on (it retries with no id, forever). None for any other answer."""
    if h.api_key != ApiKey.JOIN_GROUP or h.api_version >= 4:
        return None
    r = Reader(response, 8)   # size, correlation id
    if h.api_version >= 2:
        r.i32()               # throttle time
    if r.i16() != ErrorCode.MEMBER_ID_REQUIRED:
        return None
    r.i32()
    r.string()
    r.string()                # generation, protocol, leader
    member = r.string()
    return member or None


def with_member_id(h: RequestHeader, request: bytes, member: str) -> bytes:
    """The size-prefixed JoinGroup v0-5 `request` (as relayed: group already mapped) with its
    member id replaced by `member`."""
    r = Reader(request, 4)
    r.i16()
    r.i16()
    r.i32()
    r.nullable_string()       # api key, version, correlation id, client id
    r.string()
    r.i32()                   # group, session timeout
    if h.api_version >= 1:
        r.i32()               # rebalance timeout
    at = r.pos
    r.string()
    raw = member.encode()
    out = request[4:at] + _I16.pack(len(raw)) + raw + request[r.pos:]
    return _SIZE.pack(len(out)) + out


@dataclass(frozen=True, slots=True)
class OffsetDelete:
    """An OffsetDelete (v0) request: the group and the (topic, partitions) whose offsets go."""

    group: str
    topics: tuple[tuple[str, tuple[int, ...]], ...]


def decode_offset_delete(r: Reader) -> OffsetDelete:
    group = r.string()
    topics = []
    for _ in range(r.count()):
        name = r.string()
        topics.append((name, tuple(r.i32() for _ in range(r.count()))))
    r.done()
    return OffsetDelete(group, tuple(topics))


def offset_delete_commit(correlation_id: int, client_id: str, group: str, topics: dict[str, list[int]]) -> bytes:
    """An OffsetCommit v2 request (size-prefixed) that deletes (mapped) `group`'s offsets of
    `topics` (notification topics) by committing -1, Kafka's "no committed offset", with no
    generation: any coordinator takes it (tansu serves no OffsetDelete), only for a group with
    no members (an active one answers UNKNOWN_MEMBER_ID), and every client then starts from its
    `auto.offset.reset` as after an OffsetDelete."""
    return offset_commit_request(correlation_id, client_id, group, -1, "",
                                 {name: [(p, -1, "") for p in parts] for name, parts in topics.items()})


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


#: What an OffsetCommit error means to an OffsetDelete: the group has members (Kafka then keeps
#: the offsets of the topics they are subscribed to).
_DELETE_ERRORS: dict[int, int] = {ErrorCode.UNKNOWN_MEMBER_ID: ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC,
                                  ErrorCode.ILLEGAL_GENERATION: ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC}


def encode_offset_delete(h: RequestHeader, error: int, topics: Sequence[tuple[str, Sequence[tuple[int, int]]]]
                         ) -> bytes:
    """An OffsetDelete v0 response: the group's error, then each (topic, [(partition, error)]);
    an OffsetCommit error is mapped to what OffsetDelete says for it (`_DELETE_ERRORS`)."""
    w = Writer(h.correlation_id).i16(error).i32(0).i32(len(topics))
    for name, parts in topics:
        w.nullable_string(name).i32(len(parts))
        for p, e in parts:
            w.i32(p).i16(_DELETE_ERRORS.get(e, e))
    return w.frame()
