"""Transactions on the produce wire: version 4 requests (a Message in a transaction), the
transaction calls (version 5) and the ack's producer id and epoch round-trip; bad bytes fail typed."""

from __future__ import annotations

from collections.abc import Callable

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memq.errors import ProtocolError
from memq.format.message import encode_message, verify_message
from memq.format.txn_wire import (
    TXN_CALL_VERSION,
    TxnCall,
    TxnOp,
    decode_txn_call,
    encode_txn_call,
    is_txn_call,
    peek_call_id,
)
from memq.format.wire import (
    TXN_VERSION,
    Ack,
    AckCode,
    AckLevel,
    RequestFlag,
    decode_acks,
    decode_request,
    encode_acks,
    encode_bundle,
    encode_request,
    is_bundle,
    pack_request_header_into,
    peek_request_id,
    request_header_size,
    split_bundle,
)


def test_a_transactional_request_carries_its_transactional_id_and_the_message_unchanged() -> None:
    frame = encode_request(2**64 - 1, AckLevel.ALL, "orders", b"MESSAGE", RequestFlag.SEAL, transactional_id="tx-ü")
    assert frame[2] == TXN_VERSION and not is_txn_call(frame)
    req = decode_request(frame)
    assert (req.request_id, req.ack, req.topic, req.flags, req.transactional_id, bytes(req.message)) == \
        (2**64 - 1, AckLevel.ALL, "orders", RequestFlag.SEAL, "tx-ü", b"MESSAGE")
    assert req.message.obj is frame and peek_request_id(frame) == 2**64 - 1
    assert decode_request(encode_request(1, AckLevel.ALL, "orders", b"m")).transactional_id == ""


def test_the_transactional_header_is_rewritten_in_the_headroom_per_attempt() -> None:
    records = [(b"v" * 10, None, (), 5, None)]
    frame = encode_message(records, producer_id=1, epoch=2, sequence=3, created_ms=4,
                           headroom=request_header_size("t", "tx"))
    assert request_header_size("t", "tx") == request_header_size("t") + 4   # + 2 bytes of length, 2 of id
    for rid in (7, 8):
        pack_request_header_into(frame, rid, AckLevel.ALL, "t", transactional_id="tx")
        req = decode_request(frame)
        assert (req.request_id, req.transactional_id, verify_message(req.message).sequence) == (rid, "tx", 3)


@pytest.mark.parametrize("mangle, words", [
    (lambda f: f[:14], "shorter"),
    (lambda f: f[:15] + b"\x00\x00" + f[17:], "names no transactional id"),
    (lambda f: f[:15] + b"\x00\x99" + f[17:], "topic length 1 does not fit"),
    (lambda f: f[:18] + b"\xff" + f[19:], "transactional id is not UTF-8"),
])
def test_bad_transactional_requests_raise_protocol_error(mangle: Callable[[bytes], bytes], words: str) -> None:
    frame = encode_request(5, AckLevel.ALL, "t", b"msg", transactional_id="tx")
    with pytest.raises(ProtocolError, match=words):
        decode_request(mangle(frame))


def test_a_transactional_id_over_the_limit_is_refused_when_encoding() -> None:
    with pytest.raises(ProtocolError, match="at most 1024 bytes"):
        encode_request(1, AckLevel.ALL, "t", b"m", transactional_id="x" * 1025)


CALLS = [
    TxnCall(1, TxnOp.INIT, "tx", timeout_ms=60_000),
    TxnCall(2, TxnOp.ADD, "tx", 2**63, 7, topics=("a", "b")),
    TxnCall(3, TxnOp.OFFSETS, "tx", 9, 0, group="g", topic="in", offsets=((0, 12), (3, 0))),
    TxnCall(4, TxnOp.END, "tx", 9, 1, commit=True),
    TxnCall(5, TxnOp.END, "tx", 9, 1, commit=False),
]


@pytest.mark.parametrize("call", CALLS, ids=lambda c: f"{c.op}-{c.request_id}")
def test_transaction_calls_round_trip(call: TxnCall) -> None:
    frame = encode_txn_call(call)
    assert is_txn_call(frame) and frame[2] == TXN_CALL_VERSION
    assert decode_txn_call(frame) == call and peek_call_id(frame) == call.request_id


def test_a_call_rides_in_a_bundle_beside_messages() -> None:
    bundle = encode_bundle([encode_request(1, AckLevel.ALL, "t", b"m", transactional_id="tx"),
                            encode_txn_call(CALLS[3])])
    first, second = split_bundle(bundle)
    assert is_bundle(bundle) and decode_request(first).transactional_id == "tx"
    assert is_txn_call(second) and decode_txn_call(second) == CALLS[3]


def test_an_older_broker_refuses_a_call_by_its_version() -> None:
    with pytest.raises(ProtocolError, match="version 5 is not supported"):
        decode_request(encode_txn_call(CALLS[0]))


def _raw(d: object) -> bytes:
    return b"MQ\x05" + msgpack.packb(d)


@pytest.mark.parametrize("frame, words", [
    (b"MQ\x05", "malformed"),
    (b"MQ\x02abc", "not a transaction call"),
    (_raw([1]), "malformed"),
    (_raw({"id": 1, "op": "begin", "txn": "tx"}), "malformed"),
    (_raw({"id": 1, "op": "init"}), "malformed"),
    (_raw({"id": "1", "op": "init", "txn": "tx"}), "malformed"),
    (_raw({"id": 1, "op": "init", "txn": ""}), "1..1024 bytes"),
    (_raw({"id": 1, "op": "end", "txn": "tx"}), "init first"),
    (_raw({"id": 1, "op": "end", "txn": "tx", "pid": 1, "epoch": 0, "commit": 1}), "malformed"),
    (_raw({"id": 1, "op": "add", "txn": "tx", "pid": 1, "epoch": 0}), "names no topic"),
    (_raw({"id": 1, "op": "add", "txn": "tx", "pid": 1, "epoch": 0, "topics": ["x" * 256]}), "1..255 bytes"),
    (_raw({"id": 1, "op": "offsets", "txn": "tx", "pid": 1, "epoch": 0, "group": "g", "topic": "t"}), "no offsets"),
    (_raw({"id": 1, "op": "offsets", "txn": "tx", "pid": 1, "epoch": 0, "group": "g", "topic": "t",
           "offsets": [[0, -1]]}), "negative"),
    (_raw({"id": 1, "op": "init", "txn": "tx", "timeout_ms": -5}), "negative"),
])
def test_bad_calls_raise_protocol_error_naming_the_problem(frame: bytes, words: str) -> None:
    with pytest.raises(ProtocolError, match=words):
        decode_txn_call(frame)


def test_peek_call_id_of_garbage_is_minus_one() -> None:
    assert peek_call_id(b"MQ\x05\xc1") == -1 and peek_call_id(_raw({"id": 4})) == 4


@given(st.binary(max_size=64))
def test_decode_txn_call_is_total(raw: bytes) -> None:
    try:
        decode_txn_call(b"MQ\x05" + raw)
    except ProtocolError:
        pass


def test_ack_version_3_carries_an_inits_producer_id_and_epoch_and_older_acks_read_as_none() -> None:
    acks = [Ack(1, True, producer_id=2**64 - 1, epoch=3), Ack(2, False, AckCode.FENCED, "newer epoch 4"),
            Ack(3, True)]
    assert decode_acks(encode_acks(acks)) == acks
    assert encode_acks([Ack(3, True)]) == msgpack.packb([{"id": 3, "ok": True, "code": "OK"}])   # as before
    assert decode_acks(encode_acks(acks))[1].producer_id == -1
