"""memq.format.msgpack_columns and spans: the compiled walk gives a msgpack body exactly the
columns (types, values, nulls) and CorruptDataErrors that msgpack.unpackb + pa.array give,
and hands every body outside memq's layout to that path."""

from __future__ import annotations

import subprocess
import sys

import msgpack
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from memq.errors import CorruptDataError
from memq.format import Codec, Compressors, LogMessage, decode_message_header, encode_batch, encode_message
from memq.format.arrow_body import COLUMNS
from memq.format.columns import Columns, MsgpackColumns, decode_batch_columns, decode_message_columns
from memq.format.message import _message
from memq.format.msgpack_columns import locate_msgpack_columns
from memq.format.records import unpack_columns
from memq.format.spans import Spans, SpanColumns, binary_array_parts, checked_size
from tests.support.format import I64

STAMPS = I64 | st.sampled_from([0, -1, -32, -33, 127, 128, 255, 256, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63)])
log_messages = st.builds(
    LogMessage,
    value=st.binary(max_size=300) | st.sampled_from([b"", b"v" * 70_000]),   # bin8, bin16, bin32
    key=st.none() | st.binary(max_size=16),
    headers=st.lists(st.tuples(st.text(max_size=40), st.binary(max_size=8)), max_size=20).map(tuple),
    timestamp_ms=STAMPS,
    message_id=st.none() | st.binary(max_size=16),
)
FIELDS = st.none() | st.sets(st.sampled_from(COLUMNS))


def old_columns(raw: bytes, count: int) -> MsgpackColumns:
    """The path the walk replaces: msgpack's objects converted by pa.array."""
    return MsgpackColumns(list(unpack_columns(raw, count)), count)


def same_column(new: Columns, old: Columns, name: str) -> None:
    """Both give the same array, or both refuse the field with a CorruptDataError."""
    try:
        want = old.column(name)
    except CorruptDataError:
        with pytest.raises(CorruptDataError):
            new.column(name)
        return
    got = new.column(name)
    got.validate(full=True)
    assert got.type == want.type and got.equals(want), name


def message(raw: bytes, count: int) -> bytearray:
    """A valid Message (CRCs right) around any body bytes, stored uncompressed."""
    return _message(0, Codec.NONE, 1, 0, 0, count, 1, 1, None, raw, len(raw))


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(recs=st.lists(log_messages, max_size=25))
@example(recs=[LogMessage(b"", None, (), 2**63 - 1), LogMessage(b"x", b"", (("é€😀", b""),), -(2**63), b"")])
@example(recs=[LogMessage(b"v", b"k", (("h", b"x"),) * 300, 1)])    # more headers than one a record
def test_the_walk_gives_the_columns_msgpack_gives(recs: list[LogMessage]) -> None:
    raw = msgpack.packb(recs)
    located = locate_msgpack_columns(raw, len(recs))
    assert located is not None          # memq's own layout is walked, never handed back
    assert len(located) == len(recs)
    for name in COLUMNS:
        same_column(located, old_columns(raw, len(recs)), name)


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(recs=st.lists(log_messages, max_size=25), fields=FIELDS,
       codec=st.sampled_from([Codec.NONE, Codec.ZSTD, Codec.GZIP]))
def test_a_batch_decodes_to_the_old_columns_through_each_compression(recs: list[LogMessage], fields: set[str] | None,
                                                                      codec: Codec) -> None:
    msg = encode_message(recs, producer_id=1, epoch=0, sequence=0, codec=codec)
    obj = b"".join(encode_batch([msg], [decode_message_header(msg)], broker_id="b"))
    (_, columns), = decode_batch_columns(obj, fields=fields)[1]
    assert len(columns) == len(recs)
    old = old_columns(msgpack.packb(recs), len(recs))
    for name in COLUMNS:                    # located, not built: any field when asked
        same_column(columns, old, name)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(recs=st.lists(log_messages, min_size=1, max_size=5), at=st.integers(0, 10_000), byte=st.integers(0, 255),
       cut=st.booleans())
def test_a_damaged_body_fails_or_reads_exactly_as_msgpack_reads_it(recs: list[LogMessage], at: int, byte: int,
                                                                   cut: bool) -> None:
    """Any byte replaced, or the body cut there: the same columns, or the same CorruptDataErrors."""
    raw = bytearray(msgpack.packb(recs))
    raw = raw[:at % len(raw)] if cut else raw
    if not cut:
        raw[at % len(raw)] = byte
    msg = message(bytes(raw), len(recs))
    try:
        old = old_columns(bytes(raw), len(recs))
    except CorruptDataError:
        with pytest.raises(CorruptDataError):
            decode_message_columns(msg, Compressors())
        return
    new = decode_message_columns(msg, Compressors())[1]
    for name in COLUMNS:
        same_column(new, old, name)


@pytest.mark.parametrize("raw, count, why", [
    (msgpack.packb([[b"v", None, [], 1, None]])[:-3], 1, "not valid msgpack"),     # truncated
    (b"\xc1garbage", 1, "not valid msgpack"),
    (msgpack.packb([[b"v", None, [], 1, None]] * 2), 3, "holds 2 records"),
    (msgpack.packb([[b"v", None, [], 1]]), 1, "5-field"),
    (msgpack.packb([[b"v", None, [], 1, None]]) + b"\x00", 1, "not valid msgpack"),   # trailing bytes
    (b"\x91\x95\xc4\x01v\xc0\x91\x92\xa2\xff\xfe\xc4\x00\x01\xc0", 1, "not valid msgpack"),   # key not UTF-8
])
def test_a_body_msgpack_refuses_is_corrupt_data_as_before(raw: bytes, count: int, why: str) -> None:
    assert locate_msgpack_columns(raw, count) is None
    with pytest.raises(CorruptDataError, match=why):
        decode_message_columns(message(raw, count), Compressors())


@pytest.mark.parametrize("record, field", [
    ([None, None, [], 1, None], "value"),
    ([b"v", None, None, 1, None], "headers"),
    ([b"v", None, [], None, None], "timestamp_ms"),
    ([b"v", None, [], 2**64 - 1, None], "timestamp_ms"),      # a uint64 past int64
])
def test_a_field_pa_array_refuses_fails_when_asked_for_as_before(record: list[object], field: str) -> None:
    raw = msgpack.packb([record])
    assert locate_msgpack_columns(raw, 1) is None
    msg = message(raw, 1)
    _, columns = decode_message_columns(msg, Compressors())
    with pytest.raises(CorruptDataError, match=f"field {field}"):
        columns.column(field)
    obj = b"".join(encode_batch([msg], [decode_message_header(msg)], broker_id="b"))
    with pytest.raises(CorruptDataError, match=f"field {field}"):
        decode_batch_columns(obj, fields={field})


def test_fields_of_other_msgpack_types_fall_back_to_the_rows_msgpack_gives() -> None:
    """An older writer's str value, a float timestamp, an ext message id: the walk hands the
    body back."""
    recs = [["text value", b"k", [["h", b"x"]], 5, msgpack.ExtType(1, b"id")], ["é", None, [], 1.5, None]]
    raw = msgpack.packb(recs)
    assert locate_msgpack_columns(raw, 2) is None
    columns = decode_message_columns(message(raw, 2), Compressors())[1]
    assert columns.column("value").to_pylist() == [b"text value", "é".encode()]
    for name in ("key", "headers", "timestamp_ms"):
        same_column(columns, old_columns(raw, 2), name)


def spans(start: list[int], length: list[int]) -> Spans:
    return Spans(np.array(start, np.int64), np.array(length, np.int64))


def test_spans_become_binary_and_string_arrays_with_nulls_and_empties() -> None:
    data = b"..abc..\xc3\xa9.."
    some = spans([2, 0, 7, 5], [3, -1, 2, 0])
    assert binary_array_parts([(some, data)], pa.binary()).to_pylist() == [b"abc", None, "é".encode(), b""]
    assert binary_array_parts([(some, data)], pa.string()).to_pylist() == ["abc", None, "é", ""]
    assert binary_array_parts([(some[1:2], data)], pa.binary()).null_count == 1
    assert binary_array_parts([(some[:0], data)], pa.binary()).to_pylist() == []


def test_spans_over_many_buffers_become_one_array_in_order() -> None:
    got = binary_array_parts([(spans([1, 0], [2, 0]), b"xab"), (spans([], []), b""),
                              (spans([0, 3, 0], [-1, 1, 3]), bytearray(b"cdeF"))], pa.binary())
    got.validate(full=True)
    assert got.to_pylist() == [b"ab", b"", None, b"F", b"cde"]
    assert binary_array_parts([(spans([0], [1]), b"a"), (spans([0], [1]), b"b")], pa.binary()).null_count == 0


def test_items_past_an_arrow_binary_arrays_offsets_are_refused_before_any_copy() -> None:
    assert checked_size(2**31 - 1) == 2**31 - 1
    with pytest.raises(CorruptDataError, match="exceed"):
        checked_size(2**31)
    huge = spans([0], [2**30])          # sized first: nothing of the (absent) 1 GiB is read
    with pytest.raises(CorruptDataError, match="exceed"):
        binary_array_parts([(huge, b"x"), (huge, b"y")], pa.binary())


def test_importing_the_format_package_loads_no_numba() -> None:
    """Brokers and the CLI import memq.format; numba (~0.2 s) loads only for a column read."""
    code = "import sys, memq.format, memq.format.columns; print('numba' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          check=True).stdout.strip() == "False"


def test_walked_columns_are_what_a_reader_gets_for_memq_bodies() -> None:
    msg = encode_message([LogMessage(b"v", b"k", (("h", b"x"),), 7)], producer_id=1, epoch=0, sequence=0)
    assert isinstance(decode_message_columns(msg, Compressors())[1], SpanColumns)
