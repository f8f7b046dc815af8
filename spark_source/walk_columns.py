"""What a compiled walk over a batch of records wrote, as Arrow columns: shared by the Avro
(`avro_walk`) and Protobuf (`proto_walk`) walks of typed reads.

A walk lays a record out as slots (a nested record is a slot followed by its fields' slots) and
writes, per record and slot, a number (`ints` / `floats`), or a span of the values' buffer for a
string or bytes, and whether it is set (`valid`). Numbers become numpy-backed arrays, spans one
Arrow array each (`memq.format.spans`), nested records struct arrays over their fields' columns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memq.format.spans import Spans, binary_array_parts

# a slot's column kind
BOOL, INT, LONG, FLOAT, DOUBLE, STRING, BYTES, RECORD = range(8)
_ARROW = {BOOL: pa.bool_(), INT: pa.int32(), LONG: pa.int64(), FLOAT: pa.float32(), DOUBLE: pa.float64(),
          STRING: pa.string(), BYTES: pa.binary()}

# a slot of another kind is built by the walk's own leaf builder: (its ints, null mask) -> column
Leaf = Callable[[np.ndarray, np.ndarray], pa.Array]


@dataclass(frozen=True)
class Walked:
    """Per record (row) and slot (column): its number, span (length -1: none), whether set;
    per record whether it was read (`ok`: a record not read is null whatever its slots hold)."""

    ints: np.ndarray           # int64
    floats: np.ndarray         # float64
    span_start: np.ndarray     # int64
    span_len: np.ndarray       # int64
    valid: np.ndarray          # bool
    ok: np.ndarray             # bool, one per record

    @classmethod
    def empty(cls, records: int, slots: int) -> Walked:
        return cls(np.zeros((records, slots), np.int64), np.zeros((records, slots), np.float64),
                   np.zeros((records, slots), np.int64), np.full((records, slots), -1, np.int64),
                   np.zeros((records, slots), np.bool_), np.zeros(records, np.bool_))


def columns(names: tuple[str, ...], kinds: np.ndarray, inner: np.ndarray, walked: Walked,
            data: bytes | memoryview, leaves: Mapping[int, Leaf] | None = None) -> dict[str, pa.Array]:
    """The records' top-level columns by field name. A string that is not UTF-8 marks its
    record not read in `walked.ok`, and a record not read is null in every column."""
    n = len(walked.ok)
    walked_ok = int(walked.ok.sum())
    if walked_ok != n:          # a record not read: whatever the walk set before it stopped is not a value
        walked.valid[~walked.ok] = False
        walked.span_len[~walked.ok] = -1
    built: dict[int, pa.Array] = {}
    for j, kind in enumerate(kinds.tolist()):
        mask = ~walked.valid[:, j]
        if kind == RECORD:
            continue
        if kind in (STRING, BYTES):
            arr = binary_array_parts([(Spans(np.ascontiguousarray(walked.span_start[:, j]),
                                             np.ascontiguousarray(walked.span_len[:, j])), data)], _ARROW[kind])
            if kind == STRING:
                arr = _utf8(arr, walked.ok)
        elif kind in (FLOAT, DOUBLE):
            arr = pa.array(walked.floats[:, j].astype(np.float32 if kind == FLOAT else np.float64), mask=mask)
        elif kind in _ARROW:
            arr = pa.array(walked.ints[:, j], mask=mask).cast(_ARROW[kind])
        else:
            assert leaves is not None
            arr = leaves[j](walked.ints[:, j], mask)
        built[j] = arr
    out = _level(names, kinds, inner, built, walked.valid, 0, len(kinds))
    if int(walked.ok.sum()) != walked_ok:   # a string marked its record not read: null it everywhere
        keep = pa.array(walked.ok)
        out = {name: pc.if_else(keep, arr, pa.nulls(n, arr.type)) for name, arr in out.items()}
    return out


def _level(names: tuple[str, ...], kinds: np.ndarray, inner: np.ndarray, built: dict[int, pa.Array],
           valid: np.ndarray, j: int, stop: int) -> dict[str, pa.Array]:
    """The columns of the record whose slots are [j, stop), by field name: a nested record a
    struct of its fields' columns, null where its slot is not set."""
    out: dict[str, pa.Array] = {}
    while j < stop:
        if kinds[j] == RECORD:
            end = j + 1 + int(inner[j])
            fields = _level(names, kinds, inner, built, valid, j + 1, end)
            out[names[j]] = pa.StructArray.from_arrays(list(fields.values()), names=list(fields),
                                                       mask=pa.array(~valid[:, j]))
            j = end
        else:
            out[names[j]] = built[j]
            j += 1
    return out


def _utf8(arr: pa.Array, ok: np.ndarray) -> pa.Array:
    """`arr` if it is valid UTF-8; else its bad items' records are marked not read in `ok`."""
    try:
        arr.validate(full=True)
        return arr
    except pa.ArrowInvalid:
        pass
    items = arr.cast(pa.binary()).to_pylist()
    fixed = []
    for i, item in enumerate(items):
        try:
            fixed.append(None if item is None else item.decode("utf-8"))
        except UnicodeDecodeError:
            ok[i] = False
            fixed.append(None)
    return pa.array(fixed, pa.string())
