"""The produce wire protocol: request frames and ack frames round-trip, bad bytes fail typed."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memq.errors import ProtocolError
from memq.format.wire import (NO_REQUEST_ID, REQUEST_HEADER_SIZE, Ack, AckCode, AckLevel, RequestFlag,
                              decode_acks, decode_request, encode_acks, encode_request, pack_request_header_into,
                              peek_request_id, request_header_size)
from memq.format.message import encode_message, verify_message


def test_request_round_trip_keeps_message_bytes_without_copy() -> None:
    frame = encode_request(2**64 - 1, AckLevel.ALL, "orders.v1", b"MESSAGE-BYTES")
    req = decode_request(frame)
    assert (req.request_id, req.ack, req.topic) == (2**64 - 1, AckLevel.ALL, "orders.v1")
    assert isinstance(req.message, memoryview) and req.message.obj is frame
    assert bytes(req.message) == b"MESSAGE-BYTES"
    assert peek_request_id(frame) == 2**64 - 1


def test_message_encoded_with_headroom_is_a_frame_whose_header_is_rewritten_per_attempt() -> None:
    records = [(b"v" * 100, None, (), 5, None)]
    plain = encode_message(records, producer_id=1, epoch=2, sequence=3, created_ms=4)
    frame = encode_message(records, producer_id=1, epoch=2, sequence=3, created_ms=4,
                           headroom=request_header_size("orders.ü"))
    for request_id, ack, flags in ((1, AckLevel.ALL, RequestFlag.NONE), (2, AckLevel.LEADER, RequestFlag.SEAL)):
        pack_request_header_into(frame, request_id, ack, "orders.ü", flags)
        assert bytes(frame) == encode_request(request_id, ack, "orders.ü", plain, flags)
        req = decode_request(frame)
        assert (req.request_id, req.ack, req.flags, req.topic) == (request_id, ack, flags, "orders.ü")
        assert verify_message(req.message).sequence == 3


@pytest.mark.parametrize("frame, words", [
    (b"", "shorter"),
    (b"XX" + bytes(REQUEST_HEADER_SIZE), "bad magic"),
    (encode_request(7, AckLevel.ALL, "t", b"m")[:2] + b"\x09" + encode_request(7, AckLevel.ALL, "t", b"m")[3:],
     "version 9"),
    (encode_request(7, AckLevel.ALL, "t", b"m")[:3] + b"\x05" + encode_request(7, AckLevel.ALL, "t", b"m")[4:],
     "ack level 5"),
    (encode_request(7, AckLevel.ALL, "topic", b"")[:REQUEST_HEADER_SIZE + 2], "topic length 5"),
])
def test_bad_request_frames_raise_protocol_error_naming_problem(frame: bytes, words: str) -> None:
    with pytest.raises(ProtocolError, match=words):
        decode_request(frame)


def test_seal_flag_round_trips_and_unknown_flags_are_refused() -> None:
    assert decode_request(encode_request(3, AckLevel.ALL, "t", b"m")).flags == RequestFlag.NONE
    req = decode_request(encode_request(3, AckLevel.ALL, "t", b"m", RequestFlag.SEAL))
    assert req.flags & RequestFlag.SEAL and bytes(req.message) == b"m"
    frame = bytearray(encode_request(3, AckLevel.ALL, "t", b"m"))
    frame[4] = 0x80
    with pytest.raises(ProtocolError, match="unknown flags 0x80"):
        decode_request(bytes(frame))


def test_version_1_frames_without_flags_still_parse() -> None:
    """A producer from before the flags byte: same fields, no flags, one byte shorter."""
    v1 = b"MQ\x01\x02" + (77).to_bytes(8, "big") + (3).to_bytes(2, "big") + b"abc" + b"MSG"
    req = decode_request(v1)
    assert (req.request_id, req.ack, req.topic, bytes(req.message), req.flags) == \
        (77, AckLevel.ALL, "abc", b"MSG", RequestFlag.NONE)
    assert peek_request_id(v1) == 77
    with pytest.raises(ProtocolError, match="topic length 3"):
        decode_request(v1[:15])


def test_peek_request_id_of_short_frame() -> None:
    assert peek_request_id(b"abc") == NO_REQUEST_ID


def test_topic_length_limits() -> None:
    with pytest.raises(ProtocolError, match="topic"):
        encode_request(1, AckLevel.ALL, "", b"")
    with pytest.raises(ProtocolError, match="topic"):
        encode_request(1, AckLevel.ALL, "x" * 256, b"")


def test_ack_level_parse() -> None:
    assert [AckLevel.parse(v) for v in ("0", "1", "all", "ALL")] == [AckLevel.NONE, AckLevel.LEADER,
                                                                    AckLevel.ALL, AckLevel.ALL]
    with pytest.raises(ProtocolError, match="ack level '2'"):
        AckLevel.parse("2")


def test_acks_round_trip_several_per_frame() -> None:
    acks = [Ack(1, True, AckCode.OK, "", "bkt", "00/dev/topics/t/x", 3, 2, 99),
            Ack(2, False, AckCode.NOT_HERE, "moved", brokers=("http://b2:1",)),
            Ack(3, True)]
    assert decode_acks(encode_acks(acks)) == acks


@given(st.binary(max_size=64))
def test_decode_acks_is_total(raw: bytes) -> None:
    try:
        decode_acks(raw)
    except ProtocolError:
        pass


@pytest.mark.parametrize("payload", [msgpack.packb({"id": 1}), msgpack.packb([{"ok": True}]),
                                     msgpack.packb([1, 2]), b"\xc1"])
def test_malformed_ack_frames(payload: bytes) -> None:
    with pytest.raises(ProtocolError, match="malformed"):
        decode_acks(payload)
