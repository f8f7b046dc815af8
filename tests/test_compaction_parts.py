"""The compacted part format and the manifest (pure): offsets, tombstones, index, checks."""

from __future__ import annotations

import asyncio
import struct

import pytest

from memq.compaction.manifest import Manifest, ManifestPointer
from memq.compaction.parts import (Survivor, decode_index, decode_part, encode_part, kafka_batch, message_survivors,
                                   part_survivors, plain_survivors)
from memq.compaction.read import PartReader
from memq.errors import CorruptDataError, CoordinationError, InvalidInputError
from memq.format import LogMessage
from memq.format.batch import decode_batch, decode_batch_header, encode_batch
from memq.format.kafka_records import KafkaCodec, decode_kafka_entries, encode_kafka_batch, peek_kafka_batch
from memq.format.message import encode_kafka_message, encode_message, verify_message
from memq.kafka_api.offsets import kafka_offset
from memq.storage.base import ObjectLocation


def survivors(n: int = 300) -> list[Survivor]:
    return [Survivor(kafka_offset(i // 3, i % 3 * 5), 1_000 + i, b"key-%d" % i,
                     None if i % 10 == 0 else b"value-%d" % i, (("h", b"%d" % i),)) for i in range(n)]


def obj(sv: list[Survivor], **kw: int) -> tuple[bytes, object]:
    e = encode_part(sv, broker_id="test", created_ms=1, **kw)
    return b"".join(bytes(c) for c in e.chunks), e


def test_round_trip_keeps_offsets_timestamps_headers_and_tombstones() -> None:
    sv = survivors()
    data, e = obj(sv, records_per_batch=50)
    assert part_survivors(data) == sv
    assert part_survivors(data, sv[120].offset) == sv[120:]
    assert (e.records, e.tombstones, e.first_offset, e.last_offset) == (300, 30, sv[0].offset, sv[-1].offset)
    header, msgs = decode_batch(data[:e.size])        # memq's own decoder reads a part as any object
    assert sum(len(r) for _, r in msgs) == 300 and header.message_count >= 6


def test_one_decoder_gives_each_messages_header_and_its_survivors_from_an_offset() -> None:
    """The decoder memq's Consumer and Spark share: a Message whose survivors all lie before the
    start keeps its place with none."""
    sv = survivors(120)
    data, e = obj(sv, records_per_batch=50)
    header, messages = decode_part(data)
    assert header.message_count == len(messages) == 3
    assert [len(s) for _, s in messages] == [50, 50, 20] and [x for _, s in messages for x in s] == sv
    assert all(h.producer_id == 0 for h, _ in messages)                  # the compactor's Messages
    _, later = decode_part(data, sv[60].offset)
    assert [len(s) for _, s in later] == [0, 40, 20] and later[1][1][0] == sv[60]


def test_each_message_is_one_kafka_batch_with_original_offsets() -> None:
    sv = survivors()
    data, e = obj(sv, records_per_batch=50)
    header = decode_batch_header(data)
    lo, hi = header.message_ranges[1]
    batch = kafka_batch(data[lo:hi])
    first = message_survivors(data[lo:hi])[0]
    kb = peek_kafka_batch(batch)
    assert kb.base_offset == first.offset
    assert kb.base_offset + kb.last_offset_delta == message_survivors(data[lo:hi])[-1].offset
    assert [en.value for en in decode_kafka_entries(batch)][:1] == [first.value]


def test_a_new_batch_starts_where_an_offset_delta_would_overflow_int32() -> None:
    sv = [Survivor(kafka_offset(n, 0), 1, b"k%d" % n, b"v") for n in (0, 1, 127, 128, 500)]
    data, e = obj(sv)
    assert decode_batch_header(data).message_count == 3              # 2**31 / 2**24 = 128 notifications a batch
    assert part_survivors(data) == sv


def test_deterministic_bytes_for_the_same_survivors() -> None:
    assert obj(survivors())[0] == obj(survivors())[0]


def test_index_finds_the_message_of_an_offset_and_of_a_key() -> None:
    sv = survivors()
    data, e = obj(sv, records_per_batch=50)
    index = decode_index(data[e.size:])
    header = decode_batch_header(data)
    for s in (sv[0], sv[77], sv[299]):
        n = index.message_for(s.offset)
        lo, hi = header.message_ranges[n]
        assert s in message_survivors(data[lo:hi])
        assert index.messages_for_key(s.key) == [n]
    assert index.messages_for_key(b"absent") == []
    assert index.message_for(0) == 0 and len(index) == 300


def test_reader_by_ranged_gets() -> None:
    sv = survivors()
    data, e = obj(sv, records_per_batch=50)

    class Store:
        async def get_range(self, loc: ObjectLocation, start: int, length: int) -> bytes:
            return data[start:start + length]

    ref = e.ref(ObjectLocation("b", "k"))
    reader = PartReader(Store())

    async def go() -> None:
        assert await reader.lookup(ref, b"key-150") == sv[150]
        assert await reader.lookup(ref, b"key-150x") is None
        got = [s async for chunk in reader.survivors_from(ref, sv[260].offset) for s in chunk]
        assert got == sv[260:]
        m = Manifest("t", 0, 200, 1, 1, (ref,))
        assert (await reader.get(m, b"key-10")).value is None       # a tombstone reads as deleted
    asyncio.run(go())


def test_bad_input_and_corruption_are_typed_errors() -> None:
    with pytest.raises(InvalidInputError):
        encode_part([], broker_id="b")
    with pytest.raises(InvalidInputError):
        encode_part([Survivor(5, 1, b"a", b"v"), Survivor(5, 1, b"b", b"v")], broker_id="b")
    data, e = obj(survivors())
    trailer = bytearray(data[e.size:])
    trailer[20] ^= 1
    with pytest.raises(CorruptDataError):
        decode_index(bytes(trailer))
    with pytest.raises(CorruptDataError):
        decode_index(data[e.size:-1])


def test_manifest_round_trip_and_parts_from() -> None:
    data, e = obj(survivors(30))
    a = e.ref(ObjectLocation("b", "a"))
    later = [Survivor(kafka_offset(100 + i, 0), 1, b"z%d" % i, b"v") for i in range(5)]
    b = encode_part(later, broker_id="t", created_ms=1).ref(ObjectLocation("b", "b"))
    m = Manifest("t", 1, 200, 3, 5, (a, b), previous="old", floor_ms=4, stats={"survivors": 35})
    assert Manifest.from_json(m.to_json(), "x") == m
    assert m.parts_from(0) == (a, b) and m.parts_from(a.last_offset + 1) == (b,) and m.parts_from(m.tail_offset) == ()
    assert m.tail_offset == kafka_offset(200, 0)
    bad = Manifest("t", 1, 50, 3, 5, (a, b))                          # a part past the tail
    with pytest.raises(CorruptDataError):
        Manifest.from_json(bad.to_json(), "x")
    with pytest.raises(CorruptDataError):
        Manifest.from_json(b"{}", "x")
    p = ManifestPointer("b", "k", 7, 2)
    assert ManifestPointer.from_json(p.to_json(), "z") == p
    with pytest.raises(CoordinationError):
        ManifestPointer.from_json(b'{"bucket": "b"}', "z")


def test_survivors_keep_every_header_and_null_and_a_bad_record_framing_is_corrupt() -> None:
    from crc32c import crc32c

    from memq.format.kafka_records import KAFKA_BATCH_HEADER_SIZE, KafkaCodec, encode_kafka_batch, verify_kafka_batch
    from memq.format.message import encode_kafka_message

    sv = [Survivor(7, 5, b"", b"", (("a", b"1"), ("b", b""), ("\u00e9", b"x"))), Survivor(9, 6, b"k", None),
          Survivor(12, 7, b"k2", b"v", (("c", b"2"),))]
    batch = bytearray(encode_kafka_batch(sv, KafkaCodec.NONE, base_offset=7,   # type: ignore[arg-type]
                                         deltas=[s.offset - 7 for s in sv]))
    assert message_survivors(encode_kafka_message(bytes(batch), verify_kafka_batch(bytes(batch)), producer_id=0,
                                                  epoch=0, sequence=0)[0]) == sv
    batch[KAFKA_BATCH_HEADER_SIZE] += 2          # the first record's length claims a byte more; CRCs still valid
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    bad = encode_kafka_message(bytes(batch), verify_kafka_batch(bytes(batch)), producer_id=0, epoch=0, sequence=0)[0]
    with pytest.raises(CorruptDataError):
        message_survivors(bad)


def test_survivors_keep_the_codec_they_arrived_in() -> None:
    """A Kafka producer's records keep their batch's codec through compaction, memq's own take the
    topic's framing codec, and a RecordBatch of a part never mixes two: a reader is never handed
    a codec it did not ask for (an aiokafka reader without zstd crashed on rewritten zstd parts)."""
    kafka_records = [LogMessage(b"kv%d" % i * 20, b"kk%d" % i, (), 1_000 + i) for i in range(40)]
    gz = encode_kafka_batch(kafka_records, KafkaCodec.GZIP)
    kafka_msg, kafka_header = encode_kafka_message(gz, peek_kafka_batch(gz), producer_id=1, epoch=0, sequence=0)
    own = [LogMessage(b"mv%d" % i * 20, None if i == 3 else b"mk%d" % i, (), 2_000 + i) for i in range(10)]
    own_msg = encode_message(own, producer_id=2, epoch=0, sequence=0)
    plain = b"".join(bytes(c) for c in encode_batch([kafka_msg, own_msg],
                                                     [kafka_header, verify_message(own_msg)], broker_id="b"))
    got = plain_survivors(kafka_offset(7, 0), plain, own_codec=KafkaCodec.LZ4)
    assert [s.codec for s in got] == [KafkaCodec.GZIP] * 40 + [KafkaCodec.LZ4] * 9      # the keyless one skipped
    assert got[40].offset == kafka_offset(7, 40) and got[-1].offset == kafka_offset(7, 49)
    data, _ = obj(got, records_per_batch=1_000)
    header = decode_batch_header(data)
    codecs = [peek_kafka_batch(kafka_batch(data[lo:hi])).codec for lo, hi in header.message_ranges]
    assert codecs == [KafkaCodec.GZIP, KafkaCodec.LZ4]                   # one RecordBatch per codec
    assert [s.codec for s in part_survivors(data)] == [s.codec for s in got]   # and read back as stored
    assert [(s.key, s.value) for s in part_survivors(data)] == [(s.key, s.value) for s in got]
