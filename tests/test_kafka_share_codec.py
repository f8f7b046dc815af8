"""memq.kafka_api.flexible, share and metadata_flex: the flexible-version codec and the share-group
messages, checked against the test's own byte-level client (tests.support.share_frames)."""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memq.errors import ProtocolError
from memq.kafka_api.flexible import FlexReader, FlexWriter, flex_body, uvarint
from memq.kafka_api.metadata_flex import (UNKNOWN_TOPIC_ID, decode_metadata_flex, encode_metadata_flex, topic_id)
from memq.broker.doors.kafka import SERVED
from memq.kafka_api.protocol import ApiKey, Node, TopicPartitions, decode_request_header
from memq.kafka_api.share import (AckType, DescribedGroup, SharePartitionData, ShareError, decode_heartbeat,
                                  decode_share_acknowledge, decode_share_fetch, encode_describe, encode_heartbeat,
                                  encode_share_acknowledge, encode_share_fetch)
from memq.kafka_api.share_admin import (PartitionResult, decode_alter_offsets, decode_delete_offsets,
                                        decode_describe_offsets, encode_changed_offsets, encode_describe_offsets)
from tests.support.share_frames import (alter_offsets_body, cstr, delete_offsets_body, describe_offsets_body,
                                        flex_request, heartbeat_body, parse_changed_offsets, parse_describe_offsets,
                                        parse_heartbeat, parse_share_ack, parse_share_fetch, share_ack_body,
                                        share_fetch_body, uv)

T1, T2 = uuid.uuid4(), uuid.uuid4()


def _body(raw: bytes) -> FlexReader:
    h, r = decode_request_header(raw[4:])
    return flex_body(r)


@given(st.integers(0, 2**32 - 1))
def test_uvarint_round_trips(n: int) -> None:
    assert FlexReader(uvarint(n)).uvarint() == n
    assert uvarint(n) == uv(n)


def test_compact_fields_nulls_and_tags_are_read_and_written() -> None:
    w = FlexWriter(7).string("héllo").string(None).blob(b"xyz").blob(None).count(2).count(None).uuid(T1).tags()
    raw = w.frame()
    assert struct.unpack_from(">ii", raw) == (len(raw) - 4, 7)
    r = FlexReader(raw, 9)   # past size, correlation id and header tags
    assert r.compact_string() == "héllo" and r.compact_nullable_string() is None
    assert bytes(r.compact_bytes() or b"") == b"xyz" and r.compact_bytes() is None
    assert r.compact_count() == 2 and r.compact_count(nullable=True) == -1
    assert r.uuid() == T1
    r.skip_tags()
    r.done()
    # tags with values are skipped whole
    r = FlexReader(uv(2) + uv(0) + uv(3) + b"abc" + uv(5) + uv(0) + b"!")
    r.skip_tags()
    assert bytes(r.buf[r.pos:]) == b"!"


@pytest.mark.parametrize("raw", [b"\xff\xff\xff\xff\xff\xff", b"\x05ab", b"\x80", b"\x03\x00\x01"])
def test_truncated_or_impossible_fields_are_protocol_errors(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        r = FlexReader(raw)
        r.compact_string()
        r.skip_tags()


def test_share_apis_and_flexible_metadata_are_advertised() -> None:
    assert SERVED[ApiKey.METADATA] == (1, 12)
    for key in (76, 77, 78, 79):
        assert SERVED[key] == (1, 1)


def test_heartbeat_request_and_response() -> None:
    req = decode_heartbeat(_body(flex_request(76, 1, 3, heartbeat_body("g", "m1", 0, ["a", "b"]))))
    assert (req.group_id, req.member_id, req.member_epoch, req.rack_id, req.topics) == ("g", "m1", 0, None, ("a", "b"))
    assert decode_heartbeat(_body(flex_request(76, 1, 3, heartbeat_body("g", "m1", 4, None)))).topics is None
    hb = parse_heartbeat(encode_heartbeat(3, ShareError.NONE, None, "m1", 4, 5000, {T1: (0, 2), T2: ()}))
    assert (hb.error, hb.member_id, hb.epoch, hb.interval_ms) == (0, "m1", 4, 5000)
    assert hb.assignment == {T1: [0, 2], T2: []}
    assert parse_heartbeat(encode_heartbeat(3, ShareError.NOT_COORDINATOR, "no", None, 0, 1, None)).assignment is None


def test_share_fetch_request_merges_a_topic_listed_twice() -> None:
    req = decode_share_fetch(_body(flex_request(78, 1, 1, share_fetch_body(
        "g", "m", 2, {(T1, 0): [], (T1, 1): [(5, 9, 1), (10, 10, 3)]}, max_records=7, forgotten=((T2, 3),)))))
    assert (req.group_id, req.member_id, req.session_epoch, req.max_records) == ("g", "m", 2, 7)
    assert req.partitions[(T1, 0)] == ()
    assert [(b.first, b.last, b.types) for b in req.partitions[(T1, 1)]] == [(5, 9, (AckType.ACCEPT,)),
                                                                            (10, 10, (AckType.REJECT,))]
    assert req.forgotten == [(T2, 3)]
    # librdkafka lists added partitions, then those with acknowledgements: one topic, twice
    head = cstr("g") + cstr("m") + struct.pack(">iiiiii", 3, 0, 1, 100, 10, 10)
    added = T1.bytes + uv(2) + struct.pack(">i", 0) + uv(1) + b"\0" + b"\0"
    acking = (T1.bytes + uv(2) + struct.pack(">i", 0) + uv(2) + struct.pack(">qq", 1, 2) + uv(2) + b"\x01\0"
              + b"\0" + b"\0")
    req = decode_share_fetch(FlexReader(head + uv(3) + added + acking + uv(1) + b"\0"))
    assert [(b.first, b.last) for b in req.partitions[(T1, 0)]] == [(1, 2)]


def test_share_fetch_response_round_trips_through_the_client_parser() -> None:
    part = SharePartitionData(1, records=bytearray(b"RECORDS"), acquired=[(16, 20, 1), (1 << 24, 1 << 24, 2)], leader=9)
    bad = SharePartitionData(2, error=ShareError.NOT_LEADER_OR_FOLLOWER, ack_error=ShareError.INVALID_RECORD_STATE)
    got = parse_share_fetch(encode_share_fetch(5, ShareError.NONE, None, 30_000, {T1: [part, bad]}, []))
    assert (got.error, got.lock_ms) == (0, 30_000)
    assert got.parts[(T1, 1)].records == b"RECORDS" and got.parts[(T1, 1)].leader == 9
    assert got.parts[(T1, 1)].acquired == [(16, 20, 1), (1 << 24, 1 << 24, 2)]
    assert (got.parts[(T1, 2)].error, got.parts[(T1, 2)].ack_error) == (6, 121)


def test_share_acknowledge_request_and_response() -> None:
    req = decode_share_acknowledge(_body(flex_request(79, 1, 1, share_ack_body("g", "m", -1, {(T2, 4): [(1, 3, 2)]}))))
    assert req.session_epoch == -1 and [(b.first, b.last, b.types) for b in req.partitions[(T2, 4)]] == [
        (1, 3, (AckType.RELEASE,))]
    error, parts = parse_share_ack(encode_share_acknowledge(1, ShareError.NONE, None,
                                                            {T2: [(4, ShareError.INVALID_RECORD_STATE, "x", 1)]}, []))
    assert error == 0 and parts == {(T2, 4): 121}


def test_describe_encodes_an_unknown_group() -> None:
    raw = encode_describe(1, [DescribedGroup("g", ShareError.GROUP_ID_NOT_FOUND, "none")])
    r = FlexReader(raw, 9)
    r.i32()
    assert r.compact_count() == 1 and r.i16() == 69


@pytest.mark.parametrize("acks", [[(5, 4, 1)], [(5, 9, 7)], [(-1, 2, 1)]])
def test_malformed_acknowledgement_batches_are_protocol_errors(acks: list[tuple[int, int, int]]) -> None:
    with pytest.raises(ProtocolError):
        decode_share_fetch(_body(flex_request(78, 1, 1, share_fetch_body("g", "m", 1, {(T1, 0): acks}))))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_share_frames_decode_or_raise_protocol_error(junk: bytes) -> None:
    for decode in (decode_share_fetch, decode_share_acknowledge, decode_heartbeat):
        try:
            decode(FlexReader(junk))
        except ProtocolError:
            pass


def test_flexible_metadata_by_name_and_by_id() -> None:
    tid = topic_id("c1", "orders")
    assert tid == topic_id("c1", "orders") != topic_id("c2", "orders")
    body = uv(3) + tid.bytes + cstr(None) + b"\0" + uuid.UUID(int=5).bytes + cstr(None) + b"\0" + b"\0\0" + b"\0"
    req = decode_metadata_flex(12, FlexReader(body))
    assert req.names == () and req.ids == (tid, uuid.UUID(int=5))
    body = uv(2) + bytes(16) + cstr("orders") + b"\0" + b"\1\0" + b"\0"
    assert decode_metadata_flex(12, FlexReader(body)).names == ("orders",)
    assert decode_metadata_flex(12, FlexReader(b"\0\1\0\0")).names is None   # null: every topic
    raw = encode_metadata_flex(12, 1, [Node(7, "h", 9092)], "c1", 7, [TopicPartitions("orders", leaders=(7, 7))],
                               (uuid.UUID(int=5),))
    r = FlexReader(raw, 9)
    r.i32()
    assert r.compact_count() == 1 and (r.i32(), r.compact_string(), r.i32(), r.compact_nullable_string()) == (
        7, "h", 9092, None)
    r.skip_tags()
    assert (r.compact_nullable_string(), r.i32(), r.compact_count()) == ("c1", 7, 2)
    assert (r.i16(), r.compact_nullable_string(), r.uuid(), r.i8(), r.compact_count()) == (0, "orders", tid, 0, 2)
    for p in range(2):
        assert (r.i16(), r.i32(), r.i32(), r.i32()) == (0, p, 7, -1)
        for _ in range(2):
            assert r.compact_count() == 1 and r.i32() == 7
        assert r.compact_count() == 0
        r.skip_tags()
    r.i32()
    r.skip_tags()
    assert (r.i16(), r.compact_nullable_string(), r.uuid()) == (UNKNOWN_TOPIC_ID, None, uuid.UUID(int=5))


def test_a_metadata_request_for_every_topic_as_librdkafka_sends_it() -> None:
    """librdkafka 2.16 leaves the null topic array of an all-topics v12 request as a 4-byte
    placeholder: the bytes after the last field are ignored, as Kafka's brokers do."""
    raw = bytes.fromhex("0003000c00000006000772646b61666b610000000000010000")
    h, r = decode_request_header(raw)
    assert decode_metadata_flex(h.api_version, flex_body(r)).names is None


def test_share_group_offsets_requests_decode_and_answers_parse() -> None:
    req = describe_offsets_body({"g": {"t": [0, 2]}, "all": None})
    assert decode_describe_offsets(_body(flex_request(90, 0, 1, req))) == [("g", {"t": (0, 2)}), ("all", None)]
    assert decode_alter_offsets(_body(flex_request(91, 0, 2, alter_offsets_body("g", {"t": {0: 5 << 24, 1: 0}})))) \
        == ("g", {"t": {0: 5 << 24, 1: 0}})
    assert decode_delete_offsets(_body(flex_request(92, 0, 3, delete_offsets_body("g", {"t": [1]})))) == ("g", {"t": (1,)})
    with pytest.raises(ProtocolError):
        decode_alter_offsets(_body(flex_request(91, 0, 4, alter_offsets_body("g", {"t": {0: 1}})[:-5])))
    raw = encode_describe_offsets(9, [("g", [("t", T1, [PartitionResult(0, start_offset=7), PartitionResult(
        2, ShareError.UNKNOWN_TOPIC_OR_PARTITION, "no")])], ShareError.NONE, None),
        ("h", [], ShareError.GROUP_ID_NOT_FOUND, "none")])
    got = parse_describe_offsets(raw)
    assert got["g"].starts == {("t", 0): (7, 0), ("t", 2): (-1, 3)} and got["g"].topic_ids == {"t": T1}
    assert (got["h"].error, got["h"].message) == (69, "none")
    raw = encode_changed_offsets(9, ShareError.NONE, None, [("t", T1, [PartitionResult(0), PartitionResult(
        1, ShareError.KAFKA_STORAGE_ERROR, "down")])])
    assert parse_changed_offsets(raw) == (0, {("t", 0): 0, ("t", 1): 56})
    assert parse_changed_offsets(encode_changed_offsets(9, ShareError.NON_EMPTY_GROUP, "busy", [])) == (68, {})
    for key in (ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, ApiKey.ALTER_SHARE_GROUP_OFFSETS, ApiKey.DELETE_SHARE_GROUP_OFFSETS):
        assert SERVED[key] == (0, 0)
