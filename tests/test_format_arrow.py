"""Codec.ARROW Message bodies: round trips, the columns as stored, and corrupt bodies behind a
valid CRC (what a buggy producer could store) rejected as FormatError, never another error."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memq.errors import CorruptDataError, FormatError, InvalidInputError, UnsupportedCodecError
from memq.format import Codec, LogMessage, decode_batch, decode_message, encode_batch, encode_message, verify_message
from memq.format.arrow_body import ArrowRecords, body_schema, encode_arrow_body
from tests.support.format import log_messages, rebody, records, reheader


def message(recs: list[LogMessage]) -> bytes:
    return bytes(encode_message(recs, producer_id=1, epoch=2, sequence=3, codec=Codec.ARROW))


def ipc(batches: list[pa.RecordBatch], schema: pa.Schema) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as w:
        for b in batches:
            w.write_batch(b)
    return sink.getvalue().to_pybytes()


def test_rows_stay_columns_until_read_as_log_messages() -> None:
    recs = records(6)
    header, out = decode_message(message(recs))
    assert header.codec is Codec.ARROW and header.raw_length == header.body_length
    assert isinstance(out, ArrowRecords) and len(out) == 6
    assert out.batch.column("value").to_pylist() == [r.value for r in recs]   # stored columns, as written
    assert out.batch.column("timestamp_ms").to_pylist() == [r.timestamp_ms for r in recs]
    assert out[1] == recs[1] and list(out) == recs and out == recs and out[2:4] == recs[2:4]
    assert all(type(r) is LogMessage for r in out)


def test_a_batch_may_mix_arrow_and_msgpack_messages() -> None:
    groups = [(records(3), Codec.ARROW), (records(2, base=50), Codec.ZSTD), ([], Codec.ARROW)]
    msgs = [encode_message(r, producer_id=1, epoch=0, sequence=i, codec=c) for i, (r, c) in enumerate(groups)]
    obj = b"".join(encode_batch(msgs, [verify_message(m) for m in msgs], broker_id="b"))
    _, decoded = decode_batch(obj)
    assert [list(out) for _, out in decoded] == [r for r, _ in groups]
    assert [h.codec for h, _ in decoded] == [c for _, c in groups]


def test_compressible_values_shrink() -> None:
    recs = [LogMessage(b"x" * 1000, b"k", (), i) for i in range(1000)]
    assert len(message(recs)) < 100_000


@pytest.mark.parametrize("bad, field", [
    ([LogMessage(None)], "value"),                                  # type: ignore[arg-type]
    ([LogMessage(b"v", headers=((1, b"x"),))], "headers"),
    ([LogMessage(b"v", timestamp_ms=2**64)], "timestamp_ms"),
    ([LogMessage(b"v", key=1.5)], "key"),                           # type: ignore[arg-type]
])
def test_encode_names_the_field_arrow_cannot_take(bad: list[LogMessage], field: str) -> None:
    with pytest.raises(InvalidInputError, match=f"field {field}"):
        encode_message(bad, producer_id=1, epoch=1, sequence=1, codec=Codec.ARROW)


def test_corrupt_bodies_behind_a_valid_crc_are_rejected() -> None:
    good = message(records(4))
    schema = body_schema()
    one = pa.ipc.open_stream(encode_arrow_body(records(4))).read_next_batch()
    other = pa.record_batch([pa.array([b"v"] * 4)], names=["value"])
    nulls = pa.RecordBatch.from_arrays([pa.array([None, b"v", b"v", b"v"], pa.binary()), *one.columns[1:]],
                                       schema=schema)
    for body, match in ((ipc([one, one], schema), "2 record batches"),
                        (ipc([other], other.schema), "schema"),
                        (ipc([one.slice(0, 3)], schema), "3 records, header says 4"),
                        (ipc([nulls], schema), "nulls"),
                        (b"", "not a valid Arrow")):
        with pytest.raises(CorruptDataError, match=match):
            decode_message(rebody(good, body, raw_length=len(body)))
    with pytest.raises(CorruptDataError, match="raw length"):
        decode_message(reheader(good, raw_length=5))


@settings(max_examples=300, deadline=None)
@given(recs=st.lists(log_messages, min_size=1, max_size=8), data=st.data())
def test_truncated_or_flipped_bodies_never_escape_as_other_errors(recs: list[LogMessage], data: st.DataObject) -> None:
    body = bytearray(encode_arrow_body(recs).to_pybytes())
    cut = data.draw(st.integers(0, len(body)))
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(body) - 1), st.integers(1, 255)), max_size=3))
    for pos, mask in flips:
        body[pos] ^= mask
    bad = bytes(body[:cut] if cut < len(body) else body)
    try:
        _, out = decode_message(rebody(message(recs), bad, raw_length=len(bad)))
        list(out)
    except FormatError:
        return


def test_without_pyarrow_arrow_bodies_fail_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import memq.format.arrow_body as arrow_body

    def missing(name: str) -> None:
        raise ImportError(name)

    good = message(records(2))
    monkeypatch.setattr(arrow_body.importlib, "import_module", missing)
    for call in (lambda: message(records(2)), lambda: decode_message(good)):
        with pytest.raises(UnsupportedCodecError, match=r"memq\[arrow\]"):
            call()
