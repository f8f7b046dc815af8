"""A msgpack body's records located field by field by one compiled walk, then Arrow columns.

`msgpack.unpackb` builds a tuple and a bytes object per record and field, and `pa.array`
reads them back: ~150 of a Spark read's ~380 ns per row went to creating and freeing those
objects. Here a numba loop walks the body's layout (`records`: an array of
`[value (bin), key (bin|nil), headers ([[str, bin], ...]), timestamp_ms (int), message_id
(bin|nil)]`) and records where each field is (`spans.SpanColumns`); the bytes are copied out once.
An object's decode plus its key, value and timestamp columns went from ~400 to ~135 ns per
row (1M rows of 100-byte values, 12-byte keys, one header; zstd is ~60 of those 135).

The walk takes only that layout as memq writes it. Anything else (another msgpack type in a
field, a count mismatch, a truncated or trailing body, a header key that is not UTF-8) makes
`locate_msgpack_columns` answer None, and the caller decodes that body with msgpack as
before, so rows and CorruptDataErrors stay exactly that path's.

The walk's helpers are inlined into it (`inline="always"`, numba's IR-level inlining): called as
functions (numba compiles each apart, with its own calling convention, which LLVM did not inline)
they made the walk ~300-400 ns a record on the bench's Avro values, ~50-100 inlined.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from memq.format.spans import Spans, SpanColumns, byte_array

_NIL, _BIN8, _BIN16, _BIN32 = 0xC0, 0xC4, 0xC5, 0xC6
_ARRAY16, _ARRAY32 = 0xDC, 0xDD
_STR8, _STR16, _STR32 = 0xD9, 0xDA, 0xDB
_UINT8, _UINT64, _INT8, _INT64 = 0xCC, 0xCF, 0xD0, 0xD3
_BAD = -2        # a length, count or span start: the item is not of the expected type
_NONE = -1       # a span length: nil
_OK, _NOT_SIMPLE = 0, -1   # the walk's answers
_MIN_RECORD = 7  # bytes: [b"", nil, [], 0, nil]
# Rows of the walk's per-record output.
_VALUE, _KEY, _MESSAGE_ID, _TIMESTAMP = 0, 2, 4, 6


def locate_msgpack_columns(raw: bytes | memoryview, count: int) -> SpanColumns | None:
    """The fields of a body of exactly `count` records in memq's layout, or None when the
    body is anything else (the caller then decodes it with msgpack)."""
    if count * _MIN_RECORD > len(raw):     # also keeps a lying count from sizing the arrays
        return None
    spans = np.empty((7, count), np.int64)
    offsets = np.empty(count + 1, np.int32)
    heads = np.empty((4, count), np.int64)          # room for one header a record
    if _walk(byte_array(raw), count, spans, offsets, heads) != _OK:
        return None
    n_heads = int(offsets[count])
    if n_heads > heads.shape[1]:                    # walked again with room for all
        heads = np.empty((4, n_heads), np.int64)
        _walk(byte_array(raw), count, spans, offsets, heads)
    heads = heads[:, :n_heads]
    return SpanColumns(raw, Spans(spans[_VALUE], spans[_VALUE + 1]), Spans(spans[_KEY], spans[_KEY + 1]),
                       spans[_TIMESTAMP], Spans(spans[_MESSAGE_ID], spans[_MESSAGE_ID + 1]), offsets,
                       Spans(heads[0], heads[1]), Spans(heads[2], heads[3]), header_keys_utf8=True)


@njit(cache=True, nogil=True)
def _walk(raw: np.ndarray, count: int, spans: np.ndarray, offsets: np.ndarray,
          heads: np.ndarray) -> int:   # pragma: no cover - compiled
    """Fill `spans` (rows: value start, length, key start, length (-1 nil), message_id start,
    length, timestamp), `offsets` and `heads` (header key start, length, value start, length);
    _NOT_SIMPLE as soon as the body leaves the layout. Headers past the room in `heads` are
    counted in `offsets` but not stored (growing `heads` here made the walk ~40% slower)."""
    end = len(raw)
    n, pos = _array(raw, 0, end)
    if n != count:
        return _NOT_SIMPLE
    offsets[0] = 0
    n_heads = 0
    room = heads.shape[1]
    for i in range(count):
        n, pos = _array(raw, pos, end)
        if n != 5:
            return _NOT_SIMPLE
        start, length, pos = _bin(raw, pos, end)
        if length < 0:
            return _NOT_SIMPLE
        spans[_VALUE, i], spans[_VALUE + 1, i] = start, length
        start, length, pos = _bin(raw, pos, end)
        if start == _BAD:
            return _NOT_SIMPLE
        spans[_KEY, i], spans[_KEY + 1, i] = start, length
        n, pos = _array(raw, pos, end)
        if n < 0:
            return _NOT_SIMPLE
        for _ in range(n):
            pair, pos = _array(raw, pos, end)
            if pair != 2:
                return _NOT_SIMPLE
            start, length, pos = _str(raw, pos, end)
            if length < 0:
                return _NOT_SIMPLE
            high = 0                    # an ASCII key (the usual) skips the full check
            for j in range(start, start + length):
                high |= raw[j]
            if high >= 0x80 and not _utf8(raw, start, start + length):
                return _NOT_SIMPLE
            if n_heads < room:
                heads[0, n_heads], heads[1, n_heads] = start, length
            start, length, pos = _bin(raw, pos, end)
            if length < 0:
                return _NOT_SIMPLE
            if n_heads < room:
                heads[2, n_heads], heads[3, n_heads] = start, length
            n_heads += 1
        offsets[i + 1] = n_heads
        stamp, pos = _int(raw, pos, end)
        if pos < 0:
            return _NOT_SIMPLE
        spans[_TIMESTAMP, i] = stamp
        start, length, pos = _bin(raw, pos, end)
        if start == _BAD:
            return _NOT_SIMPLE
        spans[_MESSAGE_ID, i], spans[_MESSAGE_ID + 1, i] = start, length
    return _OK if pos == end else _NOT_SIMPLE


@njit(cache=True, nogil=True, inline="always")
def _be(raw: np.ndarray, pos: int, size: int) -> int:   # pragma: no cover - compiled
    """The big-endian unsigned integer of `size` bytes at `pos` (in bounds)."""
    acc = 0
    for j in range(size):
        acc = (acc << 8) | int(raw[pos + j])
    return acc


@njit(cache=True, nogil=True, inline="always")
def _array(raw: np.ndarray, pos: int, end: int) -> tuple[int, int]:   # pragma: no cover - compiled
    """(item count, position after the header) of the array at `pos`; count _BAD if none."""
    if pos < 0 or pos >= end:
        return _BAD, pos
    b = raw[pos]
    if 0x90 <= b <= 0x9F:
        return b - 0x90, pos + 1
    size = 2 if b == _ARRAY16 else 4 if b == _ARRAY32 else 0
    if size == 0 or pos + 1 + size > end:
        return _BAD, pos
    return _be(raw, pos + 1, size), pos + 1 + size


@njit(cache=True, nogil=True, inline="always")
def _bin(raw: np.ndarray, pos: int, end: int) -> tuple[int, int, int]:   # pragma: no cover - compiled
    """(start, length, position after) of the bin or nil (length _NONE) at `pos`; start _BAD if neither."""
    if pos < 0 or pos >= end:
        return _BAD, _BAD, pos
    b = raw[pos]
    if b == _NIL:
        return 0, _NONE, pos + 1
    size = 1 if b == _BIN8 else 2 if b == _BIN16 else 4 if b == _BIN32 else 0
    return _sized(raw, pos, end, size)


@njit(cache=True, nogil=True, inline="always")
def _str(raw: np.ndarray, pos: int, end: int) -> tuple[int, int, int]:   # pragma: no cover - compiled
    """(start, length, position after) of the str at `pos`; start and length _BAD if none."""
    if pos < 0 or pos >= end:
        return _BAD, _BAD, pos
    b = raw[pos]
    if 0xA0 <= b <= 0xBF:
        length = b - 0xA0
        if pos + 1 + length > end:
            return _BAD, _BAD, pos
        return pos + 1, length, pos + 1 + length
    size = 1 if b == _STR8 else 2 if b == _STR16 else 4 if b == _STR32 else 0
    return _sized(raw, pos, end, size)


@njit(cache=True, nogil=True, inline="always")
def _sized(raw: np.ndarray, pos: int, end: int, size: int) -> tuple[int, int, int]:   # pragma: no cover - compiled
    """A bin or str at `pos` whose length takes `size` bytes after its type byte (0: not one)."""
    if size == 0 or pos + 1 + size > end:
        return _BAD, _BAD, pos
    length = _be(raw, pos + 1, size)
    start = pos + 1 + size
    if start + length > end:
        return _BAD, _BAD, pos
    return start, length, start + length


@njit(cache=True, nogil=True, inline="always")
def _int(raw: np.ndarray, pos: int, end: int) -> tuple[int, int]:   # pragma: no cover - compiled
    """(value, position after) of the integer at `pos` that fits int64; position -1 if none."""
    if pos < 0 or pos >= end:
        return 0, -1
    b = raw[pos]
    if b <= 0x7F:
        return b, pos + 1
    if b >= 0xE0:
        return b - 0x100, pos + 1
    if _UINT8 <= b <= _UINT64:
        size = 1 << (b - _UINT8)
        if pos + 1 + size > end or (size == 8 and raw[pos + 1] >= 0x80):   # over int64: not a timestamp
            return 0, -1
        return _be(raw, pos + 1, size), pos + 1 + size
    if _INT8 <= b <= _INT64:
        size = 1 << (b - _INT8)
        if pos + 1 + size > end:
            return 0, -1
        value = _be(raw, pos + 1, size)
        if size < 8 and value >= 1 << (8 * size - 1):
            value -= 1 << (8 * size)
        return value, pos + 1 + size
    return 0, -1


@njit(cache=True, nogil=True, inline="always")
def _utf8(raw: np.ndarray, pos: int, end: int) -> bool:   # pragma: no cover - compiled
    """Whether raw[pos:end] is UTF-8 as Python's strict decoder (msgpack's) takes it: no
    overlong forms, surrogates or code points past U+10FFFF."""
    while pos < end:
        b = raw[pos]
        if b < 0x80:
            pos += 1
            continue
        if 0xC2 <= b <= 0xDF:
            size, lo, hi = 2, 0x80, 0xBF
        elif 0xE0 <= b <= 0xEF:
            size = 3
            lo = 0xA0 if b == 0xE0 else 0x80
            hi = 0x9F if b == 0xED else 0xBF
        elif 0xF0 <= b <= 0xF4:
            size = 4
            lo = 0x90 if b == 0xF0 else 0x80
            hi = 0x8F if b == 0xF4 else 0xBF
        else:
            return False
        if pos + size > end or not lo <= raw[pos + 1] <= hi:
            return False
        for j in range(2, size):
            if not 0x80 <= raw[pos + j] <= 0xBF:
                return False
        pos += size
    return True
