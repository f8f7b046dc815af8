"""memq.kafka_api.protocol and mapping: the sans-I/O Kafka codec and the Kafka -> memq mapping."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memq.errors import ConfigError, ProtocolError
from memq.format.metadata import BrokerMetadata, ClusterMetadata, StorageMetadata, TopicMetadata, TopicRefusal
from memq.format.wire import AckCode, AckLevel
from memq.kafka_api.mapping import ack_level, error_code, memq_producer_id, metadata_view, node_id, split_address
from memq.broker.doors.kafka import SERVED
from memq.kafka_api.protocol import (ApiKey, ErrorCode, FetchedPartition, FetchPartition, ListedOffset,
                                     Node, ProduceResult, PartitionResult, Reader, TopicPartitions, decode_fetch,
                                     decode_list_offsets, decode_metadata, decode_produce, decode_request_header,
                                     encode_api_versions, encode_fetch, encode_list_offsets, encode_metadata,
                                     encode_produce)
from tests.support.kafka_frames import fetch_body, list_offsets_body, produce_body, request


def _frame(raw: bytes) -> bytes:
    """A request as the listener sees it: without the size prefix."""
    (size,) = struct.unpack_from(">i", raw)
    assert size == len(raw) - 4
    return raw[4:]


def test_request_header_and_produce_body_decode() -> None:
    h, r = decode_request_header(_frame(request(0, 7, 42, produce_body("orders", 2, b"batch", acks=1), "cli")))
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (0, 7, 42, "cli")
    req = decode_produce(r)
    assert (req.transactional_id, req.acks, req.timeout_ms) == (None, 1, 5000)
    ((topic, (part,)),) = req.topics
    assert (topic, part.index, bytes(part.records or b"")) == ("orders", 2, b"batch")


def test_api_versions_lists_exactly_what_is_served_and_falls_back_to_v0_for_newer() -> None:
    h, _ = decode_request_header(_frame(request(18, 3, 7, b"")))
    assert SERVED[ApiKey.API_VERSIONS][1] < h.api_version
    out = encode_api_versions(h, SERVED, ErrorCode.UNSUPPORTED_VERSION)
    r = Reader(out, 4)
    assert (r.i32(), r.i16(), r.i32()) == (7, ErrorCode.UNSUPPORTED_VERSION, len(SERVED))
    ranges = {r.i16(): (r.i16(), r.i16()) for _ in range(len(SERVED))}
    r.done()   # v0 shape: no throttle time
    assert ranges == {int(k): v for k, v in SERVED.items()}
    assert ranges[ApiKey.PRODUCE] == (3, 8) and ranges[ApiKey.API_VERSIONS] == (0, 2)


@pytest.mark.parametrize("version", range(1, 9))
def test_metadata_response_parses_at_every_served_version(version: int) -> None:
    body = struct.pack(">i", 1) + struct.pack(">h", 1) + b"t" + (b"\x00" if version >= 4 else b"") \
        + (b"\x00\x00" if version >= 8 else b"")
    h, r = decode_request_header(_frame(request(3, version, 9, body)))
    assert decode_metadata(h, r).topics == ("t",)
    out = encode_metadata(h, [Node(5, "h", 9092, "r1")], "c", 5, [TopicPartitions("t", leaders=(5, 5))])
    r = Reader(out, 4)
    assert r.i32() == 9
    if version >= 3:
        r.i32()
    assert r.count() == 1 and (r.i32(), r.string(), r.i32(), r.nullable_string()) == (5, "h", 9092, "r1")
    if version >= 2:
        assert r.nullable_string() == "c"
    assert r.i32() == 5 and r.count() == 1
    assert (r.i16(), r.string(), r.i8(), r.count()) == (0, "t", 0, 2)
    for i in range(2):
        assert (r.i16(), r.i32(), r.i32()) == (0, i, 5)
        if version >= 7:
            r.i32()
        assert [r.i32() for _ in range(4)] == [1, 5, 1, 5]
        if version >= 5:
            assert r.i32() == 0
    if version >= 8:
        r.i32()
        r.i32()
    r.done()


def test_produce_response_v8_carries_the_error_message() -> None:
    h, _ = decode_request_header(_frame(request(0, 8, 3, b"")))
    out = encode_produce(h, ProduceResult({"t": [PartitionResult(1, ErrorCode.CORRUPT_MESSAGE, -1, "bad crc")]}))
    r = Reader(out, 4)
    assert (r.i32(), r.count(), r.string(), r.count(), r.i32(), r.i16()) == (3, 1, "t", 1, 1, 2)
    r.pos += 24   # base offset, log append time, log start offset
    assert (r.count(), r.nullable_string(), r.i32()) == (0, "bad crc", 0)
    r.done()


@settings(max_examples=300)
@given(junk=st.binary(max_size=200))
def test_any_bytes_decode_or_raise_protocol_error(junk: bytes) -> None:
    decoders = {0: lambda h, r: decode_produce(r), 1: decode_fetch, 2: decode_list_offsets, 3: decode_metadata}
    for api_key, version in ((0, 8), (3, 8), (3, 1), (1, 4), (1, 7), (1, 11), (2, 1), (2, 5)):
        frame = struct.pack(">hhi", api_key, version, 1) + junk
        try:
            h, r = decode_request_header(frame)
            decoders[api_key](h, r)
        except ProtocolError:
            pass


@pytest.mark.parametrize("version", range(4, 12))
def test_fetch_request_decodes_and_response_parses_at_every_served_version(version: int) -> None:
    raw = request(1, version, 9, fetch_body(version, [("a", 0, 5 << 24, 1000), ("b", 2, 7, 50)], max_wait_ms=321,
                                            rack="az1"))
    h, r = decode_request_header(_frame(raw))
    req = decode_fetch(h, r)
    assert (req.max_wait_ms, req.min_bytes, req.max_bytes) == (321, 1, 1 << 20)
    assert req.topics == (("a", (FetchPartition(0, 5 << 24, 1000),)), ("b", (FetchPartition(2, 7, 50),)))
    assert req.rack == ("az1" if version >= 11 else "")
    assert req.zstd == (version >= 10)   # KIP-110: zstd batches only to Fetch v10+
    out = Reader(encode_fetch(h, [("a", [FetchedPartition(0, ErrorCode.NONE, 9 << 24, 0, b"RECS")]),
                                  ("b", [FetchedPartition(2, ErrorCode.OFFSET_OUT_OF_RANGE)])]), 4)
    assert (out.i32(), out.i32()) == (9, 0)              # correlation id, throttle time
    if version >= 7:
        assert (out.i16(), out.i32()) == (0, 0)          # sessionless: every fetch is a full one
    assert out.count() == 2
    seen = []
    for _ in range(2):
        name, _n, index, error, high, stable = out.string(), out.count(), out.i32(), out.i16(), out.i64(), out.i64()
        start = out.i64() if version >= 5 else None
        assert out.count(nullable=True) == -1            # no aborted transactions
        if version >= 11:
            assert out.i32() == -1                       # preferred read replica: none
        seen.append((name, index, error, high, stable, start, out.nullable_bytes(out.i32())))
    out.done()
    assert seen[0] == ("a", 0, 0, 9 << 24, 9 << 24, 0 if version >= 5 else None, b"RECS")
    assert seen[1][:3] == ("b", 2, ErrorCode.OFFSET_OUT_OF_RANGE) and seen[1][-1] == b""   # empty, never null


def test_acks_map_to_memq_ack_levels() -> None:
    assert [ack_level(a) for a in (0, 1, -1, 2)] == [AckLevel.NONE, AckLevel.LEADER, AckLevel.ALL, None]
    assert error_code(AckCode.NOT_HERE) is ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert error_code(AckCode.BUSY) is ErrorCode.REQUEST_TIMED_OUT


def test_partitions_of_one_kafka_producer_get_distinct_memq_producer_ids() -> None:
    ids = {memq_producer_id(pid, p) for pid in (1, 2, 2**47 - 1) for p in range(300)}
    assert len(ids) == 900 and max(ids) < 2**64


def test_metadata_view_spreads_leaders_over_hosting_brokers_with_a_kafka_listener() -> None:
    meta = ClusterMetadata(
        cluster="c", broker_id="b1", kafka_bootstrap_servers="k:1", storage=StorageMetadata(),
        brokers=(BrokerMetadata("b1", "http://h1:1", kafka_address="h1:9092"),
                 BrokerMetadata("b2", "http://h2:1", kafka_address="h2:9092"),
                 BrokerMetadata("b3", "http://h3:1")),
        topics={"t": TopicMetadata("t", "n", 3, ("http://h1:1", "http://h2:1")),
                "old": TopicMetadata("old", "n", 1, ("http://h3:1",))})
    nodes, topics = metadata_view(meta, ("t", "old", "nope"))
    assert [(n.host, n.port) for n in nodes] == [("h1", 9092), ("h2", 9092)]
    b1, b2 = node_id("b1"), node_id("b2")
    assert topics == [TopicPartitions("t", leaders=(b1, b2, b1)),
                      TopicPartitions("old", ErrorCode.LEADER_NOT_AVAILABLE),
                      TopicPartitions("nope", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]
    assert [t.name for t in metadata_view(meta, None)[1]] == ["old", "t"]
    hidden = dataclasses.replace(meta, topics={}, refused={n: TopicRefusal("bob", "describe") for n in ("t", "nope")})
    assert metadata_view(hidden, ("t", "nope"))[1] == [TopicPartitions("t", ErrorCode.TOPIC_AUTHORIZATION_FAILED),
                                                      TopicPartitions("nope", ErrorCode.TOPIC_AUTHORIZATION_FAILED)]


def test_bad_listener_address_names_the_value() -> None:
    with pytest.raises(ConfigError, match="'nohost'"):
        split_address("nohost")


@pytest.mark.parametrize("version", range(1, 6))
def test_list_offsets_request_decodes_and_response_parses_at_every_served_version(version: int) -> None:
    h, r = decode_request_header(_frame(request(2, version, 4, list_offsets_body(version, "t", [(0, -1), (1, 123)]))))
    assert decode_list_offsets(h, r).topics == (("t", ((0, -1), (1, 123))),)
    out = Reader(encode_list_offsets(h, [("t", [ListedOffset(0, offset=3 << 24), ListedOffset(1, timestamp=123,
                                                                                               offset=5)])]), 4)
    assert out.i32() == 4
    if version >= 2:
        assert out.i32() == 0
    assert (out.count(), out.string(), out.count()) == (1, "t", 2)
    for want in ((0, 0, -1, 3 << 24), (1, 0, 123, 5)):
        assert (out.i32(), out.i16(), out.i64(), out.i64()) == want
        if version >= 4:
            assert out.i32() == -1
    out.done()
