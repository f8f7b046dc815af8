"""A minimal share-group client's frames: flexible requests built byte by byte, responses parsed.

Independent of memq's encoders (so codec tests check one side against the other), and small
enough to drive a broker through ShareGroupHeartbeat, ShareFetch and ShareAcknowledge in tests.
"""

from __future__ import annotations

import socket
import struct
import uuid
from dataclasses import dataclass, field

from memq.kafka_api.flexible import FlexReader, uvarint as uv

Key = tuple[uuid.UUID, int]



def cstr(s: str | None) -> bytes:
    if s is None:
        return b"\0"
    raw = s.encode()
    return uv(len(raw) + 1) + raw


def flex_request(api_key: int, version: int, correlation_id: int, body: bytes, client_id: str = "test") -> bytes:
    """Size prefix, request header v2 (client id as a classic nullable string, then tags), body."""
    cid = client_id.encode()
    head = struct.pack(">hhih", api_key, version, correlation_id, len(cid)) + cid + b"\0"
    return struct.pack(">i", len(head) + len(body)) + head + body


def heartbeat_body(group: str, member: str, epoch: int, topics: list[str] | None) -> bytes:
    out = cstr(group) + cstr(member) + struct.pack(">i", epoch) + cstr(None)
    if topics is None:
        out += b"\0"
    else:
        out += uv(len(topics) + 1) + b"".join(cstr(t) for t in topics)
    return out + b"\0"


Acks = list[tuple[int, int, int]]   # (first, last, type)


def _partitions(parts: dict[Key, Acks]) -> bytes:
    topics: dict[uuid.UUID, list[tuple[int, Acks]]] = {}
    for (tid, p), acks in parts.items():
        topics.setdefault(tid, []).append((p, acks))
    out = uv(len(topics) + 1)
    for tid, ps in topics.items():
        out += tid.bytes + uv(len(ps) + 1)
        for p, acks in ps:
            out += struct.pack(">i", p) + uv(len(acks) + 1)
            for first, last, t in acks:
                out += struct.pack(">qq", first, last) + uv(2) + struct.pack(">b", t) + b"\0"
            out += b"\0"
        out += b"\0"
    return out


def share_fetch_body(group: str, member: str, epoch: int, parts: dict[Key, Acks], *, max_records: int = 500,
                     max_wait_ms: int = 200, max_bytes: int = 1 << 20, forgotten: tuple[Key, ...] = ()) -> bytes:
    out = cstr(group) + cstr(member) + struct.pack(">iiiiii", epoch, max_wait_ms, 1, max_bytes, max_records, 500)
    out += _partitions(parts)
    out += uv(len(forgotten) + 1)
    for tid, p in forgotten:
        out += tid.bytes + uv(2) + struct.pack(">i", p) + b"\0"
    return out + b"\0"


def share_ack_body(group: str, member: str, epoch: int, parts: dict[Key, Acks]) -> bytes:
    return cstr(group) + cstr(member) + struct.pack(">i", epoch) + _partitions(parts) + b"\0"


def _response(raw: bytes, correlation_id: int | None = None) -> FlexReader:
    (size, corr) = struct.unpack_from(">ii", raw)
    assert size == len(raw) - 4
    assert correlation_id is None or corr == correlation_id
    r = FlexReader(raw, 8)
    r.skip_tags()
    return r


@dataclass
class Heartbeat:
    error: int
    member_id: str | None
    epoch: int
    interval_ms: int
    assignment: dict[uuid.UUID, list[int]] | None


def parse_heartbeat(raw: bytes) -> Heartbeat:
    r = _response(raw)
    r.i32()
    error, _msg, member, epoch, interval = r.i16(), r.compact_nullable_string(), r.compact_nullable_string(), r.i32(), r.i32()
    assignment = None
    if r.i8() == 1:
        assignment = {}
        for _ in range(r.compact_count()):
            tid = r.uuid()
            assignment[tid] = [r.i32() for _ in range(r.compact_count())]
            r.skip_tags()
        r.skip_tags()
    r.skip_tags()
    r.done()
    return Heartbeat(error, member, epoch, interval, assignment)


@dataclass
class FetchedShare:
    error: int
    ack_error: int
    leader: int
    records: bytes
    acquired: list[tuple[int, int, int]]


@dataclass
class ShareFetchResult:
    error: int
    message: str | None
    lock_ms: int
    parts: dict[Key, FetchedShare] = field(default_factory=dict)
    endpoints: list[tuple[int, str, int]] = field(default_factory=list)


def parse_share_fetch(raw: bytes) -> ShareFetchResult:
    r = _response(raw)
    r.i32()
    out = ShareFetchResult(r.i16(), r.compact_nullable_string(), r.i32())
    for _ in range(r.compact_count()):
        tid = r.uuid()
        for _ in range(r.compact_count()):
            p, err, _m, ack_err, _am = r.i32(), r.i16(), r.compact_nullable_string(), r.i16(), r.compact_nullable_string()
            leader, _epoch = r.i32(), r.i32()
            r.skip_tags()
            records = bytes(r.compact_bytes() or b"")
            acquired = []
            for _ in range(r.compact_count()):
                acquired.append((r.i64(), r.i64(), r.i16()))
                r.skip_tags()
            r.skip_tags()
            out.parts[(tid, p)] = FetchedShare(err, ack_err, leader, records, acquired)
        r.skip_tags()
    for _ in range(r.compact_count()):
        out.endpoints.append((r.i32(), r.compact_string(), r.i32()))
        r.compact_nullable_string()
        r.skip_tags()
    r.skip_tags()
    r.done()
    return out


def parse_share_ack(raw: bytes) -> tuple[int, dict[Key, int]]:
    r = _response(raw)
    r.i32()
    error, _ = r.i16(), r.compact_nullable_string()
    parts = {}
    for _ in range(r.compact_count()):
        tid = r.uuid()
        for _ in range(r.compact_count()):
            p, err, _m = r.i32(), r.i16(), r.compact_nullable_string()
            r.i32(), r.i32()
            r.skip_tags()
            r.skip_tags()
            parts[(tid, p)] = err
        r.skip_tags()
    for _ in range(r.compact_count()):
        r.i32(), r.compact_string(), r.i32(), r.compact_nullable_string()
        r.skip_tags()
    r.skip_tags()
    r.done()
    return error, parts


class ShareClient:
    """One blocking connection to a Kafka listener, one request at a time."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self._corr = 0

    def call(self, api_key: int, body: bytes, version: int = 1) -> bytes:
        self._corr += 1
        self.sock.sendall(flex_request(api_key, version, self._corr, body))
        return self.read()

    def sasl_plain(self, user: str, password: str) -> int:
        """SaslHandshake v1 (PLAIN), then SaslAuthenticate v1: the latter's error code."""
        def string(v: str) -> bytes:
            return struct.pack(">h", len(v.encode())) + v.encode()

        for api_key, body in ((17, string("PLAIN")),
                              (36, struct.pack(">i", len(user) + len(password) + 2) + b"\0%s\0%s" % (
                                  user.encode(), password.encode()))):
            self._corr += 1
            head = struct.pack(">hhi", api_key, 1, self._corr) + string("test")
            self.sock.sendall(struct.pack(">i", len(head) + len(body)) + head + body)
            (error,) = struct.unpack_from(">h", self.read(), 8)
            if error:
                return int(error)
        return 0

    def send_raw(self, frame: bytes) -> None:
        self.sock.sendall(frame)

    def read(self) -> bytes:
        head = self._exactly(4)
        return head + self._exactly(struct.unpack(">i", head)[0])

    def _exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by the broker")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()


# --- share-group offsets: DescribeShareGroupOffsets (90), Alter- (91), DeleteShareGroupOffsets (92), v0 ---


def _int32s(items: list[int]) -> bytes:
    return uv(len(items) + 1) + b"".join(struct.pack(">i", i) for i in items)


def describe_offsets_body(groups: dict[str, dict[str, list[int]] | None]) -> bytes:
    """Per group, its topics' partitions (None: every share-partition it has state for)."""
    out = uv(len(groups) + 1)
    for g, topics in groups.items():
        out += cstr(g)
        if topics is None:
            out += b"\0"
        else:
            out += uv(len(topics) + 1) + b"".join(cstr(t) + _int32s(ps) + b"\0" for t, ps in topics.items())
        out += b"\0"
    return out + b"\0"


def alter_offsets_body(group: str, topics: dict[str, dict[int, int]]) -> bytes:
    out = cstr(group) + uv(len(topics) + 1)
    for t, parts in topics.items():
        out += cstr(t) + uv(len(parts) + 1)
        out += b"".join(struct.pack(">iq", p, off) + b"\0" for p, off in parts.items())
        out += b"\0"
    return out + b"\0"


def delete_offsets_body(group: str, topics: dict[str, list[int]]) -> bytes:
    return cstr(group) + uv(len(topics) + 1) + b"".join(cstr(t) + _int32s(ps) + b"\0" for t, ps in topics.items()) + b"\0"


@dataclass
class GroupOffsets:
    error: int
    message: str | None
    starts: dict[tuple[str, int], tuple[int, int]]   # (topic, partition) -> (start offset, error)
    topic_ids: dict[str, uuid.UUID]


def parse_describe_offsets(raw: bytes) -> dict[str, GroupOffsets]:
    r = _response(raw)
    r.i32()
    out = {}
    for _ in range(r.compact_count()):
        gid = r.compact_string()
        starts, ids = {}, {}
        for _ in range(r.compact_count()):
            name = r.compact_string()
            ids[name] = r.uuid()
            for _ in range(r.compact_count()):
                p, start, _epoch, err, _m = r.i32(), r.i64(), r.i32(), r.i16(), r.compact_nullable_string()
                r.skip_tags()
                starts[(name, p)] = (start, err)
            r.skip_tags()
        error, message = r.i16(), r.compact_nullable_string()
        r.skip_tags()
        out[gid] = GroupOffsets(error, message, starts, ids)
    r.skip_tags()
    r.done()
    return out


def parse_changed_offsets(raw: bytes) -> tuple[int, dict[tuple[str, int], int]]:
    """(top-level error, (topic, partition) -> error) of an Alter- or DeleteShareGroupOffsets answer."""
    r = _response(raw)
    r.i32()
    error, _ = r.i16(), r.compact_nullable_string()
    parts = {}
    for _ in range(r.compact_count()):
        name = r.compact_string()
        r.uuid()
        for _ in range(r.compact_count()):
            p, err, _m = r.i32(), r.i16(), r.compact_nullable_string()
            r.skip_tags()
            parts[(name, p)] = err
        r.skip_tags()
    r.skip_tags()
    r.done()
    return error, parts


def list_groups_body(states: list[str], types: list[str]) -> bytes:
    """A ListGroups v5 request body (v5: flexible, states and types filters)."""
    return uv(len(states) + 1) + b"".join(cstr(s) for s in states) + uv(len(types) + 1) + b"".join(
        cstr(t) for t in types) + b"\0"


def parse_list_groups_v5(raw: bytes) -> tuple[int, dict[str, tuple[str, str, str]]]:
    """(error, group -> (protocol type, state, type)) of a ListGroups v5 answer."""
    r = _response(raw)
    r.i32()
    error = r.i16()
    groups = {}
    for _ in range(r.compact_count()):
        gid = r.compact_string()
        groups[gid] = (r.compact_string(), r.compact_string(), r.compact_string())
        r.skip_tags()
    r.skip_tags()
    r.done()
    return error, groups
