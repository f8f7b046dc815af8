"""Avro records of primitives and nested records decoded by one compiled walk per batch, no
Python object per record.

A writer schema whose fields are primitives (boolean, int, long, float, double, string, bytes)
or records of them (at any depth, declared inline), each possibly in a union with null, is
walked by numba over every value of a batch at once: the record is laid out as slots in the
order Avro writes them (a nested record is a slot followed by its fields' slots), numbers land
in numpy columns, strings and bytes as spans of the values' buffer, which `walk_columns` turns
into Arrow arrays (nested records struct arrays over their fields' columns). A
value the walk cannot read (past its end, bytes left over, a union branch the schema lacks, an
int out of range) is marked, never guessed. Other schemas (arrays, maps, enums, logical types,
records named again by reference) take fastavro's reader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from numba import njit

from memq.format.spans import byte_array
from spark_source.walk_columns import BOOL, BYTES, DOUBLE, FLOAT, INT, LONG, RECORD, STRING, Walked, columns

KINDS = {"boolean": BOOL, "int": INT, "long": LONG, "float": FLOAT, "double": DOUBLE, "string": STRING,
         "bytes": BYTES}


@dataclass(frozen=True)
class FlatPlan:
    """A record's slots in the order Avro writes them: each one's field name, kind (KINDS or
    RECORD), the union branch of null (-1: none) and, for a RECORD, how many slots its fields
    take (its nested records' included)."""

    names: tuple[str, ...]
    kinds: np.ndarray          # int8
    null_branch: np.ndarray    # int8
    inner: np.ndarray          # int64


def flat_plan(text: str) -> FlatPlan | None:
    """The walk's plan of an Avro schema, or None when it is not a record of primitives and
    inline records."""
    raw = json.loads(text)
    if not isinstance(raw, dict) or raw.get("type") != "record":
        return None
    names: list[str] = []
    kinds: list[int] = []
    nulls: list[int] = []
    inner: list[int] = []
    return FlatPlan(tuple(names), np.array(kinds, np.int8), np.array(nulls, np.int8), np.array(inner, np.int64)) \
        if _slots(raw, names, kinds, nulls, inner) else None


def _slots(record: dict, names: list[str], kinds: list[int], nulls: list[int], inner: list[int]) -> bool:
    """Append `record`'s fields' slots; False if a field is of a type the walk does not read."""
    for f in record["fields"]:
        t, null = f["type"], -1
        if isinstance(t, list):
            if len(t) != 2 or "null" not in t:
                return False
            null = t.index("null")
            t = t[1 - null]
        if isinstance(t, dict) and set(t) == {"type"}:
            t = t["type"]
        at = len(names)
        names.append(f["name"])
        nulls.append(null)
        inner.append(0)
        if isinstance(t, dict) and t.get("type") == "record":
            kinds.append(RECORD)
            if not _slots(t, names, kinds, nulls, inner):
                return False
            inner[at] = len(names) - at - 1
        elif isinstance(t, str) and t in KINDS:
            kinds.append(KINDS[t])
        else:
            return False
    return True


@njit(cache=True, nogil=True)
def _varint(data: np.ndarray, pos: int, end: int) -> tuple[int, int, bool]:   # pragma: no cover - compiled
    """(zig-zag decoded long, next position, ok)."""
    result = 0
    shift = 0
    while pos < end and shift < 64:
        b = data[pos]
        pos += 1
        result |= (int(b) & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos, True
        shift += 7
    return 0, pos, False


@njit(cache=True, nogil=True)
def _walk(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, kinds: np.ndarray, null_branch: np.ndarray,
          inner: np.ndarray, ints: np.ndarray, floats: np.ndarray, span_start: np.ndarray, span_len: np.ndarray,
          valid: np.ndarray, ok: np.ndarray) -> None:   # pragma: no cover - compiled
    scratch = np.zeros(8, np.uint8)
    f32 = scratch[:4].view(np.float32)
    f64 = scratch.view(np.float64)
    for i in range(len(starts)):
        pos = starts[i]
        end = ends[i]
        good = True
        j = 0
        while j < len(kinds):
            span_len[i, j] = -1
            valid[i, j] = False
            if null_branch[j] >= 0:
                branch, pos, good = _varint(data, pos, end)
                if not good or (branch != 0 and branch != 1):
                    good = False
                    break
                if branch == null_branch[j]:
                    for d in range(j + 1, j + 1 + inner[j]):   # a null record's fields: null too
                        span_len[i, d] = -1
                        valid[i, d] = False
                    j += 1 + inner[j]
                    continue
            k = kinds[j]
            if k == 7:
                pass                   # a record: its fields are the next slots
            elif k == 0:
                if pos >= end or data[pos] > 1:
                    good = False
                    break
                ints[i, j] = data[pos]
                pos += 1
            elif k == 1 or k == 2:
                v, pos, good = _varint(data, pos, end)
                if not good or (k == 1 and (v < -2147483648 or v > 2147483647)):
                    good = False
                    break
                ints[i, j] = v
            elif k == 3 or k == 4:
                width = 4 if k == 3 else 8
                if pos + width > end:
                    good = False
                    break
                for b in range(width):
                    scratch[b] = data[pos + b]
                floats[i, j] = f32[0] if k == 3 else f64[0]
                pos += width
            else:
                n, pos, good = _varint(data, pos, end)
                if not good or n < 0 or pos + n > end:
                    good = False
                    break
                span_start[i, j] = pos
                span_len[i, j] = n
                pos += n
            valid[i, j] = True
            j += 1
        if good and pos != end:
            good = False
        ok[i] = good


def walk(plan: FlatPlan, data: bytes | memoryview, starts: np.ndarray, ends: np.ndarray) -> tuple[
        dict[str, pa.Array], np.ndarray]:
    """The fields of the records at [starts, ends) of `data` as Arrow arrays (by field name), and
    which records were read (a record not read is null in every field). A string that is not
    UTF-8 marks its record not read."""
    w = Walked.empty(len(starts), len(plan.kinds))
    _walk(byte_array(data), starts.astype(np.int64), ends.astype(np.int64), plan.kinds, plan.null_branch, plan.inner,
          w.ints, w.floats, w.span_start, w.span_len, w.valid, w.ok)
    return columns(plan.names, plan.kinds, plan.inner, w, data), w.ok
