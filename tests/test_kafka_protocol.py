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
from memq.kafka_api.protocol import (SUPPORTED, ApiKey, ErrorCode, Node, ProduceResult, PartitionResult, Reader,
                                     TopicPartitions, decode_metadata, decode_produce, decode_request_header,
                                     encode_api_versions, encode_metadata, encode_produce, is_supported)
from tests.support.kafka_frames import produce_body, request


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
    assert not is_supported(h)
    out = encode_api_versions(h, ErrorCode.UNSUPPORTED_VERSION)
    r = Reader(out, 4)
    assert (r.i32(), r.i16(), r.i32()) == (7, ErrorCode.UNSUPPORTED_VERSION, len(SUPPORTED))
    ranges = {r.i16(): (r.i16(), r.i16()) for _ in range(len(SUPPORTED))}
    r.done()   # v0 shape: no throttle time
    assert ranges == {int(k): v for k, v in SUPPORTED.items()}
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
    for api_key, version in ((0, 8), (3, 8), (3, 1)):
        frame = struct.pack(">hhi", api_key, version, 1) + junk
        try:
            h, r = decode_request_header(frame)
            decode_produce(r) if api_key == 0 else decode_metadata(h, r)
        except ProtocolError:
            pass


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
