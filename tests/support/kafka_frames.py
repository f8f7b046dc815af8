"""Test-side Kafka encoders: RecordBatch v2 (as a producer writes it) and request frames.

Independent of memq's decoders so the tests check them against Kafka's layout, not against
themselves; the real-client tests (confluent-kafka, kcat) check the same paths end to end.
"""

from __future__ import annotations

import gzip
import socket
import struct
from collections.abc import Sequence
from typing import Any

import cramjam
import zstandard
from crc32c import crc32c

from memq.format import LogMessage

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def zigzag(n: int) -> bytes:
    v = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(b: bytes | None) -> bytes:
    return zigzag(-1) if b is None else zigzag(len(b)) + b


def record_batch(records: Sequence[LogMessage], *, codec: str = "none", producer_id: int = -1,
                 epoch: int = -1, base_sequence: int = -1, xerial: bool = False, zstd_size: bool = True) -> bytes:
    """One RecordBatch v2 holding `records` (CreateTime, timestamps as given); `zstd_size=False`
    leaves the zstd frame's size out, as the Java client's streaming compressor does."""
    base_ts = records[0].timestamp_ms if records else 0
    body = bytearray()
    for i, r in enumerate(records):
        rec = (b"\x00" + zigzag(r.timestamp_ms - base_ts) + zigzag(i) + _field(r.key) + _field(r.value)
               + zigzag(len(r.headers)) + b"".join(_field(k.encode()) + _field(v) for k, v in r.headers))
        body += zigzag(len(rec)) + rec
    raw = bytes(body)
    if codec == "gzip":
        raw = gzip.compress(raw)
    elif codec == "snappy":
        block = bytes(cramjam.snappy.compress_raw(raw))
        raw = (b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(block)) + block
               if xerial else block)
    elif codec == "lz4":
        raw = bytes(cramjam.lz4.compress(raw))
    elif codec == "zstd":
        raw = zstandard.ZstdCompressor(write_content_size=zstd_size).compress(raw)
    max_ts = max((r.timestamp_ms for r in records), default=0)
    after_crc = struct.pack(">hiqqqhii", CODECS[codec], max(len(records) - 1, 0), base_ts, max_ts,
                            producer_id, epoch, base_sequence, len(records)) + raw
    head = struct.pack(">qiib", 0, 4 + 1 + 4 + len(after_crc), 0, 2)
    return head + struct.pack(">I", crc32c(after_crc)) + after_crc


def _str(s: str | None) -> bytes:
    return struct.pack(">h", -1) if s is None else struct.pack(">h", len(s.encode())) + s.encode()


def request(api_key: int, version: int, correlation_id: int, body: bytes, client_id: str = "test") -> bytes:
    """A size-prefixed request with header v1 (the non-flexible versions memq serves)."""
    payload = struct.pack(">hhi", api_key, version, correlation_id) + _str(client_id) + body
    return struct.pack(">i", len(payload)) + payload


def produce_body(topic: str, partition: int, records: bytes, *, acks: int = -1, timeout_ms: int = 5000) -> bytes:
    """A Produce v3..v8 request body with one topic and one partition."""
    return (_str(None) + struct.pack(">hii", acks, timeout_ms, 1) + _str(topic)
            + struct.pack(">iii", 1, partition, len(records)) + records)


def fetch_body(version: int, parts: list[tuple[str, int, int, int]], *, max_wait_ms: int = 100, min_bytes: int = 1,
               max_bytes: int = 1 << 20, rack: str = "") -> bytes:
    """A Fetch v4..v11 request body: one topic entry per (topic, partition, offset, partition max bytes),
    as librdkafka and the Java client lay it out (session fields for a sessionless full fetch)."""
    body = struct.pack(">iiiib", -1, max_wait_ms, min_bytes, max_bytes, 0)
    if version >= 7:
        body += struct.pack(">ii", 0, -1)
    body += struct.pack(">i", len(parts))
    for topic, partition, offset, limit in parts:
        body += _str(topic) + struct.pack(">ii", 1, partition)
        if version >= 9:
            body += struct.pack(">i", -1)
        body += struct.pack(">q", offset)
        if version >= 5:
            body += struct.pack(">q", -1)
        body += struct.pack(">i", limit)
    if version >= 7:
        body += struct.pack(">i", 0)
    if version >= 11:
        body += _str(rack)
    return body


def list_offsets_body(version: int, topic: str, parts: list[tuple[int, int]]) -> bytes:
    """A ListOffsets v1..v5 request body for (partition, timestamp) pairs of one topic."""
    body = struct.pack(">i", -1) + (struct.pack(">b", 0) if version >= 2 else b"") + struct.pack(">i", 1)
    body += _str(topic) + struct.pack(">i", len(parts))
    for partition, ts in parts:
        body += struct.pack(">i", partition) + (struct.pack(">i", -1) if version >= 4 else b"") + struct.pack(">q", ts)
    return body


def group_bodies(group: str, topic: str) -> dict[tuple[int, int], bytes]:
    """A well-formed request body per (API key, version) of the group APIs (FindCoordinator v2,
    JoinGroup v5, SyncGroup v3, Heartbeat v3, LeaveGroup v3, OffsetCommit v7, OffsetFetch v5,
    DescribeGroups v4, ListGroups v2), for one member of `group` reading partition 0 of `topic`."""
    member, meta = _str("member-1"), struct.pack(">i", 4) + b"meta"
    return {
        (10, 2): _str(group) + b"\x00",
        (11, 5): (_str(group) + struct.pack(">ii", 10_000, 10_000) + _str("") + _str(None) + _str("consumer")
                  + struct.pack(">i", 1) + _str("range") + meta),
        (14, 3): _str(group) + struct.pack(">i", 1) + member + _str(None) + struct.pack(">i", 1) + member + meta,
        (12, 3): _str(group) + struct.pack(">i", 1) + member + _str(None),
        (13, 3): _str(group) + struct.pack(">i", 1) + member + _str(None),
        (8, 7): (_str(group) + struct.pack(">i", 1) + member + _str(None) + struct.pack(">i", 1) + _str(topic)
                 + struct.pack(">iiqi", 1, 0, 5, -1) + _str(None)),
        (9, 5): _str(group) + struct.pack(">i", 1) + _str(topic) + struct.pack(">ii", 1, 0),
        (15, 4): struct.pack(">i", 1) + _str(group) + b"\x00",
        (16, 2): b"",
    }


class Wire:
    """Requests of kafka-python's codec at a chosen version over one connection."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.correlation = 0

    def call(self, request: Any, response_cls: Any, version: int) -> Any:
        self.correlation += 1
        request.with_header(correlation_id=self.correlation, client_id="memq-test")
        self.sock.sendall(request.encode(version=version, header=True, framed=True))
        size = struct.unpack(">i", self._read(4))[0]
        got = response_cls.decode(self._read(size), version=version, header=True)
        assert got.header.correlation_id == self.correlation
        return got

    def _read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            assert chunk, "connection closed"
            out += chunk
        return out
