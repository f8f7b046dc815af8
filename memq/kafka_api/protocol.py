"""Sans-I/O codec of the Kafka requests and responses producers and assigned consumers need.

The non-flexible versions (request header v1, response header v0, no tagged fields) of
ApiVersions, Metadata, Produce (RecordBatch v2), Fetch, ListOffsets, InitProducerId,
SaslHandshake and SaslAuthenticate. Which versions are served is the Kafka door's table of API
families (`memq.broker.doors.kafka`), which ApiVersions advertises. librdkafka and the Java
client open with ApiVersions v3; the answer to any version we do not serve is Kafka's
v0-shaped UNSUPPORTED_VERSION carrying our ranges (KIP-511), and the client retries with the
highest we list. Field layouts follow Kafka's clients/src/main/resources/common/message/*.json.

The flexible versions served besides (Metadata v9-12, ListGroups v3-5, the share-group APIs)
are decoded by `flexible`, `metadata_flex`, `groups`, `share` and `share_admin`, on a body read
past this module's request header.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from memq.errors import ProtocolError

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_REQUEST_HEADER = struct.Struct(">hhi")


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24   # transactions (memq.broker.doors.kafka_txn)
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    INCREMENTAL_ALTER_CONFIGS = 44
    OFFSET_DELETE = 47
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    CONSUMER_GROUP_HEARTBEAT = 68   # KIP-848 groups (memq.kafka_api.consumer_protocol): flexible
    CONSUMER_GROUP_DESCRIBE = 69
    SHARE_GROUP_HEARTBEAT = 76   # share groups (memq.kafka_api.share): flexible, v1 only
    SHARE_GROUP_DESCRIBE = 77
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79
    DESCRIBE_SHARE_GROUP_OFFSETS = 90   # share groups' offsets (memq.kafka_api.share_admin): flexible, v0
    ALTER_SHARE_GROUP_OFFSETS = 91
    DELETE_SHARE_GROUP_OFFSETS = 92


class ErrorCode(IntEnum):
    """The Kafka error codes memq answers with (Kafka's `Errors` numbering)."""

    NONE = 0
    UNKNOWN_SERVER_ERROR = -1
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    UNKNOWN_MEMBER_ID = 25
    REBALANCE_IN_PROGRESS = 27
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    INVALID_REQUEST = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    POLICY_VIOLATION = 44
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    SECURITY_DISABLED = 54
    OPERATION_NOT_ATTEMPTED = 55
    KAFKA_STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    UNSUPPORTED_COMPRESSION_TYPE = 76
    OFFSET_NOT_AVAILABLE = 78
    MEMBER_ID_REQUIRED = 79
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    INVALID_RECORD = 87
    PRODUCER_FENCED = 90
    UNKNOWN_TOPIC_ID = 100
    FENCED_MEMBER_EPOCH = 110
    UNRELEASED_INSTANCE_ID = 111
    UNSUPPORTED_ASSIGNOR = 112
    STALE_MEMBER_EPOCH = 113
    MISMATCHED_ENDPOINT_TYPE = 114
    INVALID_REGULAR_EXPRESSION = 128


class Reader:
    """A cursor over one request body; every read past the end is a ProtocolError."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int = 0) -> None:
        self.buf = memoryview(buf)
        self.pos = pos

    def _take(self, s: struct.Struct) -> int:
        if self.pos + s.size > len(self.buf):
            raise ProtocolError(f"Kafka request truncated at byte {self.pos}")
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return int(v)

    def i8(self) -> int:
        return self._take(_I8)

    def i16(self) -> int:
        return self._take(_I16)

    def i32(self) -> int:
        return self._take(_I32)

    def i64(self) -> int:
        return self._take(_I64)

    def nullable_bytes(self, n: int) -> memoryview | None:
        if n == -1:
            return None
        if n < 0 or self.pos + n > len(self.buf):
            raise ProtocolError(f"Kafka request field of {n} bytes at byte {self.pos} overruns the frame")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def nullable_string(self) -> str | None:
        raw = self.nullable_bytes(self.i16())
        if raw is None:
            return None
        try:
            return bytes(raw).decode()
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"Kafka request string at byte {self.pos} is not UTF-8") from exc

    def string(self) -> str:
        s = self.nullable_string()
        if s is None:
            raise ProtocolError(f"Kafka request has a null string at byte {self.pos}")
        return s

    def count(self, nullable: bool = False) -> int:
        """An array length: -1 (null) only where the field allows it; never more than bytes left."""
        n = self.i32()
        if n == -1 and nullable:
            return -1
        if n < 0 or n > len(self.buf) - self.pos:
            raise ProtocolError(f"Kafka request array of {n} items at byte {self.pos} is impossible here")
        return n

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise ProtocolError(f"Kafka request has {len(self.buf) - self.pos} bytes after its last field")


class Writer:
    """Builds a response body with a size prefix and the correlation id (response header v0)."""

    __slots__ = ("out",)

    def __init__(self, correlation_id: int) -> None:
        self.out = bytearray(8)
        _I32.pack_into(self.out, 4, correlation_id)

    def i8(self, v: int) -> Writer:
        self.out += _I8.pack(v)
        return self

    def i16(self, v: int) -> Writer:
        self.out += _I16.pack(v)
        return self

    def i32(self, v: int) -> Writer:
        self.out += _I32.pack(v)
        return self

    def i64(self, v: int) -> Writer:
        self.out += _I64.pack(v)
        return self

    def nullable_string(self, s: str | None) -> Writer:
        if s is None:
            return self.i16(-1)
        raw = s.encode()
        self.i16(len(raw))
        self.out += raw
        return self

    def nullable_bytes(self, b: bytes | bytearray | None) -> Writer:
        if b is None:
            return self.i32(-1)
        self.i32(len(b))
        self.out += b
        return self

    def frame(self) -> bytes:
        _I32.pack_into(self.out, 0, len(self.out) - 4)
        return bytes(self.out)


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def decode_request_header(frame: bytes | memoryview) -> tuple[RequestHeader, Reader]:
    """The header of a request frame (size prefix removed) and a reader at its body (request
    header v1; a flexible version's header tags are left for `flexible.flex_body`)."""
    r = Reader(frame)
    api_key, version, correlation_id = r.i16(), r.i16(), r.i32()
    return RequestHeader(api_key, version, correlation_id, r.nullable_string()), r


def api_name(api_key: int) -> str:
    """"PRODUCE (key 0)", or "unknown API (key 99)", for log lines."""
    name = ApiKey(api_key).name if api_key in ApiKey._value2member_map_ else "unknown API"
    return f"{name} (key {api_key})"


# --- ApiVersions ---------------------------------------------------------------------------


def encode_api_versions(h: RequestHeader, served: Mapping[int, tuple[int, int]],
                        error: ErrorCode = ErrorCode.NONE) -> bytes:
    """The version ranges `served`; for an ApiVersions version we do not serve, the v0 shape (KIP-511)."""
    version = h.api_version if error is ErrorCode.NONE else 0
    w = Writer(h.correlation_id).i16(error).i32(len(served))
    for key, (lo, hi) in sorted(served.items()):
        w.i16(key).i16(lo).i16(hi)
    if version >= 1:
        w.i32(0)   # throttle_time_ms
    return w.frame()


# --- SASL (KIP-152: SaslHandshake v1, then the exchange in SaslAuthenticate) -----------------


def decode_sasl_handshake(r: Reader) -> str:
    mechanism = r.string()
    r.done()
    return mechanism


def encode_sasl_handshake(h: RequestHeader, error: ErrorCode, mechanisms: tuple[str, ...]) -> bytes:
    w = Writer(h.correlation_id).i16(error).i32(len(mechanisms))
    for m in mechanisms:
        w.nullable_string(m)
    return w.frame()


def decode_sasl_authenticate(r: Reader) -> bytes:
    raw = r.nullable_bytes(r.i32())
    r.done()
    return bytes(raw or b"")


def encode_sasl_authenticate(h: RequestHeader, error: ErrorCode, message: str | None) -> bytes:
    """No server bytes (PLAIN has none); v1's session lifetime 0: no re-authentication."""
    w = Writer(h.correlation_id).i16(error).nullable_string(message).i32(0)
    if h.api_version >= 1:
        w.i64(0)
    return w.frame()


def parse_sasl_plain(auth: bytes) -> tuple[str, str]:
    """(username, password) of a SASL/PLAIN message `authzid NUL authcid NUL passwd` (RFC 4616)."""
    parts = auth.split(b"\0")
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise ProtocolError("SASL/PLAIN message is not 'authzid NUL username NUL password'")
    try:
        return parts[1].decode(), parts[2].decode()
    except UnicodeDecodeError:
        raise ProtocolError("SASL/PLAIN username or password is not UTF-8") from None


# --- Metadata ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetadataRequest:
    topics: tuple[str, ...] | None   # None: every topic


def decode_metadata(h: RequestHeader, r: Reader) -> MetadataRequest:
    n = r.count(nullable=True)
    topics = None if n == -1 else tuple(r.string() for _ in range(n))
    if h.api_version >= 4:
        r.i8()   # allow_auto_topic_creation: memq topics are created by the governor, never here
    if h.api_version >= 8:
        r.i8()
        r.i8()   # include cluster / topic authorized operations
    r.done()
    return MetadataRequest(topics)


@dataclass(frozen=True, slots=True)
class Node:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class TopicPartitions:
    name: str
    error: ErrorCode = ErrorCode.NONE
    leaders: tuple[int, ...] = ()    # partition i's leader node id (its only replica)


def encode_metadata(h: RequestHeader, brokers: list[Node], cluster_id: str, controller_id: int,
                    topics: list[TopicPartitions]) -> bytes:
    v = h.api_version
    w = Writer(h.correlation_id)
    if v >= 3:
        w.i32(0)   # throttle_time_ms
    w.i32(len(brokers))
    for b in brokers:
        w.i32(b.node_id).nullable_string(b.host).i32(b.port).nullable_string(b.rack)
    if v >= 2:
        w.nullable_string(cluster_id)
    w.i32(controller_id).i32(len(topics))
    for t in topics:
        w.i16(t.error).nullable_string(t.name).i8(0).i32(len(t.leaders))   # i8: is_internal
        for index, leader in enumerate(t.leaders):
            w.i16(ErrorCode.NONE).i32(index).i32(leader)
            if v >= 7:
                w.i32(-1)   # leader_epoch: unknown
            w.i32(1).i32(leader).i32(1).i32(leader)   # replicas, isr: the leader alone
            if v >= 5:
                w.i32(0)   # offline replicas
        if v >= 8:
            w.i32(-2147483648)   # topic authorized operations: not computed
    if v >= 8:
        w.i32(-2147483648)
    return w.frame()


# --- Produce -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionData:
    index: int
    records: memoryview | None


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: tuple[tuple[str, tuple[PartitionData, ...]], ...]


def decode_produce(r: Reader) -> ProduceRequest:
    transactional_id = r.nullable_string()
    acks, timeout_ms = r.i16(), r.i32()
    topics = []
    for _ in range(r.count()):
        name = r.string()
        parts = tuple(PartitionData(r.i32(), r.nullable_bytes(r.i32())) for _ in range(r.count()))
        topics.append((name, parts))
    r.done()
    return ProduceRequest(transactional_id, acks, timeout_ms, tuple(topics))


@dataclass(frozen=True, slots=True)
class PartitionResult:
    index: int
    error: ErrorCode = ErrorCode.NONE
    base_offset: int = -1
    message: str | None = None
    record_errors: tuple[tuple[int, str], ...] = ()   # v8+: (batch index, why) of each refused record


@dataclass(slots=True)
class ProduceResult:
    topics: dict[str, list[PartitionResult]] = field(default_factory=dict)
    throttle_ms: int = 0     # a produce quota delayed the connection this long (KIP-219)


def encode_produce(h: RequestHeader, result: ProduceResult) -> bytes:
    v = h.api_version
    w = Writer(h.correlation_id).i32(len(result.topics))
    for name, parts in result.topics.items():
        w.nullable_string(name).i32(len(parts))
        for p in parts:
            w.i32(p.index).i16(p.error).i64(p.base_offset).i64(-1)   # log_append_time_ms: CreateTime
            if v >= 5:
                w.i64(-1)   # log_start_offset
            if v >= 8:
                w.i32(len(p.record_errors))
                for index, why in p.record_errors:
                    w.i32(index).nullable_string(why)
                w.nullable_string(p.message)
    w.i32(result.throttle_ms)
    return w.frame()


# --- Fetch v4-11 ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FetchPartition:
    index: int
    offset: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class FetchRequest:
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    topics: tuple[tuple[str, tuple[FetchPartition, ...]], ...]
    rack: str = ""
    zstd: bool = True   # the client may get zstd batches: Fetch v10+ (KIP-110)


def decode_fetch(h: RequestHeader, r: Reader) -> FetchRequest:
    """A Fetch v4-11 request; the session fields (v7+) are read and ignored: memq answers every
    fetch in full (session id 0), which every client accepts."""
    v = h.api_version
    r.i32()   # replica id
    max_wait_ms, min_bytes, max_bytes = r.i32(), r.i32(), r.i32()
    r.i8()    # isolation level: both read published notifications only, and a transaction's are
    #           published at its commit: read_committed with last stable offset = high watermark
    if v >= 7:
        r.i32()
        r.i32()   # session id, session epoch
    topics = []
    for _ in range(r.count()):
        name = r.string()
        parts = []
        for _ in range(r.count()):
            index = r.i32()
            if v >= 9:
                r.i32()   # current leader epoch
            offset = r.i64()
            if v >= 5:
                r.i64()   # log start offset: a follower's, unused
            parts.append(FetchPartition(index, offset, r.i32()))
        topics.append((name, tuple(parts)))
    if v >= 7:
        for _ in range(r.count()):   # forgotten topics: there is no session to forget them from
            r.string()
            for _ in range(r.count()):
                r.i32()
    rack = r.string() if v >= 11 else ""
    r.done()
    return FetchRequest(max_wait_ms, min_bytes, max_bytes, tuple(topics), rack, zstd=v >= 10)


@dataclass(slots=True)
class FetchedPartition:
    index: int
    error: ErrorCode = ErrorCode.NONE
    high_watermark: int = -1
    log_start: int = -1
    records: bytes | bytearray = b""
    preferred_replica: int = -1   # v11+: the node the client should fetch this partition from (KIP-392)
    last_stable_offset: int | None = None   # None: the high watermark


def encode_fetch(h: RequestHeader, topics: list[tuple[str, list[FetchedPartition]]], throttle_ms: int = 0) -> bytes:
    v = h.api_version
    w = Writer(h.correlation_id).i32(throttle_ms)
    if v >= 7:
        w.i16(ErrorCode.NONE).i32(0)   # sessionless
    w.i32(len(topics))
    for name, parts in topics:
        w.nullable_string(name).i32(len(parts))
        for p in parts:
            w.i32(p.index).i16(p.error).i64(p.high_watermark)
            w.i64(p.high_watermark if p.last_stable_offset is None else p.last_stable_offset)
            if v >= 5:
                w.i64(p.log_start)
            w.i32(-1)   # aborted transactions: none is ever published (memq.broker.txn)
            if v >= 11:
                w.i32(p.preferred_replica)
            w.nullable_bytes(p.records or b"")   # never null: librdkafka refuses a MessageSetSize of -1
    return w.frame()


# --- ListOffsets v1-5 -------------------------------------------------------------------------

LATEST = -1
EARLIEST = -2


@dataclass(frozen=True, slots=True)
class ListOffsetsRequest:
    topics: tuple[tuple[str, tuple[tuple[int, int], ...]], ...]   # (partition, timestamp) per topic


def decode_list_offsets(h: RequestHeader, r: Reader) -> ListOffsetsRequest:
    v = h.api_version
    r.i32()   # replica id
    if v >= 2:
        r.i8()   # isolation level
    topics = []
    for _ in range(r.count()):
        name = r.string()
        parts = []
        for _ in range(r.count()):
            index = r.i32()
            if v >= 4:
                r.i32()   # current leader epoch
            parts.append((index, r.i64()))
        topics.append((name, tuple(parts)))
    r.done()
    return ListOffsetsRequest(tuple(topics))


@dataclass(frozen=True, slots=True)
class ListedOffset:
    index: int
    error: ErrorCode = ErrorCode.NONE
    timestamp: int = -1
    offset: int = -1


def encode_list_offsets(h: RequestHeader, topics: list[tuple[str, list[ListedOffset]]]) -> bytes:
    v = h.api_version
    w = Writer(h.correlation_id)
    if v >= 2:
        w.i32(0)   # throttle time
    w.i32(len(topics))
    for name, parts in topics:
        w.nullable_string(name).i32(len(parts))
        for p in parts:
            w.i32(p.index).i16(p.error).i64(p.timestamp).i64(p.offset)
            if v >= 4:
                w.i32(-1)   # leader epoch: unknown
    return w.frame()


# --- InitProducerId ------------------------------------------------------------------------


def decode_init_producer_id(r: Reader) -> tuple[str | None, int]:
    """The transactional id (None for an idempotent, non-transactional producer) and its
    transaction timeout in ms."""
    transactional_id = r.nullable_string()
    timeout_ms = r.i32()
    r.done()
    return transactional_id, timeout_ms


def encode_init_producer_id(h: RequestHeader, error: ErrorCode, producer_id: int, epoch: int) -> bytes:
    return Writer(h.correlation_id).i32(0).i16(error).i64(producer_id).i16(epoch).frame()
