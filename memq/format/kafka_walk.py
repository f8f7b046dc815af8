"""The compiled walk over Kafka records: where every field of every record is, in one pass.

Where a Kafka record starts depends on every length before it, so locating fields is a
sequential walk over varints; in Python it cost ~400 ns a record (a loop over the length
prefixes plus ~25 numpy passes), compiled by numba ~20 ns. numba compiles it once per
machine (cached beside this module) and runs it without the GIL, so a reader's fetch thread
keeps going. The walk only says which record failed: the exact error is the record decoder's
(`kafka_columns` re-reads that batch with it), which keeps one definition of what is corrupt
and this loop small (distinct error codes made it 4x slower). Imported on first use: numba.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Columns of the per-record output (OFFSET_DELTA: compacted parts keep each record's offset).
TS_DELTA, KEY_START, KEY_LEN, VALUE_START, VALUE_LEN, HEADER_COUNT, OFFSET_DELTA = range(7)
RECORD_COLUMNS = 7
#: Columns of the per-header output.
HKEY_START, HKEY_LEN, HVALUE_START, HVALUE_LEN = range(4)
HEADER_COLUMNS = 4

OK, FAILED, MORE_HEADERS = 0, -1, -2


@njit(cache=True, nogil=True)
def varint(u8: np.ndarray, pos: int, end: int) -> tuple[int, int]:  # pragma: no cover - compiled
    """(zigzag-decoded value, position after) of the varint at `pos`; position -1 if it does
    not end by `end` or within 10 bytes. Bits past 64 wrap."""
    acc = 0
    shift = 0
    while True:
        if pos >= end or shift > 63:
            return 0, -1
        b = u8[pos]
        pos += 1
        acc |= (b & 0x7F) << shift
        if b < 0x80:
            return (acc >> 1) ^ -(acc & 1), pos
        shift += 7


@njit(cache=True, nogil=True)
def walk(u8: np.ndarray, starts: np.ndarray, counts: np.ndarray, records: np.ndarray,
         headers: np.ndarray) -> tuple[int, int, int]:  # pragma: no cover - compiled
    """Locate the fields of `counts[b]` records from each batch start `starts[b]` (batch b ends
    at `starts[b + 1]`) into `records` (RECORD_COLUMNS rows, a column per record: each field's values contiguous;
    positions into `u8`; length -1 = null) and `headers` (HEADER_COLUMNS rows, a column per
    header, in record order).

    Returns (OK, headers found, 0), (MORE_HEADERS, headers needed, 0) when `headers` is too
    short, or (FAILED, batch, record) for the first record that does not decode.
    """
    row = 0
    nh = 0
    capacity = headers.shape[1]
    for bt in range(len(counts)):
        pos = starts[bt]
        batch_end = starts[bt + 1]
        for i in range(counts[bt]):
            length, pos = varint(u8, pos, batch_end)
            if pos < 0 or length < 0 or pos + length > batch_end:
                return FAILED, bt, i
            end = pos + length
            pos += 1                                         # record attributes: unused by Kafka
            delta, pos = varint(u8, pos, end)
            if pos < 0:
                return FAILED, bt, i
            records[TS_DELTA, row] = delta
            delta, pos = varint(u8, pos, end)
            if pos < 0:
                return FAILED, bt, i
            records[OFFSET_DELTA, row] = delta
            for start in (KEY_START, VALUE_START):              # key, then value; -1 = null
                n, pos = varint(u8, pos, end)
                if pos < 0 or n < -1 or pos + max(n, 0) > end:
                    return FAILED, bt, i
                records[start, row] = pos
                records[start + 1, row] = n
                pos += max(n, 0)
            count, pos = varint(u8, pos, end)
            if pos < 0 or count < 0 or count > end - pos:
                return FAILED, bt, i
            records[HEADER_COUNT, row] = count
            for _ in range(count):
                n, pos = varint(u8, pos, end)
                if pos < 0 or n < 0 or pos + n > end:        # a header key is never null
                    return FAILED, bt, i
                if nh < capacity:
                    headers[HKEY_START, nh] = pos
                    headers[HKEY_LEN, nh] = n
                pos += n
                n, pos = varint(u8, pos, end)
                if pos < 0 or n < -1 or pos + max(n, 0) > end:
                    return FAILED, bt, i
                if nh < capacity:
                    headers[HVALUE_START, nh] = pos
                    headers[HVALUE_LEN, nh] = n
                pos += max(n, 0)
                nh += 1
            if pos != end:
                return FAILED, bt, i
            row += 1
        if pos != batch_end:
            return FAILED, bt, counts[bt]
    if nh > capacity:
        return MORE_HEADERS, nh, 0
    return OK, nh, 0
