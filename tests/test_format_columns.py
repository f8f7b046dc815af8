"""memq.format.columns: every codec decodes to Arrow columns holding exactly the LogMessages
the LogMessage path decodes (values, keys, headers, timestamps), and bad bodies fail the same."""

from __future__ import annotations

import re
import struct

import msgpack
import pyarrow as pa
import pytest
import zstandard
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memq.errors import CorruptDataError, FormatError
from memq.format import Codec, Compressors, LogMessage, decode_batch, decode_message, encode_batch, encode_message
from memq.format.arrow_body import COLUMNS, body_schema, to_log_messages
from memq.format.columns import Columns, MsgpackColumns, concat_column, decode_batch_columns, decode_message_columns
from memq.format.codec import MAX_BODY_BYTES
from memq.format.kafka_columns import decode_kafka_columns, locate_kafka_columns, split_kafka_records
from memq.format.kafka_records import KafkaCodec, decode_kafka_records, decompress_records, verify_kafka_batch
from memq.format.message import _message, decode_message_header, encode_kafka_message
from tests.support.kafka_frames import CODECS, record_batch

records = st.lists(st.builds(
    LogMessage,
    value=st.binary(max_size=300),          # past 63 bytes: 1- and 2-byte length varints
    key=st.none() | st.binary(max_size=16),
    headers=st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=3).map(tuple),
    timestamp_ms=st.integers(0, 2**41), message_id=st.none()), max_size=30)


def rows(columns: Columns) -> list[LogMessage]:
    """The columns back as LogMessages, through the one schema every codec's columns have."""
    return to_log_messages(pa.RecordBatch.from_arrays([columns.column(c) for c in COLUMNS], schema=body_schema()))


def kafka_message(recs: list[LogMessage], codec: str = "zstd") -> bytearray:
    kb = record_batch(recs, codec=codec, producer_id=7, epoch=0, base_sequence=0)
    return encode_kafka_message(kb, verify_kafka_batch(kb), producer_id=7, epoch=0, sequence=0)[0]


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(recs=records, codec=st.sampled_from([Codec.NONE, Codec.ZSTD, Codec.GZIP, Codec.ARROW]))
def test_memq_bodies_decode_to_the_rows_the_log_message_path_gives(recs: list[LogMessage], codec: Codec) -> None:
    ids = [r._replace(message_id=b"id%d" % i if i % 2 else None) for i, r in enumerate(recs)]
    msg = encode_message(ids, producer_id=1, epoch=2, sequence=3, codec=codec)
    header, columns = decode_message_columns(msg, Compressors())
    assert header == decode_message(msg)[0]
    assert rows(columns) == ids == list(decode_message(msg)[1])


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(recs=records.filter(bool), codec=st.sampled_from(sorted(CODECS)))
def test_kafka_batches_decode_to_the_rows_the_record_decoder_gives(recs: list[LogMessage], codec: str) -> None:
    msg = kafka_message(recs, codec)
    assert rows(decode_message_columns(msg, Compressors())[1]) == list(decode_message(msg)[1]) == recs


def test_kafka_records_with_more_headers_than_records_are_walked_again_with_room_for_all() -> None:
    """The compiled walk first has room for one header a record; more are located in a second walk."""
    recs = [LogMessage(b"v%d" % i, b"k", tuple((f"h{j}", b"x" * j) for j in range(i % 5)), i) for i in range(40)]
    assert rows(decode_kafka_columns(record_batch(recs))) == decode_kafka_records(record_batch(recs)) == recs


def test_a_kafka_record_the_walk_refuses_gets_the_record_decoders_error() -> None:
    kb = bytearray(record_batch([LogMessage(b"abc", None, (), 1)] * 3))
    kb[-6] = 0x7F                                   # the last record's value length: past its end
    struct.pack_into(">I", kb, 17, crc32c(bytes(kb[21:])))
    with pytest.raises(CorruptDataError) as refused:
        decode_kafka_records(bytes(kb))
    with pytest.raises(CorruptDataError, match=re.escape(str(refused.value))):
        decode_kafka_columns(bytes(kb))


def test_kafka_nulls_and_log_append_time_read_as_the_record_decoder_reads_them() -> None:
    recs = [LogMessage(b"", None, (("h", b""),), 5), LogMessage(b"v" * 9000, b"k", (), 9)]   # 3-byte varints
    kb = bytearray(record_batch(recs))
    assert rows(decode_kafka_columns(bytes(kb))) == decode_kafka_records(bytes(kb)) == recs
    struct.pack_into(">h", kb, 21, 0x08)                     # attributes: LogAppendTime
    struct.pack_into(">I", kb, 17, crc32c(bytes(kb[21:])))
    assert [r.timestamp_ms for r in rows(decode_kafka_columns(bytes(kb)))] == [9, 9]


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(recs=records.filter(bool), at=st.integers(0, 10_000), byte=st.integers(0, 255))
def test_a_damaged_kafka_record_fails_exactly_when_the_record_decoder_fails(recs: list[LogMessage], at: int,
                                                                             byte: int) -> None:
    """Any byte of the (uncompressed) records replaced, CRC made valid again: the columns are
    the record decoder's rows, or both raise a FormatError."""
    kb = bytearray(record_batch(recs))
    kb[61 + at % (len(kb) - 61)] = byte
    struct.pack_into(">I", kb, 17, crc32c(bytes(kb[21:])))
    try:
        want = decode_kafka_records(bytes(kb))
    except FormatError:
        with pytest.raises(FormatError):
            rows(decode_kafka_columns(bytes(kb)))
        return
    assert rows(decode_kafka_columns(bytes(kb))) == want


def test_a_batch_decoded_for_some_fields_gives_those_columns_and_checks_them_at_once() -> None:
    recs = [LogMessage(b"v%d" % i, b"k" if i % 2 else None, (("a", b"b"),), 100 + i) for i in range(6)]
    msgs = [encode_message(recs, producer_id=1, epoch=0, sequence=s, codec=c)
            for s, c in enumerate((Codec.ZSTD, Codec.NONE, Codec.ARROW))] + [kafka_message(recs), fallback_message(recs)]
    obj = b"".join(encode_batch(msgs, [decode_message_header(m) for m in msgs], broker_id="b"))
    whole = decode_batch_columns(obj)[1]
    some = decode_batch_columns(obj, fields={"value", "timestamp_ms"})[1]
    for (_, a), (_, b) in zip(whole, some):
        assert a.column("value").equals(b.column("value")) and a.column("timestamp_ms").equals(b.column("timestamp_ms"))
    assert isinstance(some[-1][1], MsgpackColumns)
    with pytest.raises(KeyError):
        some[-1][1].column("key")                    # a body msgpack unpacked keeps only what was asked for
    assert some[0][1].column("key").equals(whole[0][1].column("key"))   # located spans: any field, when asked
    bad = raw_message([[5, None, [], 1, None]], 1)   # a value that is no bytes: found while decoding
    bad_obj = b"".join(encode_batch([bad], [decode_message_header(bad)], broker_id="b"))
    decode_batch_columns(bad_obj, fields={"timestamp_ms"})
    with pytest.raises(CorruptDataError, match="field value"):
        decode_batch_columns(bad_obj, fields={"value"})


def test_kafka_zstd_frames_with_or_without_their_size_decode_with_the_readers_one_context() -> None:
    """A frame that declares its size decodes in one call, one that does not chunk by chunk
    (here over 1 MiB, more than one chunk); both with the context a reader reuses."""
    recs = [LogMessage(b"%06d" % i * 50, b"k%d" % i, (("h", b"v"),), 1_000 + i) for i in range(4_000)]
    zstd = Compressors().zstd_decompressor()
    for sized in (True, False):
        kb = record_batch(recs, codec="zstd", zstd_size=sized)
        assert zstandard.get_frame_parameters(kb[61:]).content_size == (
            len(decompress_records(KafkaCodec.NONE, memoryview(record_batch(recs))[61:])) if sized
            else zstandard.CONTENTSIZE_UNKNOWN)
        assert rows(locate_kafka_columns([split_kafka_records(kb, zstd)])[0]) == recs
        assert rows(locate_kafka_columns([split_kafka_records(kb, zstd)])[0]) == recs   # context reused


def test_a_kafka_zstd_frame_declaring_more_than_a_body_may_hold_is_refused_before_decompressing() -> None:
    frame = b"\x28\xb5\x2f\xfd\xe0" + struct.pack("<Q", MAX_BODY_BYTES + 1) + b"\x00" * 8
    with pytest.raises(CorruptDataError, match="declare"):
        decompress_records(KafkaCodec.ZSTD, memoryview(frame), Compressors().zstd_decompressor())


def fallback_message(recs: list[LogMessage]) -> bytearray:
    """`recs` with each value stored as a msgpack str of its hex: a body the walk hands to
    msgpack (values read back as the hex's bytes)."""
    body = [[r.value.hex(), r.key, [list(h) for h in r.headers], r.timestamp_ms, r.message_id] for r in recs]
    return raw_message(body, len(recs))


KINDS = ("zstd", "none", "arrow", "kafka", "fallback")


def object_of(kinds: list[str], recs: list[LogMessage]) -> tuple[bytes, list[LogMessage]]:
    """A batch object of one Message of `recs` per kind, and the rows a reader must get from it:
    memq bodies keep message ids; a Kafka batch has none and reads a null value as b""."""
    msgs, want = [], []
    ids = [r._replace(message_id=b"id%d" % i if i % 2 else None) for i, r in enumerate(recs)]
    for seq, kind in enumerate(kinds):
        if kind == "kafka":
            msgs.append(kafka_message([r._replace(value=None) if i % 3 == 0 else r for i, r in enumerate(recs)]))
            want += [r._replace(value=b"") if i % 3 == 0 else r for i, r in enumerate(recs)]
        elif kind == "fallback":
            msgs.append(fallback_message(ids))
            want += [r._replace(value=r.value.hex().encode()) for r in ids]
        else:
            codec = {"zstd": Codec.ZSTD, "none": Codec.NONE, "arrow": Codec.ARROW}[kind]
            msgs.append(encode_message(ids, producer_id=1, epoch=0, sequence=seq, codec=codec))
            want += ids
    return b"".join(encode_batch(msgs, [decode_message_header(m) for m in msgs], broker_id="b")), want


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(recs=records.filter(bool), kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=6),
       fields=st.none() | st.sets(st.sampled_from(COLUMNS), min_size=1))
def test_an_objects_columns_hold_every_messages_rows_whatever_the_mix_of_codecs(
        recs: list[LogMessage], kinds: list[str], fields: set[str] | None) -> None:
    """Gathered straight from every Message's spans, or concatenated when a Message is not
    spans (Arrow, unpacked by msgpack): the rows of the LogMessage path, nulls and empties included."""
    obj, want = object_of(kinds, recs)
    parts = [c for _, c in decode_batch_columns(obj, fields=fields)[1]]
    arrays = {}
    for name in COLUMNS if fields is None else fields:
        arrays[name] = concat_column(parts, name)
        arrays[name].validate(full=True)
        assert arrays[name].equals(pa.concat_arrays([p.column(name) for p in parts]))   # the Message-by-Message path
    for name, array in arrays.items():
        assert array.to_pylist() == [getattr(r, name) if name != "headers" else [{"key": k, "value": v} for k, v in
                                     r.headers] for r in want], name


def test_an_object_of_only_located_messages_is_gathered_without_concatenating(
        monkeypatch: pytest.MonkeyPatch) -> None:
    recs = [LogMessage(b"" if i % 2 else b"v%d" % i, None if i % 3 else b"k", (("h", b"x"),) * (i % 2), i)
            for i in range(7)]
    obj, want = object_of(["zstd", "kafka", "none"], recs)
    parts = [c for _, c in decode_batch_columns(obj)[1]]
    monkeypatch.setattr(pa, "concat_arrays", None)      # any concatenation fails
    assert to_log_messages(pa.RecordBatch.from_arrays([concat_column(parts, c) for c in COLUMNS],
                                                      schema=body_schema())) == want
    assert concat_column(parts, "key").null_count == sum(r.key is None for r in want) > 0
    assert concat_column([], "value").to_pylist() == []


def raw_message(body: object, count: int) -> bytearray:
    """A valid Message (CRCs right) around any msgpack body, stored uncompressed."""
    raw = msgpack.packb(body)
    return _message(0, Codec.NONE, 1, 0, 0, count, 1, 1, None, raw, len(raw))


def test_a_msgpack_body_of_the_wrong_shape_is_corrupt_data() -> None:
    for body, count, why in (([[b"v", None, [], 1, None]] * 2, 3, "holds 2 records"),
                             ([[b"v", None, [], 1]], 1, "5-field"),
                             ([7], 1, "not arrays")):
        with pytest.raises(CorruptDataError, match=why):
            decode_message_columns(raw_message(body, count), Compressors())
    _, bad_value = decode_message_columns(raw_message([[5, None, [], 1, None]], 1), Compressors())
    with pytest.raises(CorruptDataError, match="field value"):
        bad_value.column("value")
    assert bad_value.column("timestamp_ms").to_pylist() == [1]   # only the field asked for converts


def test_a_batch_decodes_to_columns_message_by_message_with_the_batch_checks() -> None:
    recs = [LogMessage(b"v%d" % i, b"k", (("a", b"b"),), 100 + i) for i in range(5)]
    msgs = [encode_message(recs, producer_id=1, epoch=0, sequence=0, codec=Codec.ZSTD), kafka_message(recs),
            encode_message(recs, producer_id=1, epoch=0, sequence=1, codec=Codec.ARROW)]
    obj = b"".join(encode_batch(msgs, [decode_message_header(m) for m in msgs], broker_id="b"))
    header, decoded = decode_batch_columns(obj)
    assert header == decode_batch(obj)[0]
    assert [rows(c) for _, c in decoded] == [recs] * 3
    flipped = bytearray(obj)
    flipped[-1] ^= 1
    with pytest.raises(CorruptDataError, match="CRC32C"):
        decode_batch_columns(bytes(flipped))
