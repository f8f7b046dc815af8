"""The produce wire protocol: frames on the `/v1/produce` WebSocket.

Client -> broker: one binary frame per Message, a small fixed header (magic, version, ack
level, flags, request id, topic) followed by the Message bytes, which the broker keeps as a
zero-copy slice of the frame. Version 2 added the flags byte (`RequestFlag`); brokers still
parse version 1 frames (no flags), so old producers keep working against new brokers. A
bundle (`BUNDLE_VERSION`, 3) is one frame holding several such requests, each behind its
length, as a Kafka ProduceRequest holds many partitions' batches: a producer of many small
topics sends what it sealed together in one frame, and the broker reads one frame instead of
dozens. A producer sends bundles only to a broker that chose `BUNDLE_SUBPROTOCOL` when the
WebSocket opened (older brokers choose none). Broker -> client: binary frames holding a msgpack list of acks,
several per frame when they are ready together, in any order. Acks travel as msgpack maps
so that new fields can be added without breaking old clients: a decoder reads the keys it
knows and ignores the others, and a key is only written when it differs from its default.
Ack version 2 added `throttle_ms` (a quota delayed the connection, `ACK_VERSION`); version 1
clients ignore it, and version 2 clients read its absence from version 1 brokers as 0.

Version 4 (`TXN_VERSION`) is a request inside a transaction: version 2's fields plus the
transactional id, so any broker hosting the topic can check the producer against the
transaction's state without per-connection bindings. Its Message is stored at once as an object
of its own and published only when the transaction commits (memq.broker.txn). The producer
writes it only when it has a transactional id, so brokers before transactions never see one.
Ack version 3 added `producer_id` and `epoch` (the answer to a transaction's init,
memq.format.txn_wire).

The flag `RequestFlag.PARTITION` (versions 2 and 4) says a u32 read partition follows the topic
(and the transactional id): the Message goes to that notification partition, not to one the
broker picks. The producer sets it for keyed records on a topic of several read partitions (it
places them by key, as Kafka's clients do). Brokers before issue 46 honour it on compacted topics
only and store other topics' Messages where they pick: readable all the same, by key no longer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum, IntFlag, StrEnum
from typing import Any, Sequence

import msgpack

from memq.errors import ProtocolError

WIRE_MAGIC = b"MQ"
WIRE_VERSION = 2
_REQUEST = struct.Struct(">2sBBBQH")   # magic, version, ack level, flags, request id, topic length
_REQUEST_V1 = struct.Struct(">2sBBQH")  # version 1: no flags byte
TXN_VERSION = 4
_REQUEST_TXN = struct.Struct(">2sBBBQHH")   # version 2's fields, then the transactional id's length
_LAYOUTS = {1: _REQUEST_V1, WIRE_VERSION: _REQUEST, TXN_VERSION: _REQUEST_TXN}
_REQUEST_ID_AT = {1: 3, WIRE_VERSION: 4, TXN_VERSION: 4}   # the request id's index in each layout's fields
REQUEST_HEADER_SIZE = _REQUEST.size   # of the frames this module writes
MAX_TOPIC_BYTES = 255
MAX_TRANSACTIONAL_ID_BYTES = 1024
BUNDLE_VERSION = 3
BUNDLE_SUBPROTOCOL = "memq.produce.bundle"   # the WebSocket subprotocol of a broker that reads bundles
_BUNDLE_HEAD = WIRE_MAGIC + bytes((BUNDLE_VERSION,))
_LENGTH = struct.Struct(">I")
_PARTITION = struct.Struct(">I")   # after the topic (and transactional id) with RequestFlag.PARTITION
BUNDLE_HEAD_BYTES = len(_BUNDLE_HEAD)
BUNDLE_ENTRY_BYTES = _LENGTH.size   # a bundle's bytes per request beyond the request's own
ACK_VERSION = 3   # the ack map fields this module knows (documentation: no version travels)


class AckLevel(IntEnum):
    """How much the producer waits for: nothing, the broker has it, stored and notified."""

    NONE = 0
    LEADER = 1
    ALL = 2

    @classmethod
    def parse(cls, value: str | int) -> AckLevel:
        """`"0"`, `"1"` or `"all"` (the ProducerConfig spelling) to an AckLevel."""
        names = {"0": cls.NONE, "1": cls.LEADER, "all": cls.ALL, "-1": cls.ALL}
        key = str(value).lower()
        if key not in names:
            raise ProtocolError(f"ack level {value!r}: use 0, 1 or all")
        return names[key]


class RequestFlag(IntFlag):
    """Per-request hints to the broker (version 2 frames)."""

    NONE = 0
    #: Seal the filling batch right after appending this Message instead of waiting for
    #: batch_ms: the producer's flush() sets it on its last Messages ("send now", as in Kafka).
    SEAL = 1
    #: A u32 read partition follows the topic (and transactional id): the notification partition
    #: the Message must go to (keyed records placed by key). Not kept in
    #: `ProduceRequest.flags`: `ProduceRequest.partition` says it.
    PARTITION = 2


class AckCode(StrEnum):
    OK = "OK"
    BUSY = "BUSY"
    NOT_HERE = "NOT_HERE"
    UNKNOWN_TOPIC = "UNKNOWN_TOPIC"
    CORRUPT = "CORRUPT"
    TOO_LARGE = "TOO_LARGE"
    STORAGE = "STORAGE"
    NOTIFY = "NOTIFY"
    PROTOCOL = "PROTOCOL"
    CLOSING = "CLOSING"
    DENIED = "DENIED"   # an ACL denies the connection's principal this operation on the topic
    FENCED = "FENCED"         # a newer producer of the same transactional id took over (terminal)
    TXN_STATE = "TXN_STATE"   # the call does not fit the transaction's state (e.g. commit with none open)
    TXN_BUSY = "TXN_BUSY"     # the transaction is still completing (Kafka's CONCURRENT_TRANSACTIONS): retry
    INVALID_RECORD = "INVALID_RECORD"   # a record fails the topic's schema checks (terminal; the error names it)


#: Codes after which sending the same Message again (same producer id/epoch/sequence) may work.
RETRIABLE_CODES = frozenset({AckCode.BUSY, AckCode.NOT_HERE, AckCode.STORAGE, AckCode.NOTIFY,
                             AckCode.CLOSING, AckCode.TXN_BUSY})

#: Request id used for acks about a frame whose request id could not be read.
NO_REQUEST_ID = -1


# not frozen: a frozen dataclass's __init__ (object.__setattr__ per field) costs ~1.2 us more, per Message
@dataclass(slots=True)
class ProduceRequest:
    request_id: int
    ack: AckLevel
    topic: str
    message: memoryview       # the Message bytes (header + body), a slice of the frame
    flags: RequestFlag = RequestFlag.NONE
    transactional_id: str = ""   # version 4: the transaction holding this Message ("" = none)
    partition: int = -1          # RequestFlag.PARTITION: the read partition it goes to (-1: the broker picks)


# not frozen: a frozen dataclass's __init__ (object.__setattr__ per field) costs ~1.2 us more, per Message
@dataclass(slots=True)
class Ack:
    """The broker's answer about one request; location fields are set on ack=all success."""

    id: int
    ok: bool
    code: str = AckCode.OK
    error: str = ""
    bucket: str = ""
    key: str = ""
    index: int = -1
    partition: int = -1
    offset: int = -1
    brokers: tuple[str, ...] = ()
    throttle_ms: int = 0     # ack version 2: the broker stops reading this connection this long (a quota)
    producer_id: int = -1    # ack version 3: a transaction's producer id and epoch (the answer to its init)
    epoch: int = -1
    # not on the wire: the index of the Message's first LogMessage in its part (ack=all), so a
    # door computes its first record's Kafka offset (memq.kafka_api.offsets) without decoding
    record: int = -1


def _topic_bytes(topic: str) -> bytes:
    tb = topic.encode()
    if not tb or len(tb) > MAX_TOPIC_BYTES:
        raise ProtocolError(f"topic {topic!r}: must be 1..{MAX_TOPIC_BYTES} bytes")
    return tb


def _transactional_id_bytes(transactional_id: str) -> bytes:
    xb = transactional_id.encode()
    if len(xb) > MAX_TRANSACTIONAL_ID_BYTES:
        raise ProtocolError(f"transactional id {transactional_id[:40]!r}...: must be at most "
                            f"{MAX_TRANSACTIONAL_ID_BYTES} bytes")
    return xb


def request_header_size(topic: str, transactional_id: str = "", partition: int = -1) -> int:
    """Bytes of the request header in front of a Message for `topic` (in the transaction
    `transactional_id`, if one is given; to read partition `partition`, if >= 0)."""
    placed = _PARTITION.size if partition >= 0 else 0
    if transactional_id:
        return (_REQUEST_TXN.size + len(_topic_bytes(topic)) + len(_transactional_id_bytes(transactional_id))
                + placed)
    return _REQUEST.size + len(_topic_bytes(topic)) + placed


def pack_request_header_into(frame: bytearray, request_id: int, ack: AckLevel, topic: str,
                             flags: RequestFlag = RequestFlag.NONE, transactional_id: str = "",
                             partition: int = -1) -> None:
    """Write the request header into the first `request_header_size(topic, transactional_id,
    partition)` bytes of `frame`, whose rest holds the Message: the producer encodes each Message
    with that much headroom and rewrites only this header per attempt, so a 1 MiB frame is never
    copied to prepend it. A transactional id makes it a version 4 header; a partition >= 0 sets
    RequestFlag.PARTITION and follows the rest."""
    tb = _topic_bytes(topic)
    if partition >= 0:
        flags |= RequestFlag.PARTITION
    if not transactional_id:
        _REQUEST.pack_into(frame, 0, WIRE_MAGIC, WIRE_VERSION, int(ack), int(flags), request_id, len(tb))
        at = _REQUEST.size + len(tb)
        frame[_REQUEST.size:at] = tb
    else:
        xb = _transactional_id_bytes(transactional_id)
        at = _REQUEST_TXN.size
        _REQUEST_TXN.pack_into(frame, 0, WIRE_MAGIC, TXN_VERSION, int(ack), int(flags), request_id, len(tb), len(xb))
        frame[at:at + len(tb)] = tb
        at += len(tb)
        frame[at:at + len(xb)] = xb
        at += len(xb)
    if partition >= 0:
        _PARTITION.pack_into(frame, at, partition)


def encode_request_header(request_id: int, ack: AckLevel, topic: str, flags: RequestFlag = RequestFlag.NONE,
                          transactional_id: str = "", partition: int = -1) -> bytes:
    """The fixed header in front of a Message; send `header + message` as one frame."""
    head = bytearray(request_header_size(topic, transactional_id, partition))
    pack_request_header_into(head, request_id, ack, topic, flags, transactional_id, partition)
    return bytes(head)


def encode_request(request_id: int, ack: AckLevel, topic: str, message: bytes, flags: RequestFlag = RequestFlag.NONE,
                   transactional_id: str = "", partition: int = -1) -> bytes:
    return encode_request_header(request_id, ack, topic, flags, transactional_id, partition) + message


def _layout(frame: bytes | memoryview) -> struct.Struct | None:
    """The header layout of the frame's version, None if unknown or too short to tell."""
    return _LAYOUTS.get(frame[2]) if len(frame) > 2 else None


def peek_request_id(frame: bytes | memoryview) -> int:
    """The request id of a frame, or NO_REQUEST_ID when the frame is too short to hold one."""
    layout = _layout(frame)
    if layout is None or len(frame) < layout.size:
        return NO_REQUEST_ID
    return layout.unpack_from(frame)[_REQUEST_ID_AT[frame[2]]]


def is_bundle(frame: bytes | memoryview) -> bool:
    return len(frame) > 2 and frame[2] == BUNDLE_VERSION


def encode_bundle(frames: Sequence[bytes | bytearray]) -> bytes:
    """One frame holding the request `frames` (each as `encode_request` or
    `pack_request_header_into` made it), in order."""
    parts: list[bytes | bytearray] = [_BUNDLE_HEAD]
    pack = _LENGTH.pack
    for f in frames:
        parts.append(pack(len(f)))
        parts.append(f)
    return b"".join(parts)


def split_bundle(frame: bytes | memoryview) -> list[memoryview]:
    """The request frames of a bundle, as zero-copy views; ProtocolError if its lengths do not
    tile it exactly (nothing of a malformed bundle is taken)."""
    view = memoryview(frame)
    n = len(view)
    if n < len(_BUNDLE_HEAD) or bytes(view[:2]) != WIRE_MAGIC or view[2] != BUNDLE_VERSION:
        raise ProtocolError(f"frame of {n} bytes is not a bundle")
    out: list[memoryview] = []
    at = len(_BUNDLE_HEAD)
    unpack = _LENGTH.unpack_from
    while at < n:
        if at + 4 > n:
            raise ProtocolError(f"bundle of {n} bytes: a length at byte {at} is cut off")
        (size,) = unpack(view, at)
        at += 4
        if size == 0 or at + size > n:
            raise ProtocolError(f"bundle of {n} bytes: request {len(out)} of {size} bytes at byte {at} "
                                "does not fit")
        out.append(view[at:at + size])
        at += size
    if not out:
        raise ProtocolError("bundle holds no request")
    return out


_ACK_LEVELS = tuple(AckLevel)                           # by value: the enum call costs ~1 us a request
_FLAGS = {int(f): f for f in (RequestFlag.NONE, RequestFlag.SEAL)}   # every value ProduceRequest.flags holds
_PLACED = int(RequestFlag.PARTITION)
_KNOWN_FLAGS = int(RequestFlag.SEAL) | _PLACED


def decode_request(frame: bytes | memoryview) -> ProduceRequest:
    """Parse one client frame (version 1, 2 or 4); raises ProtocolError naming what is wrong."""
    n = len(frame)
    layout = _layout(frame) or _REQUEST
    size = layout.size
    if n < size:
        raise ProtocolError(f"produce frame of {n} bytes is shorter than the {size}-byte header")
    xlen = 0
    if layout is _REQUEST:
        magic, version, ack, flags, request_id, tlen = layout.unpack_from(frame)
    elif layout is _REQUEST_V1:
        magic, version, ack, request_id, tlen = layout.unpack_from(frame)
        flags = 0
    else:
        magic, version, ack, flags, request_id, tlen, xlen = layout.unpack_from(frame)
        if xlen == 0:
            raise ProtocolError(f"request {request_id}: a version {TXN_VERSION} request names no transactional id")
    if magic != WIRE_MAGIC:
        raise ProtocolError(f"produce frame has bad magic {magic!r} (expected {WIRE_MAGIC!r})")
    if version not in _LAYOUTS:
        raise ProtocolError(f"produce frame version {version} is not supported (this broker speaks "
                            f"{', '.join(map(str, _LAYOUTS))})")
    if ack > AckLevel.ALL:
        raise ProtocolError(f"request {request_id}: ack level {ack} is not 0, 1 or 2 (all)")
    if flags & ~_KNOWN_FLAGS:
        raise ProtocolError(f"request {request_id}: unknown flags {flags:#04x}")
    end = size + tlen
    if tlen == 0 or end + xlen > n:
        raise ProtocolError(f"request {request_id}: topic length {tlen} does not fit a {n}-byte frame")
    view = memoryview(frame)
    try:
        topic = bytes(view[size:end]).decode()
    except UnicodeDecodeError:
        raise ProtocolError(f"request {request_id}: topic is not UTF-8") from None
    if not xlen and flags < _PLACED:   # the common case: no transaction, no partition
        return ProduceRequest(request_id, _ACK_LEVELS[ack], topic, view[end:], _FLAGS[flags])
    try:
        transactional_id = bytes(view[end:end + xlen]).decode()
    except UnicodeDecodeError:
        raise ProtocolError(f"request {request_id}: transactional id is not UTF-8") from None
    end += xlen
    partition = -1
    if flags & _PLACED:
        if end + _PARTITION.size > n:
            raise ProtocolError(f"request {request_id}: its partition does not fit a {n}-byte frame")
        (partition,) = _PARTITION.unpack_from(view, end)
        end += _PARTITION.size
    return ProduceRequest(request_id, _ACK_LEVELS[ack], topic, view[end:], _FLAGS[flags & ~_PLACED],
                          transactional_id, partition)


def _ack_to_map(a: Ack) -> dict[str, Any]:
    d: dict[str, Any] = {"id": a.id, "ok": a.ok, "code": str(a.code)}
    if a.error:
        d["error"] = a.error
    if a.key:
        d.update(bucket=a.bucket, key=a.key, index=a.index, partition=a.partition, offset=a.offset)
    if a.brokers:
        d["brokers"] = list(a.brokers)
    if a.throttle_ms:
        d["throttle_ms"] = a.throttle_ms
    if a.producer_id >= 0:
        d.update(producer_id=a.producer_id, epoch=a.epoch)
    return d


def encode_acks(acks: Sequence[Ack]) -> bytes:
    return msgpack.packb([_ack_to_map(a) for a in acks])


def _throttle_ms(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"throttle_ms {value!r} is not a count of milliseconds")
    return value


def decode_acks(frame: bytes) -> list[Ack]:
    """Parse one broker frame; raises ProtocolError on anything that is not a list of acks."""
    try:
        items = msgpack.unpackb(frame)
        if not isinstance(items, list):
            raise TypeError("not a list")
        return [Ack(id=int(d["id"]), ok=bool(d["ok"]), code=str(d["code"]), error=str(d.get("error", "")),
                    bucket=str(d.get("bucket", "")), key=str(d.get("key", "")),
                    index=int(d.get("index", -1)), partition=int(d.get("partition", -1)),
                    offset=int(d.get("offset", -1)), brokers=tuple(d.get("brokers", ())),
                    throttle_ms=_throttle_ms(d.get("throttle_ms", 0)),
                    producer_id=int(d.get("producer_id", -1)), epoch=int(d.get("epoch", -1)))
                for d in items]
    except (ValueError, TypeError, KeyError, AttributeError) as e:   # msgpack's errors are ValueErrors
        raise ProtocolError(f"ack frame of {len(frame)} bytes is malformed: {e}") from None
