"""memq.format.kafka_records: Kafka RecordBatch v2 decode, every codec, and totality on bad bytes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memq.errors import CorruptDataError, FormatError, UnsupportedVersionError
from memq.format import Codec, LogMessage, decode_batch, decode_message, encode_batch, verify_message
from memq.format.kafka_records import (KAFKA_BATCH_HEADER_SIZE, decode_kafka_records, kafka_fields, split_kafka_batches,
                                       verify_kafka_batch)
from memq.format.message import encode_kafka_message
from tests.support.kafka_frames import CODECS, record_batch

kafka_records = st.lists(st.builds(
    LogMessage,
    value=st.binary(max_size=64),
    key=st.none() | st.binary(max_size=16),
    headers=st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=3).map(tuple),
    timestamp_ms=st.integers(0, 2**41), message_id=st.none()), min_size=1, max_size=20)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(recs=kafka_records, codec=st.sampled_from(sorted(CODECS)))
def test_every_codec_decodes_exactly_what_was_written(recs: list[LogMessage], codec: str) -> None:
    assert decode_kafka_records(record_batch(recs, codec=codec)) == recs


def test_java_clients_framed_snappy_decodes() -> None:
    recs = [LogMessage(b"v" * 100, b"k", (("h", b"x"),), 1_700_000_000_000)] * 3
    assert decode_kafka_records(record_batch(recs, codec="snappy", xerial=True)) == recs


def test_null_value_and_null_header_value_decode_as_empty_bytes() -> None:
    raw = bytearray(record_batch([LogMessage(b"", b"k", (("h", b""),), 5)]))
    assert decode_kafka_records(bytes(raw)) == [LogMessage(b"", b"k", (("h", b""),), 5)]


def test_kafka_message_round_trips_through_the_stored_batch_readers_use() -> None:
    recs = [LogMessage(b"a", None, (), 10), LogMessage(b"b", b"k", (("x", b"1"),), 12)]
    kb = record_batch(recs, codec="zstd", producer_id=7, epoch=0, base_sequence=4)
    msg, header = encode_kafka_message(kb, verify_kafka_batch(kb), producer_id=7 << 16, epoch=0, sequence=4)
    assert verify_message(msg) == header
    assert (header.codec, header.count, header.min_timestamp_ms, header.max_timestamp_ms) == (Codec.KAFKA, 2, 10, 12)
    assert decode_message(msg)[1] == recs
    obj = b"".join(encode_batch([msg], [header], broker_id="b1"))
    assert decode_batch(obj)[1][0][1] == recs


def test_split_finds_each_batch_of_a_produce_records_field() -> None:
    one, two = record_batch([LogMessage(b"1", timestamp_ms=1)]), record_batch([LogMessage(b"2", timestamp_ms=2)])
    assert [bytes(v) for v in split_kafka_batches(one + two)] == [one, two]


def test_header_checks_name_the_problem() -> None:
    kb = bytearray(record_batch([LogMessage(b"x", timestamp_ms=1)]))
    flipped = bytearray(kb)
    flipped[-1] ^= 1
    with pytest.raises(CorruptDataError, match="CRC32C"):
        verify_kafka_batch(bytes(flipped))
    old = bytearray(kb)
    old[16] = 1
    with pytest.raises(UnsupportedVersionError, match="magic 1"):
        verify_kafka_batch(bytes(old))
    with pytest.raises(CorruptDataError, match="truncated"):
        verify_kafka_batch(bytes(kb[:KAFKA_BATCH_HEADER_SIZE - 1]))
    with pytest.raises(CorruptDataError, match="does not fit"):
        verify_kafka_batch(bytes(kb[:-1]))
    control = bytearray(kb)
    struct.pack_into(">h", control, 21, 0x20)
    with pytest.raises(UnsupportedVersionError, match="control"):
        verify_kafka_batch(bytes(control))


def _recrc(buf: bytearray) -> bytes:
    from crc32c import crc32c
    struct.pack_into(">I", buf, 17, crc32c(bytes(buf[21:])))
    return bytes(buf)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(recs=kafka_records, codec=st.sampled_from(sorted(CODECS)), pos=st.integers(0, 10_000),
       mask=st.integers(1, 255))
def test_a_flipped_byte_with_a_fixed_crc_raises_a_format_error_or_decodes(
        recs: list[LogMessage], codec: str, pos: int, mask: int) -> None:
    """Fuzz past the CRC (as a buggy producer would): the decoder is total, never another error."""
    buf = bytearray(record_batch(recs, codec=codec))
    pos = KAFKA_BATCH_HEADER_SIZE - 4 + pos % (len(buf) - KAFKA_BATCH_HEADER_SIZE + 4)
    buf[pos] ^= mask
    try:
        decode_kafka_records(_recrc(buf))
    except FormatError:
        pass


@settings(max_examples=300)
@given(junk=st.binary(max_size=300))
def test_junk_raises_a_format_error(junk: bytes) -> None:
    with pytest.raises(FormatError):
        split_kafka_batches(junk) if junk else verify_kafka_batch(junk)
        decode_kafka_records(junk)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(recs=kafka_records, codec=st.sampled_from(sorted(CODECS)), pos=st.integers(0, 10_000),
       mask=st.integers(0, 255))
def test_fields_read_the_keys_and_values_the_full_decoder_reads(
        recs: list[LogMessage], codec: str, pos: int, mask: int) -> None:
    """`kafka_fields` (the checks' lean walk: numba's where installed, else Python's) agrees with
    `decode_kafka_records` on every batch the decoder reads, and raises only FormatError on the
    rest (flipped bytes under a fixed CRC); both walks read the same."""
    buf = bytearray(record_batch(recs, codec=codec))
    pos = KAFKA_BATCH_HEADER_SIZE - 4 + pos % (len(buf) - KAFKA_BATCH_HEADER_SIZE + 4)
    buf[pos] ^= mask
    data = _recrc(buf)
    try:
        full = decode_kafka_records(data)
    except FormatError:
        full = None
    try:
        fields = kafka_fields(data)
    except FormatError:
        assert full is None
        return
    if full is not None:
        assert fields.keys == [r.key for r in full]
        assert [v or b"" for v in fields.values] == [r.value for r in full]
        assert _python_fields(data) == fields   # the Python walk (a broker without numba) reads the same
    if mask == 0:
        assert fields.keys == [r.key for r in recs] and fields.values == [r.value for r in recs]


def _python_fields(data: bytes) -> object:
    from memq.format.kafka_records import _fields, decompress_records
    h = verify_kafka_batch(data)
    return _fields(bytes(decompress_records(h.codec, memoryview(data)[KAFKA_BATCH_HEADER_SIZE:])), h.count)
