"""The produce wire protocol: request frames and ack frames round-trip, bad bytes fail typed."""

from __future__ import annotations

from collections.abc import Callable

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memq.errors import ProtocolError
from memq.format.wire import (ACK_VERSION, NO_REQUEST_ID, REQUEST_HEADER_SIZE, Ack, AckCode, AckLevel, RequestFlag,
                              decode_acks, decode_request, encode_acks, encode_bundle, encode_request, is_bundle,
                              pack_request_header_into, peek_request_id, request_header_size, split_bundle)
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


def test_a_partition_round_trips_with_and_without_a_transaction_and_frames_without_one_are_unchanged() -> None:
    """RequestFlag.PARTITION: a compacted topic's Message names its read partition (placed by key)."""
    plain = encode_request(5, AckLevel.ALL, "t", b"m", RequestFlag.SEAL)
    assert encode_request(5, AckLevel.ALL, "t", b"m", RequestFlag.SEAL, partition=-1) == plain
    assert decode_request(plain).partition == -1
    for txn in ("", "tx-1"):
        frame = encode_request(5, AckLevel.ALL, "t", b"m", RequestFlag.SEAL, txn, partition=2**32 - 1)
        assert len(frame) == len(encode_request(5, AckLevel.ALL, "t", b"m", RequestFlag.SEAL, txn)) + 4
        req = decode_request(frame)
        assert (req.partition, req.transactional_id, bytes(req.message)) == (2**32 - 1, txn, b"m")
        assert req.flags is RequestFlag.SEAL   # the partition is in `partition`, not in the flags
        assert decode_request(encode_request(5, AckLevel.ALL, "t", b"m", transactional_id=txn, partition=0)) \
            .flags is RequestFlag.NONE
    head = bytearray(request_header_size("t", "", 7) + 1)
    pack_request_header_into(head, 9, AckLevel.LEADER, "t", partition=7)
    assert decode_request(bytes(head)).partition == 7
    cut = encode_request(5, AckLevel.ALL, "t", b"", partition=3)[:-1]   # the partition cut short
    with pytest.raises(ProtocolError, match="partition does not fit"):
        decode_request(cut)


def test_version_1_frames_without_flags_still_parse() -> None:
    """A producer from before the flags byte: same fields, no flags, one byte shorter."""
    v1 = b"MQ\x01\x02" + (77).to_bytes(8, "big") + (3).to_bytes(2, "big") + b"abc" + b"MSG"
    req = decode_request(v1)
    assert (req.request_id, req.ack, req.topic, bytes(req.message), req.flags) == \
        (77, AckLevel.ALL, "abc", b"MSG", RequestFlag.NONE)
    assert peek_request_id(v1) == 77
    with pytest.raises(ProtocolError, match="topic length 3"):
        decode_request(v1[:15])


def test_a_bundle_holds_requests_in_order_as_zero_copy_views() -> None:
    frames = [encode_request(i, AckLevel.LEADER, f"t{i}", b"m" * i) for i in range(1, 4)]
    frames.append(bytearray(encode_request(9, AckLevel.ALL, "ü", b"last", RequestFlag.SEAL)))
    bundle = encode_bundle(frames)
    assert is_bundle(bundle) and not any(is_bundle(f) for f in frames)
    views = split_bundle(bundle)
    assert [bytes(v) for v in views] == [bytes(f) for f in frames]
    reqs = [decode_request(v) for v in views]
    assert [(r.request_id, r.topic, bytes(r.message)) for r in reqs] == \
        [(1, "t1", b"m"), (2, "t2", b"mm"), (3, "t3", b"mmm"), (9, "ü", b"last")]
    assert reqs[-1].flags is RequestFlag.SEAL and reqs[0].message.obj is bundle
    assert peek_request_id(bundle) == NO_REQUEST_ID   # a bundle's error ack names no request


@pytest.mark.parametrize("cut, words", [
    (lambda b: b[:3], "holds no request"),
    (lambda b: b[:-1], "does not fit"),
    (lambda b: b + b"\x00\x00", "cut off"),
    (lambda b: b + b"\x00\x00\x00\x00", "of 0 bytes"),
    (lambda b: b"XX" + b[2:], "not a bundle"),
])
def test_a_malformed_bundle_is_refused_whole(cut: Callable[[bytes], bytes], words: str) -> None:
    bundle = encode_bundle([encode_request(1, AckLevel.LEADER, "t", b"m"), encode_request(2, AckLevel.LEADER, "t", b"n")])
    with pytest.raises(ProtocolError, match=words):
        split_bundle(cut(bundle))


def test_a_bundle_inside_a_bundle_is_not_a_request() -> None:
    inner = encode_bundle([encode_request(1, AckLevel.LEADER, "t", b"m")])
    [view] = split_bundle(encode_bundle([inner]))
    with pytest.raises(ProtocolError, match="version 3 is not supported"):
        decode_request(view)


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


def _decode_acks_v1(frame: bytes) -> list[dict[str, object]]:
    """The ack decoder of ack version 1 clients (before throttle_ms), field for field."""
    return [dict(id=int(d["id"]), ok=bool(d["ok"]), code=str(d["code"]), error=str(d.get("error", "")),
                 bucket=str(d.get("bucket", "")), key=str(d.get("key", "")), index=int(d.get("index", -1)),
                 partition=int(d.get("partition", -1)), offset=int(d.get("offset", -1)),
                 brokers=tuple(d.get("brokers", ())))
            for d in msgpack.unpackb(frame)]


def test_ack_version_2_throttle_time_round_trips_and_version_1_clients_still_parse_it() -> None:
    assert ACK_VERSION >= 2
    throttled = [Ack(7, True, AckCode.OK, "", "bkt", "00/dev/topics/t/x", 1, 0, 5, throttle_ms=1250),
                 Ack(8, True, throttle_ms=1)]
    frame = encode_acks(throttled)
    assert decode_acks(frame) == throttled
    old = _decode_acks_v1(frame)                       # an old client: same acks, the new key ignored
    assert [(a["id"], a["ok"], a["key"], a["offset"]) for a in old] == [(7, True, "00/dev/topics/t/x", 5),
                                                                         (8, True, "", -1)]


def test_unthrottled_acks_are_the_version_1_bytes_and_version_1_frames_read_as_unthrottled() -> None:
    ack = Ack(3, False, AckCode.BUSY, "full")
    v1_frame = msgpack.packb([{"id": 3, "ok": False, "code": "BUSY", "error": "full"}])
    assert encode_acks([ack]) == v1_frame               # what a version 1 broker sent
    assert decode_acks(v1_frame) == [ack] and ack.throttle_ms == 0


@pytest.mark.parametrize("bad", [-1, "5", 1.5, True, None])
def test_a_bad_throttle_time_is_a_protocol_error(bad: object) -> None:
    with pytest.raises(ProtocolError, match="throttle_ms"):
        decode_acks(msgpack.packb([{"id": 1, "ok": True, "code": "OK", "throttle_ms": bad}]))


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
