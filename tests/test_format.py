"""memq.format: round trips for every codec, and totality of every decoder on bad bytes."""

from __future__ import annotations

import gc
import random
import struct
import zlib

import msgpack
import pytest
import zstandard
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memq.errors import (CorruptDataError, FormatError, InvalidInputError,
                         UnsupportedCodecError, UnsupportedVersionError)
from memq.format import (BATCH_PREFIX_SIZE, MAX_BODY_BYTES, MESSAGE_HEADER_SIZE, Codec,
                         Compressors, LogMessage, batch_header_size, decode_batch,
                         decode_batch_header, decode_message, decode_message_header,
                         encode_batch, encode_message, iter_batch_messages, object_crc32c,
                         split_parts, verify_message)
from memq.format import batch as format_batch
from memq.format import message as format_message
from memq.format.batch import _ENTRY, _FIXED, _PREFIX
from memq.format.message import _HEADER
from memq.format.records import gc_paused

from tests.support.format import I64, log_messages, rebody, records, reheader

record_lists = st.lists(log_messages, max_size=20)
# Codec.KAFKA tags a stored Kafka RecordBatch (tests/test_kafka_records.py), not a LogMessage body;
# Codec.ARROW bodies are Arrow columns (more cases in tests/test_format_arrow.py).
BODY_CODECS = [c for c in Codec if c is not Codec.KAFKA]
codecs = st.sampled_from(BODY_CODECS)
FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def message(recs: list[LogMessage] | None = None, codec: Codec = Codec.ZSTD,
            sequence: int = 7) -> bytes:
    return encode_message(records() if recs is None else recs, producer_id=2**64 - 1,
                          epoch=3, sequence=sequence, codec=codec, created_ms=123)


def batch(n_messages: int = 3, codec: Codec = Codec.ZSTD) -> tuple[bytes, list[bytes]]:
    msgs = [message(records(4, base=100 * i), codec, sequence=i) for i in range(n_messages)]
    chunks = encode_batch(msgs, [verify_message(m) for m in msgs], broker_id="broker-ü",
                          created_ms=456)
    return b"".join(chunks), msgs


def reseal_batch(head: bytes) -> bytes:
    """Recompute the batch header CRC over a modified header (without its CRC)."""
    return head + struct.pack("<I", crc32c(head))


# --- round trips ---------------------------------------------------------------------------


@FAST
@given(recs=record_lists, codec=codecs, producer_id=st.integers(0, 2**64 - 1),
       epoch=st.integers(0, 2**32 - 1), sequence=st.integers(0, 2**64 - 1), created=I64)
def test_message_round_trip(recs, codec, producer_id, epoch, sequence, created):
    buf = encode_message(recs, producer_id=producer_id, epoch=epoch, sequence=sequence,
                         codec=codec, created_ms=created)
    header, out = decode_message(buf)
    assert out == recs
    assert all(type(r) is LogMessage for r in out)
    assert (header.codec, header.producer_id, header.epoch, header.sequence, header.count,
            header.created_ms) == (codec, producer_id, epoch, sequence, len(recs), created)
    stamps = [r.timestamp_ms for r in recs] or [0]
    assert (header.min_timestamp_ms, header.max_timestamp_ms) == (min(stamps), max(stamps))
    assert verify_message(buf) == header == decode_message_header(buf[:MESSAGE_HEADER_SIZE])
    assert header.total_size == len(buf)


@FAST
@given(groups=st.lists(st.tuples(record_lists, codecs), max_size=6),
       broker_id=st.text(max_size=20), created=I64)
def test_batch_round_trip_and_ranged_reads(groups, broker_id, created):
    msgs = [encode_message(recs, producer_id=1, epoch=0, sequence=i, codec=codec)
            for i, (recs, codec) in enumerate(groups)]
    chunks = encode_batch([memoryview(m) for m in msgs], [verify_message(m) for m in msgs],
                          broker_id=broker_id, created_ms=created)
    assert all(c is m or c.obj is m for c, m in zip(chunks[1:], msgs))  # bodies not copied
    obj = b"".join(chunks)
    size = batch_header_size(obj[:BATCH_PREFIX_SIZE])
    header = decode_batch_header(obj[:size])
    assert header.header_size == size and header.object_size == len(obj)
    assert (header.message_count, header.broker_id, header.created_ms) == (
        len(msgs), broker_id, created)
    assert header.logmessage_count == sum(len(r) for r, _ in groups)
    stamps = [r.timestamp_ms for recs, _ in groups for r in recs] or [0]
    assert (header.min_timestamp_ms, header.max_timestamp_ms) == (min(stamps), max(stamps))
    for (start, end), (recs, _) in zip(header.message_ranges, groups):
        assert decode_message(obj[start:end])[1] == recs
    assert [bytes(v) for v in iter_batch_messages(obj)] == msgs
    same_header, decoded = decode_batch(obj)
    assert same_header == header
    assert [out for _, out in decoded] == [recs for recs, _ in groups]
    assert object_crc32c(chunks) == crc32c(obj)


def test_compressors_are_reusable_across_codecs():
    comp = Compressors()
    for i in range(20):
        codec = list(Codec)[i % 3]
        recs = records(i)
        buf = encode_message(recs, producer_id=1, epoch=1, sequence=i, codec=codec,
                             compressors=comp)
        assert decode_message(buf, compressors=comp)[1] == recs


def test_large_message_compresses_and_round_trips():
    recs = [LogMessage(b"x" * 1000, b"key", (), i) for i in range(2000)]
    plain, packed = message(recs, Codec.NONE), message(recs, Codec.ZSTD)
    assert len(packed) < len(plain) / 10
    assert decode_message(packed)[1] == recs == decode_message(message(recs, Codec.GZIP))[1]


@pytest.mark.parametrize("codec", [Codec.ZSTD, Codec.GZIP])
@pytest.mark.parametrize("n_values", [1, 16])   # one small body (judged whole), one sampled
def test_adaptive_encode_skips_compression_only_when_it_does_not_pay(codec, n_values):
    rng = random.Random(n_values)
    noise = [LogMessage(rng.randbytes(4096), None, (), i) for i in range(n_values)]
    text = [LogMessage(rng.randbytes(2048).hex().encode(), b"k", (), i) for i in range(n_values)]
    for recs, want in ((noise, Codec.NONE), (text, codec)):
        buf = encode_message(recs, producer_id=1, epoch=1, sequence=1, codec=codec, adaptive=True)
        header, got = decode_message(buf)
        assert (header.codec, got) == (want, recs)
        if want is Codec.NONE:   # stored as is: body = the packed records, nothing added
            assert header.body_length == header.raw_length
        else:
            assert header.body_length < header.raw_length * 0.95
    # without adaptive the configured codec is always used
    assert decode_message_header(message(noise, codec)).codec is codec


# --- totality: truncation and bit flips ------------------------------------------------------


def assert_rejected_or_equal(decode, buf: bytes, expected) -> None:
    try:
        got = decode(buf)
    except FormatError:
        return
    assert got == expected


def test_split_parts_walks_batches_stored_back_to_back():
    """A shared object is batches back to back; each part decodes on its own."""
    (a, _), (b, _) = batch(2, Codec.NONE), batch(3, Codec.ZSTD)
    parts = split_parts(a + b)
    assert [bytes(p) for p in parts] == [a, b] and split_parts(a) == [memoryview(a)]
    assert decode_batch(parts[1])[0].message_count == decode_batch(b)[0].message_count
    with pytest.raises(CorruptDataError, match="part 1 at byte"):
        split_parts(a + b[:-1])


@pytest.mark.parametrize("codec", BODY_CODECS)
def test_every_truncation_of_a_batch_is_rejected(codec):
    obj, _ = batch(2, codec)
    for n in range(len(obj)):
        with pytest.raises(FormatError):
            decode_batch(obj[:n])
        with pytest.raises(FormatError):
            list(iter_batch_messages(obj[:n]))


@pytest.mark.parametrize("codec", BODY_CODECS)
def test_every_truncation_of_a_message_is_rejected(codec):
    buf = message(codec=codec)
    for n in range(len(buf)):
        with pytest.raises(FormatError):
            decode_message(buf[:n])


BATCHES = {codec: batch(2, codec)[0] for codec in BODY_CODECS}


@settings(max_examples=1000, deadline=None)
@given(codec=codecs, data=st.data())
def test_random_byte_flips_in_a_batch_are_rejected_or_harmless(codec, data):
    obj = BATCHES[codec]
    expected = decode_batch(obj)
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(obj) - 1), st.integers(1, 255)),
                               min_size=1, max_size=4))
    bad = bytearray(obj)
    for pos, mask in flips:
        bad[pos] ^= mask
    assert_rejected_or_equal(decode_batch, bytes(bad), expected)


@settings(max_examples=200, deadline=None)
@given(codec=codecs, pos=st.integers(0, 10_000), mask=st.integers(1, 255))
def test_single_byte_flip_in_a_message_is_rejected(codec, pos, mask):
    buf = bytearray(message(codec=codec))
    buf[pos % len(buf)] ^= mask
    with pytest.raises(FormatError):
        decode_message(bytes(buf))


@settings(max_examples=200, deadline=None)
@given(junk=st.binary(max_size=200))
def test_arbitrary_bytes_never_escape_as_other_errors(junk):
    for decode in (decode_message, decode_batch, decode_batch_header, batch_header_size):
        with pytest.raises(FormatError):
            decode(junk)
    with pytest.raises(FormatError):
        decode_message(b"MQMS\x01" + junk)
    with pytest.raises(FormatError):
        decode_batch(b"MQBT\x01" + junk)


# --- Message error cases ---------------------------------------------------------------------


def test_message_bad_magic():
    with pytest.raises(CorruptDataError, match="magic"):
        decode_message_header(b"XXXX" + message()[4:])


def test_message_newer_version():
    buf = bytearray(message())
    buf[4] = 2
    with pytest.raises(UnsupportedVersionError, match="version 2"):
        decode_message(bytes(buf))


def test_message_header_crc_mismatch():
    buf = bytearray(message())
    buf[20] ^= 1  # inside producer_id
    with pytest.raises(CorruptDataError, match="header CRC32C"):
        decode_message_header(bytes(buf))


def test_message_truncated_header_and_body():
    buf = message()
    with pytest.raises(CorruptDataError, match="truncated"):
        decode_message_header(buf[:MESSAGE_HEADER_SIZE - 1])
    with pytest.raises(CorruptDataError, match="truncated"):
        verify_message(buf[:-1])


def test_message_trailing_bytes():
    with pytest.raises(CorruptDataError, match="trailing"):
        verify_message(message() + b"\0")


def test_message_body_crc_mismatch():
    buf = bytearray(message())
    buf[-1] ^= 0x40
    with pytest.raises(CorruptDataError, match="body CRC32C"):
        verify_message(bytes(buf))


def test_message_unknown_codec():
    with pytest.raises(UnsupportedCodecError, match="codec id 9"):
        decode_message_header(reheader(message(), codec=9))


def test_message_wrong_header_size():
    with pytest.raises(CorruptDataError, match="header size"):
        decode_message_header(reheader(message(), header_size=80))


def test_message_oversized_lengths():
    with pytest.raises(CorruptDataError, match="exceeds"):
        decode_message_header(reheader(message(), body_length=MAX_BODY_BYTES + 1))
    with pytest.raises(CorruptDataError, match="exceeds"):
        decode_message_header(reheader(message(), raw_length=2**32 - 1))


def test_message_timestamps_out_of_order():
    with pytest.raises(CorruptDataError, match="after max"):
        decode_message_header(reheader(message(), lo=10, hi=5))


@pytest.mark.parametrize("codec", BODY_CODECS)
@pytest.mark.parametrize("delta", [-1, 1])
def test_declared_raw_length_must_match(codec, delta):
    buf = message(codec=codec)
    raw_length = _HEADER.unpack_from(buf)[12]
    with pytest.raises(CorruptDataError):
        decode_message(reheader(buf, raw_length=raw_length + delta))


def test_zstd_bomb_is_refused_before_allocation():
    bomb = zstandard.ZstdCompressor().compress(b"\0" * 50_000_000)
    with pytest.raises(CorruptDataError, match="declares 50000000"):
        decode_message(rebody(message(), bomb, raw_length=10))


def test_zstd_frame_without_content_size_is_refused():
    raw = _raw_body(records())
    cobj = zstandard.ZstdCompressor(write_content_size=False)
    body = cobj.compress(raw)
    with pytest.raises(CorruptDataError, match="zstd frame declares"):
        decode_message(rebody(message(), body, raw_length=len(raw)))


@pytest.mark.parametrize("tail", [b"", b"junk"])
def test_gzip_stream_must_end_exactly(tail):
    raw = _raw_body(records())
    body = zlib.compress(raw, wbits=31)
    buf = message(codec=Codec.GZIP)
    if tail:
        with pytest.raises(CorruptDataError, match="gzip"):
            decode_message(rebody(buf, body + tail))
    else:
        assert decode_message(rebody(buf, body))[1] == records()
        with pytest.raises(CorruptDataError, match="gzip"):
            decode_message(rebody(buf, body[:-3]))


def _raw_body(recs: list[LogMessage]) -> bytes:
    return msgpack.packb(recs)


@pytest.mark.parametrize("raw, match", [
    (b"\xc1", "not valid msgpack"),                     # reserved msgpack byte
    (b"\x91\x01\x02", "not valid msgpack"),              # extra data after the array
    (b"\x05", "records"),                                # an int, not an array
    (b"\x92\x93\x01\x02\x03\x93\x01\x02\x03", "5-field"),  # 3-field records
    (b"\x92\x01\x02", "not arrays"),                      # ints, not arrays
    (b"\x92\xa3abc\xa3abc", "5-field"),                  # 3-char strings, not arrays
])
def test_body_that_is_not_records_is_corrupt(raw, match):
    buf = rebody(message(codec=Codec.NONE), raw, raw_length=len(raw), count=2)
    with pytest.raises(CorruptDataError, match=match):
        decode_message(buf)
    with pytest.raises(CorruptDataError, match=match):
        decode_message(buf, rows=True)


def test_rows_are_the_records_as_plain_tuples():
    buf = message()
    header, logs = decode_message(buf)
    _, rows = decode_message(buf, rows=True)
    assert rows == tuple(tuple(m) for m in logs) and {type(r) for r in rows} == {tuple}
    assert header.count == len(rows)


def test_record_count_must_match_header():
    buf = message(codec=Codec.NONE)
    with pytest.raises(CorruptDataError, match="header says 4"):
        decode_message(reheader(buf, count=4))


def test_caller_known_timestamps_and_shape_skip_the_record_passes():
    rows = [(b"v%d" % i, None, (), 500 + i, None) for i in range(10)]
    buf = encode_message(rows, producer_id=1, epoch=1, sequence=1, timestamps=(500, 509), shaped=True)
    header, got = decode_message(buf)
    assert (header.min_timestamp_ms, header.max_timestamp_ms, header.count) == (500, 509, 10)
    assert got == rows and buf == encode_message(rows, producer_id=1, epoch=1, sequence=1,
                                                 created_ms=header.created_ms)


def test_encode_rejects_bad_input():
    for bad in ([(b"v", None)], [5], [b"abcde"], [dict.fromkeys("abcde")], [[b"v"] * 5]):
        with pytest.raises(InvalidInputError, match="LogMessages"):
            encode_message(bad, producer_id=1, epoch=1, sequence=1)
    plain = [tuple(r) for r in records()]
    assert decode_message(encode_message(plain, producer_id=1, epoch=1, sequence=1))[1] == plain
    with pytest.raises(InvalidInputError, match="cannot be encoded"):
        encode_message([LogMessage(object())], producer_id=1, epoch=1, sequence=1)
    with pytest.raises(InvalidInputError, match="cannot be encoded: record 2"):
        encode_message([LogMessage(b"a"), LogMessage(b"b"), LogMessage(b"c", key=1.5j)],
                       producer_id=1, epoch=1, sequence=1)
    with pytest.raises(InvalidInputError, match="out of range"):
        encode_message(records(), producer_id=-1, epoch=1, sequence=1)
    with pytest.raises(InvalidInputError, match="out of range"):
        encode_message(records(), producer_id=1, epoch=2**32, sequence=1)
    with pytest.raises(UnsupportedCodecError):
        encode_message(records(), producer_id=1, epoch=1, sequence=1, codec=7)
    # a failed encode leaves a shared Compressors usable
    comp = Compressors()
    with pytest.raises(InvalidInputError):
        encode_message([LogMessage(b"v", headers=((1, object()),))], producer_id=1, epoch=1,
                       sequence=1, compressors=comp)
    with pytest.raises(InvalidInputError, match="out of range"):  # fails after packing
        encode_message(records(), producer_id=-1, epoch=1, sequence=1, compressors=comp)
    for codec in BODY_CODECS:
        buf = encode_message(records(), producer_id=1, epoch=1, sequence=1, codec=codec,
                             compressors=comp)
        assert decode_message(buf)[1] == records()


# --- Batch error cases -----------------------------------------------------------------------


def test_batch_prefix_errors():
    obj, _ = batch()
    with pytest.raises(CorruptDataError, match="magic"):
        batch_header_size(b"MQMS" + obj[4:BATCH_PREFIX_SIZE])
    with pytest.raises(UnsupportedVersionError, match="batch version 9"):
        batch_header_size(obj[:4] + b"\x09" + obj[5:BATCH_PREFIX_SIZE])
    with pytest.raises(CorruptDataError, match="prefix truncated"):
        batch_header_size(obj[:BATCH_PREFIX_SIZE - 1])
    for size in (0, 10, 2**31):
        with pytest.raises(CorruptDataError, match="header size"):
            batch_header_size(_PREFIX.pack(b"MQBT", 1, size))


def test_batch_header_crc_and_truncation():
    obj, _ = batch()
    size = batch_header_size(obj)
    with pytest.raises(CorruptDataError, match="header truncated"):
        decode_batch_header(obj[:size - 1])
    bad = bytearray(obj)
    bad[BATCH_PREFIX_SIZE + 1] ^= 1  # message_count
    with pytest.raises(CorruptDataError, match="header CRC32C"):
        decode_batch_header(bytes(bad))


def _batch_parts(obj: bytes) -> tuple[list, str, list, bytes]:
    size = batch_header_size(obj)
    fixed = list(_FIXED.unpack_from(obj, _PREFIX.size))
    bid_at = _PREFIX.size + _FIXED.size
    bid = obj[bid_at:bid_at + fixed[-1]]
    entries = [list(e) for e in _ENTRY.iter_unpack(obj[bid_at + fixed[-1]:size - 4])]
    return fixed, bid, entries, obj[size:]


def _rebuild(fixed: list, bid: bytes, entries: list, rest: bytes, size: int | None = None
             ) -> bytes:
    body = _FIXED.pack(*fixed) + bid + b"".join(_ENTRY.pack(*e) for e in entries)
    size = size if size is not None else _PREFIX.size + len(body) + 4
    return reseal_batch(_PREFIX.pack(b"MQBT", 1, size) + body) + rest


def test_batch_rebuild_helper_is_faithful():
    obj, _ = batch()
    assert _rebuild(*_batch_parts(obj)) == obj


def test_batch_index_must_be_contiguous():
    obj, _ = batch()
    fixed, bid, entries, rest = _batch_parts(obj)
    entries[1][0] += 1
    with pytest.raises(CorruptDataError, match="Message 1 starts at"):
        decode_batch_header(_rebuild(fixed, bid, entries, rest))


def test_batch_counts_must_agree():
    obj, _ = batch()
    fixed, bid, entries, rest = _batch_parts(obj)
    fixed[1] += 1  # logmessage_count
    with pytest.raises(CorruptDataError, match="index sums"):
        decode_batch_header(_rebuild(fixed, bid, entries, rest))
    fixed[1] -= 1
    fixed[0] += 1  # message_count no longer fits the header size
    with pytest.raises(CorruptDataError, match="does not fit"):
        decode_batch_header(_rebuild(fixed, bid, entries, rest))
    fixed[0] -= 1
    entries[0][2] += 1
    fixed[1] += 1  # index and header agree, the Message itself disagrees
    with pytest.raises(CorruptDataError, match="Message 0 holds 4"):
        decode_batch(_rebuild(fixed, bid, entries, rest))


def test_batch_timestamps_must_cover_messages():
    obj, _ = batch()
    fixed, bid, entries, rest = _batch_parts(obj)
    fixed[3] = fixed[2]  # max = min
    with pytest.raises(CorruptDataError, match="outside the batch range"):
        decode_batch(_rebuild(fixed, bid, entries, rest))
    fixed[2] = fixed[3] + 1
    with pytest.raises(CorruptDataError, match="after max"):
        decode_batch_header(_rebuild(fixed, bid, entries, rest))


def test_batch_broker_id_must_be_utf8():
    obj, _ = batch()
    fixed, bid, entries, rest = _batch_parts(obj)
    with pytest.raises(CorruptDataError, match="UTF-8"):
        decode_batch_header(_rebuild(fixed, b"\xff" * len(bid), entries, rest))


def test_batch_object_size_must_match():
    obj, _ = batch()
    with pytest.raises(CorruptDataError, match="trailing"):
        list(iter_batch_messages(obj + b"\0"))
    with pytest.raises(CorruptDataError, match="truncated"):
        decode_batch(obj[:-1])


def test_encode_batch_rejects_bad_input():
    _, msgs = batch()
    headers = [verify_message(m) for m in msgs]
    with pytest.raises(InvalidInputError, match="headers"):
        encode_batch(msgs, headers[:-1], broker_id="b", created_ms=1)
    with pytest.raises(InvalidInputError, match="Message 1 has"):
        encode_batch([msgs[0], msgs[1][:-1]], headers[:2], broker_id="b", created_ms=1)
    with pytest.raises(InvalidInputError, match="broker_id"):
        encode_batch(msgs, headers, broker_id="x" * 70_000, created_ms=1)


def test_empty_batch_round_trips():
    obj = b"".join(encode_batch([], [], broker_id="b", created_ms=9))
    header, messages = decode_batch(obj)
    assert (header.message_count, header.logmessage_count, header.object_size, messages) == (
        0, 0, len(obj), [])


# --- GC pause around decoding --------------------------------------------------------------


@pytest.fixture
def gc_state():
    """Restores the interpreter's GC flag whatever a test leaves behind."""
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("enabled", [True, False])
def test_decoders_restore_gc_state_also_when_they_raise(gc_state, enabled):
    (gc.enable if enabled else gc.disable)()
    obj, msgs = batch()
    fixed, bid, entries, rest = _batch_parts(obj)
    entries[0][2] += 1
    fixed[1] += 1  # the Message disagrees with the index: raises inside the batch's pause
    bad_body = rebody(message(codec=Codec.NONE), b"\x92\x01\x02", raw_length=3, count=2)
    assert decode_message(msgs[0])[1] == records(4, base=0)
    assert gc.isenabled() is enabled
    assert len(decode_batch(obj)[1]) == 3
    assert gc.isenabled() is enabled
    with pytest.raises(CorruptDataError, match="not arrays"):
        decode_message(bad_body)
    assert gc.isenabled() is enabled
    with pytest.raises(CorruptDataError, match="Message 0 holds 4"):
        decode_batch(_rebuild(fixed, bid, entries, rest))
    assert gc.isenabled() is enabled


def test_records_are_unpacked_with_the_gc_paused_for_the_whole_batch(gc_state, monkeypatch):
    gc.enable()
    seen: list[tuple[str, bool]] = []

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            seen.append((name, gc.isenabled()))
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(format_message, "unpack_records",
                        spy("unpack", format_message.unpack_records))
    monkeypatch.setattr(format_batch, "decode_message", spy("message", decode_message))
    obj, msgs = batch(n_messages=2)
    decode_message(msgs[0])
    decode_batch(obj)
    # Between a batch's Messages too: collections there would rescan its decoded records.
    assert seen == [("unpack", False), ("message", False), ("unpack", False),
                    ("message", False), ("unpack", False)]
    assert gc.isenabled()


def test_gc_paused_nests_and_leaves_a_disabled_gc_alone(gc_state):
    gc.enable()
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block does not resume it early
    assert gc.isenabled()
    gc.disable()
    with pytest.raises(ValueError):
        with gc_paused():
            raise ValueError("boom")
    assert not gc.isenabled()
