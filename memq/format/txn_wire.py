"""A transaction's calls on the `/v1/produce` WebSocket (memq's own protocol; no I/O).

A producer with a transactional id drives its transaction with these frames, sent on the same
connection as its Messages: `init` (get the producer id and a new epoch, which fences any older
producer of the id and aborts its open transaction), `add` (the topics the transaction writes, before
its first Message to each, as Kafka's AddPartitionsToTxn), `offsets` (a Consumer group's positions to
commit with the transaction) and `end` (commit or abort). Each is one frame: magic, version
`TXN_CALL_VERSION` (5, beside the request versions of memq.format.wire, so an older broker answers
it with a PROTOCOL ack naming the version), then a msgpack map whose keys a decoder reads by
name (new keys can be added without breaking it). The broker answers with an ordinary ack
(memq.format.wire.Ack) carrying the call's request id; an `init`'s ack carries the producer id
and epoch. A call may sit inside a bundle as any request does.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgpack

from memq.errors import ProtocolError
from memq.format.wire import MAX_TOPIC_BYTES, MAX_TRANSACTIONAL_ID_BYTES, WIRE_MAGIC

TXN_CALL_VERSION = 5
_HEAD = WIRE_MAGIC + bytes((TXN_CALL_VERSION,))
MAX_CALL_BYTES = 1024 * 1024   # a call is small; offsets of many partitions stay far below this


class TxnOp(StrEnum):
    INIT = "init"
    ADD = "add"
    OFFSETS = "offsets"
    END = "end"


@dataclass(frozen=True, slots=True)
class TxnCall:
    """One call about transaction `transactional_id`. `producer_id`/`epoch`: the caller's (from
    its init; -1 in an init). `timeout_ms` (init): the coordinator aborts a transaction open
    longer. `topics` (add). `group`, `topic`, `offsets` (offsets): a memq Consumer group's next
    notification offset per read partition of `topic`. `commit` (end): commit, or abort."""

    request_id: int
    op: TxnOp
    transactional_id: str
    producer_id: int = -1
    epoch: int = -1
    timeout_ms: int = 0
    topics: tuple[str, ...] = ()
    group: str = ""
    topic: str = ""
    offsets: tuple[tuple[int, int], ...] = ()
    commit: bool = False


def is_txn_call(frame: bytes | memoryview) -> bool:
    return len(frame) > 2 and frame[2] == TXN_CALL_VERSION


def encode_txn_call(call: TxnCall) -> bytes:
    _check(call)
    d: dict[str, Any] = {"id": call.request_id, "op": str(call.op), "txn": call.transactional_id}
    if call.producer_id >= 0:
        d.update(pid=call.producer_id, epoch=call.epoch)
    if call.timeout_ms:
        d["timeout_ms"] = call.timeout_ms
    if call.topics:
        d["topics"] = list(call.topics)
    if call.group:
        d.update(group=call.group, topic=call.topic, offsets=[list(po) for po in call.offsets])
    if call.commit:
        d["commit"] = True
    return _HEAD + msgpack.packb(d)


def peek_call_id(frame: bytes | memoryview) -> int:
    """The request id of a call frame, or -1 when it cannot be read (for the error ack)."""
    try:
        d = msgpack.unpackb(memoryview(frame)[3:])
        return int(d["id"]) if isinstance(d, dict) else -1
    except (ValueError, TypeError, KeyError):   # msgpack's errors are ValueErrors
        return -1


def decode_txn_call(frame: bytes | memoryview) -> TxnCall:
    """Parse one call frame; ProtocolError naming what is wrong."""
    n = len(frame)
    if n < len(_HEAD) or bytes(frame[:2]) != WIRE_MAGIC or frame[2] != TXN_CALL_VERSION:
        raise ProtocolError(f"frame of {n} bytes is not a transaction call")
    if n > MAX_CALL_BYTES:
        raise ProtocolError(f"transaction call of {n} bytes is over {MAX_CALL_BYTES}")
    try:
        d = msgpack.unpackb(memoryview(frame)[len(_HEAD):])
        if not isinstance(d, dict):
            raise TypeError("not a map")
        call = TxnCall(request_id=_int(d["id"]), op=TxnOp(d["op"]), transactional_id=_str(d["txn"]),
                       producer_id=_int(d.get("pid", -1)), epoch=_int(d.get("epoch", -1)),
                       timeout_ms=_int(d.get("timeout_ms", 0)),
                       topics=tuple(_str(t) for t in d.get("topics", ())),
                       group=_str(d.get("group", "")), topic=_str(d.get("topic", "")),
                       offsets=tuple((_int(p), _int(o)) for p, o in d.get("offsets", ())),
                       commit=_bool(d.get("commit", False)))
    except (ValueError, TypeError, KeyError) as e:   # msgpack's errors and a bad op are ValueErrors
        raise ProtocolError(f"transaction call of {n} bytes is malformed: {e!r}") from None
    _check(call)
    return call


def _check(call: TxnCall) -> None:
    """What every call must hold, named (the same on both sides)."""
    what = f"transaction call {call.request_id} ({call.op})"
    if not call.transactional_id or len(call.transactional_id.encode()) > MAX_TRANSACTIONAL_ID_BYTES:
        raise ProtocolError(f"{what}: the transactional id must be 1..{MAX_TRANSACTIONAL_ID_BYTES} bytes")
    if call.op is not TxnOp.INIT and (call.producer_id < 0 or call.epoch < 0):
        raise ProtocolError(f"{what}: names no producer id and epoch (init first)")
    if call.timeout_ms < 0:
        raise ProtocolError(f"{what}: timeout_ms {call.timeout_ms} is negative")
    if call.op is TxnOp.ADD and not call.topics:
        raise ProtocolError(f"{what}: names no topic")
    if any(not t or len(t.encode()) > MAX_TOPIC_BYTES for t in (*call.topics, *((call.topic,) if call.group else ()))):
        raise ProtocolError(f"{what}: a topic must be 1..{MAX_TOPIC_BYTES} bytes")
    if call.op is TxnOp.OFFSETS and not (call.group and call.offsets):
        raise ProtocolError(f"{what}: names no group or no offsets")
    if any(p < 0 or o < 0 for p, o in call.offsets):
        raise ProtocolError(f"{what}: a partition or offset is negative")


def _int(v: object) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{v!r} is not an integer")
    return v


def _str(v: object) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{v!r} is not a string")
    return v


def _bool(v: object) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{v!r} is not a boolean")
    return v
