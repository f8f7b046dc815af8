"""memq's own records framed for Kafka readers in each of Kafka's codecs (`kafka_compression`):
every codec decodes back exactly (values, keys, headers, timestamps), by memq's decoder and by a
Kafka client's (aiokafka's codecs: cramjam, as kafkajs' and librdkafka's framing expects), a
Kafka producer's batch is served as it came whatever the codec, and the setting is validated."""

from __future__ import annotations

import dataclasses
import zlib

import pytest
from aiokafka import codec as aiocodec
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.kafka_read import part_of, read_placed, recs

from memq.config import BrokerConfig, TopicConfig, build
from memq.errors import ConfigError
from memq.format import LogMessage
from memq.format.kafka_records import (KAFKA_BATCH_HEADER_SIZE, KafkaCodec, decode_kafka_records, encode_kafka_batch,
                                       split_kafka_batches, verify_kafka_batch)
from memq.kafka_api.records import framing_codec
from memq.kafka_api.offsets import first_offset, kafka_offset
from memq.kafka_api.records import frame_part, place

records = st.lists(st.builds(
    LogMessage, value=st.binary(max_size=300), key=st.none() | st.binary(max_size=8),
    headers=st.lists(st.tuples(st.text(max_size=6), st.binary(max_size=6)), max_size=3).map(tuple),
    timestamp_ms=st.integers(0, 2**41), message_id=st.none()), min_size=1, max_size=40)

#: A Kafka client's decoder of each codec's record bytes (aiokafka, Python bindings of the C codecs).
CLIENT_DECODE = {KafkaCodec.GZIP: aiocodec.gzip_decode, KafkaCodec.SNAPPY: aiocodec.snappy_decode,
                 KafkaCodec.LZ4: aiocodec.lz4_decode, KafkaCodec.ZSTD: aiocodec.zstd_decode}


def compressible(n: int, tag: str = "a") -> list[LogMessage]:
    return [r._replace(value=b"the same sentence, again and again %d" % (i % 10)) for i, r in enumerate(recs(tag, n))]


@settings(max_examples=40)
@given(recs=records, codec=st.sampled_from(list(KafkaCodec)))
def test_every_codec_frames_records_that_decode_back_exactly(recs: list[LogMessage], codec: KafkaCodec) -> None:
    assert decode_kafka_records(encode_kafka_batch(recs, codec)) == recs


@pytest.mark.parametrize("codec", [c for c in KafkaCodec if c is not KafkaCodec.NONE])
def test_compressible_records_go_out_in_the_codec_and_a_clients_decoder_reads_them(codec: KafkaCodec) -> None:
    a = compressible(3000)   # ~130 KiB: more than one snappy (32 KiB) and lz4 (64 KiB) block
    batch = encode_kafka_batch(a, codec)
    assert verify_kafka_batch(batch).codec is codec
    plain = encode_kafka_batch(a)
    assert len(batch) * 2 < len(plain)
    raw = CLIENT_DECODE[codec](batch[KAFKA_BATCH_HEADER_SIZE:])
    assert raw == plain[KAFKA_BATCH_HEADER_SIZE:]   # the same records as the uncompressed batch's


def test_gzip_is_a_gzip_container_and_snappy_and_lz4_are_framed_as_the_java_client_reads_them() -> None:
    a = compressible(3000)
    body = {c: encode_kafka_batch(a, c)[KAFKA_BATCH_HEADER_SIZE:] for c in KafkaCodec}
    assert zlib.decompress(body[KafkaCodec.GZIP], wbits=31) == body[KafkaCodec.NONE]
    assert body[KafkaCodec.SNAPPY][:16] == b"\x82SNAPPY\x00\0\0\0\x01\0\0\0\x01"   # xerial, v1 compatible 1
    flg, bd = body[KafkaCodec.LZ4][4:6]
    assert body[KafkaCodec.LZ4][:4] == b"\x04\x22\x4d\x18" and flg & 0x20 and bd == 0x40   # independent 64 KiB blocks


@pytest.mark.parametrize("codec", list(KafkaCodec))
def test_a_part_framed_in_each_codec_places_every_record_exactly_and_kafka_batches_as_they_came(
        codec: KafkaCodec) -> None:
    a, c, d = compressible(500, "a"), recs("c", 4), compressible(300, "d")
    raw = part_of([("memq", a), ("kafka", c), ("memq", d)])
    part = frame_part(raw, codec=codec)
    memq_batches = [part.batches[0], part.batches[2]]
    assert {verify_kafka_batch(b.data).codec for b in memq_batches} == {codec}
    assert verify_kafka_batch(part.batches[1].data).codec is KafkaCodec.LZ4   # the Kafka producer's, untouched
    assert part.batches[1].data == frame_part(raw, codec=KafkaCodec.NONE).batches[1].data
    for zstd_fetch in (True, False):   # Fetch < v10 gets zstd batches decompressed, the others as framed
        out = bytearray()
        assert place(part, first_offset(5), 0, out, 1 << 22, zstd=zstd_fetch) == 804
        assert read_placed(bytes(out)) == [(kafka_offset(5, i), r) for i, r in enumerate(a + c + d)]
        placed = {verify_kafka_batch(b).codec for b in split_kafka_batches(bytes(out))}
        assert KafkaCodec.ZSTD not in placed if not zstd_fetch else codec in placed


def test_the_topic_setting_wins_over_the_broker_default_and_auto_takes_it() -> None:
    broker = BrokerConfig()
    assert framing_codec(None, broker) is KafkaCodec.GZIP   # the default every tested client reads unaided
    assert framing_codec(TopicConfig("t"), dataclasses.replace(broker, kafka_compression="lz4")) is KafkaCodec.LZ4
    assert framing_codec(TopicConfig("t", kafka_compression="zstd"), broker) is KafkaCodec.ZSTD
    assert framing_codec(TopicConfig("t", kafka_compression="none"), broker) is KafkaCodec.NONE


def test_a_bad_codec_is_a_config_error_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"topic t\.kafka_compression.*'brotli'.*auto, none, gzip"):
        build(TopicConfig, {"name": "t", "kafka_compression": "brotli"}, "topic t")
    with pytest.raises(ConfigError, match=r"topic t\.kafka_compression = 'brotli' is not one of"):
        TopicConfig("t", kafka_compression="brotli")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"broker\.kafka_compression = 'auto' is not one of none, gzip"):
        BrokerConfig(kafka_compression="auto")  # type: ignore[arg-type]
    assert build(TopicConfig, {"name": "t", "kafka_compression": "LZ4"}, "topic t").kafka_compression == "lz4"
