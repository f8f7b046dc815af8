"""Protobuf messages of scalars and nested messages decoded by one compiled walk per batch, no
Python object per record.

A proto3 message whose fields are singular scalars (every integer kind, bool, enum, float,
double, string, bytes) or singular messages of them is walked by numba over every value of a
batch at once, as protobuf's parser reads it: fields in any order, the last value of a scalar
wins, a message given twice is merged, an unknown field is skipped by its wire type, an absent
scalar is its default (proto3 `optional` too: the per-record path reads fields by value, not
presence), an absent message null. The message is laid out as slots (a nested message is a slot
followed by its fields' slots) that `walk_columns` turns into Arrow columns; enums are read as
numbers and named through their values (an unknown number as its digits). A value the walk does
not read exactly as protobuf would (a wire type the field does not have, a group, a number out of
its column's range, two members of one oneof, bytes past its end, a string that is not UTF-8) is
marked, never guessed: the caller decodes it with protobuf. Repeated fields, maps and proto2
messages keep protobuf's parser.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from numba import njit

from memq.format.spans import byte_array
from spark_source.typed_schema import repeated
from spark_source.walk_columns import BOOL, BYTES, DOUBLE, FLOAT, INT, LONG, RECORD, STRING, Leaf, Walked, columns

ENUM = 8             # a column kind of this walk's own: the numbers, named by the enum's values

# how a slot's value is read (what protobuf's parser does for its FieldDescriptor type)
(VARINT64, VARINT32, UVARINT32, UVARINT64, SINT32, SINT64, VBOOL, FIXED32, SFIXED32, FIXED64, SFIXED64, F32, F64,
 LEN, MESSAGE, VENUM) = range(16)
_WIRE = np.array([0, 0, 0, 0, 0, 0, 0, 5, 5, 1, 1, 5, 1, 2, 2, 0], np.int8)   # the wire type each op reads
# FieldDescriptor.TYPE_* -> (op, column kind); its column types are typed_schema's
_TYPES = {1: (F64, DOUBLE), 2: (F32, FLOAT), 3: (VARINT64, LONG), 4: (UVARINT64, LONG), 5: (VARINT32, INT),
          6: (FIXED64, LONG), 7: (FIXED32, INT), 8: (VBOOL, BOOL), 9: (LEN, STRING), 11: (MESSAGE, RECORD),
          12: (LEN, BYTES), 13: (UVARINT32, LONG), 14: (VENUM, ENUM), 15: (SFIXED32, INT), 16: (SFIXED64, LONG),
          17: (SINT32, INT), 18: (SINT64, LONG)}


@dataclass(frozen=True)
class ProtoPlan:
    """A message's slots, depth first: each one's field name, column kind, op and field number;
    for a message slot how many slots its fields take; `first[j + 1]` the first field slot of
    slot j's message (`first[0]` the top message's), `sibling[j]` the next field of the same
    message (-1: none); `oneof[j]` the oneof the field is a member of (-1: none); `enums` each
    enum slot's names by number."""

    names: tuple[str, ...]
    kinds: np.ndarray      # int8
    ops: np.ndarray        # int8
    numbers: np.ndarray    # int64
    inner: np.ndarray      # int64
    first: np.ndarray      # int64
    sibling: np.ndarray    # int64
    oneof: np.ndarray      # int64
    oneofs: int
    depth: int
    enums: Mapping[int, Mapping[int, str]]


def proto_plan(message: Any, syntax: str) -> ProtoPlan | None:
    """The walk's plan of a message descriptor (`syntax` its file's), or None when it is not a
    proto3 message of singular scalars and messages of them."""
    if syntax != "proto3":
        return None
    slots: list[tuple[str, int, int, int, int, int]] = []     # name, kind, op, number, parent, oneof
    inner: dict[int, int] = {}
    enums: dict[int, dict[int, str]] = {}
    oneofs: dict[str, int] = {}

    def add(msg: Any, parent: int, depth: int, seen: tuple[str, ...]) -> int | None:
        """Append `msg`'s fields' slots; its depth of nesting, or None if a field is not walked."""
        if msg.full_name in seen:
            return None
        deepest = depth
        for f in msg.fields:
            if repeated(f) or f.type not in _TYPES:
                return None
            op, kind = _TYPES[f.type]
            group = -1 if f.containing_oneof is None else oneofs.setdefault(f.containing_oneof.full_name, len(oneofs))
            at = len(slots)
            slots.append((f.name, kind, op, f.number, parent, group))
            if op == MESSAGE:
                below = add(f.message_type, at, depth + 1, (*seen, msg.full_name))
                if below is None:
                    return None
                deepest = max(deepest, below)
                inner[at] = len(slots) - at - 1
            elif op == VENUM:
                enums[at] = {number: v.name for number, v in f.enum_type.values_by_number.items()}
        return deepest

    depth = add(message, -1, 0, ())
    if depth is None or not slots:
        return None
    first = np.full(len(slots) + 1, -1, np.int64)
    sibling = np.full(len(slots), -1, np.int64)
    last: dict[int, int] = {}
    for j, (_, _, _, _, parent, _) in enumerate(slots):
        if parent in last:
            sibling[last[parent]] = j
        else:
            first[parent + 1] = j
        last[parent] = j
    return ProtoPlan(tuple(s[0] for s in slots), np.array([s[1] for s in slots], np.int8),
                     np.array([s[2] for s in slots], np.int8), np.array([s[3] for s in slots], np.int64),
                     np.array([inner.get(j, 0) for j in range(len(slots))], np.int64), first, sibling,
                     np.array([s[5] for s in slots], np.int64), len(oneofs), depth, enums)


@njit(cache=True, nogil=True)
def _uvarint(data: np.ndarray, pos: int, end: int, most: int = 10) -> tuple[int, int]:   # pragma: no cover - compiled
    """(the varint's 64 bits, next position); position -1 if it does not end by `end` or within
    `most` bytes (protobuf's parser takes tags and lengths in 5, values in 10), or its 10th
    byte holds more than the 64th bit."""
    result = 0
    shift = 0
    end = min(end, pos + most)
    while pos < end:
        b = data[pos]
        pos += 1
        if shift == 63 and b > 1:
            return 0, -1
        result |= (int(b) & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
    return 0, -1


@njit(cache=True, nogil=True)
def _skip(data: np.ndarray, pos: int, end: int, wire: int) -> int:   # pragma: no cover - compiled
    """The position after an unknown field's value of wire type `wire`; -1 if it does not fit
    or is a group (protobuf's parser reads what the walk refuses)."""
    if wire == 0:
        _, pos = _uvarint(data, pos, end)
        return pos
    if wire == 2:
        n, pos = _uvarint(data, pos, end, 5)
        return -1 if pos < 0 or n < 0 or n > end - pos else pos + n
    width = 8 if wire == 1 else 4 if wire == 5 else -1
    return -1 if width < 0 or width > end - pos else pos + width


@njit(cache=True, nogil=True)
def _fixed(data: np.ndarray, pos: int, width: int) -> int:   # pragma: no cover - compiled
    """The little-endian unsigned `width` bytes at `pos` (8: as int64's bits)."""
    v = 0
    for b in range(width):
        v |= int(data[pos + b]) << (8 * b)
    return v


@njit(cache=True, nogil=True)
def _defaults(slot: int, first: np.ndarray, sibling: np.ndarray, ops: np.ndarray, i: int, ints: np.ndarray,
              floats: np.ndarray, span_start: np.ndarray, span_len: np.ndarray,
              valid: np.ndarray) -> None:   # pragma: no cover - compiled
    """Slot `slot`'s message (-1: the top one) just seen: its scalars are their defaults."""
    c = first[slot + 1]
    while c >= 0:
        if ops[c] != MESSAGE:
            valid[i, c] = True
            ints[i, c] = 0
            floats[i, c] = 0.0
            span_start[i, c] = 0
            span_len[i, c] = 0
        c = sibling[c]


@njit(cache=True, nogil=True)
def _walk(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, kinds: np.ndarray, ops: np.ndarray, numbers: np.ndarray,
          first: np.ndarray, sibling: np.ndarray, oneof: np.ndarray, oneofs: int, depth: int, wire_of: np.ndarray,
          ints: np.ndarray, floats: np.ndarray, span_start: np.ndarray, span_len: np.ndarray, valid: np.ndarray,
          ok: np.ndarray) -> None:   # pragma: no cover - compiled
    scratch = np.zeros(8, np.uint8)
    f32 = scratch[:4].view(np.float32)
    f64 = scratch.view(np.float64)
    stack_slot = np.empty(depth + 1, np.int64)
    stack_end = np.empty(depth + 1, np.int64)
    member = np.empty(max(oneofs, 1), np.int64)
    for i in range(len(starts)):
        pos = starts[i]
        for j in range(len(ops)):
            valid[i, j] = False
            span_len[i, j] = -1
        member[:] = -1
        good = pos < ends[i] and data[pos] == 0       # message indexes: the schema's first message
        pos += 1
        _defaults(-1, first, sibling, ops, i, ints, floats, span_start, span_len, valid)
        level = 0
        stack_slot[0] = -1
        stack_end[0] = ends[i]
        while good:
            end = stack_end[level]
            if pos == end:
                if level == 0:
                    break
                level -= 1
                continue
            tag, pos = _uvarint(data, pos, end, 5)
            if pos < 0 or tag < 8 or tag > 0xFFFFFFFF:
                good = False
                break
            number = tag >> 3
            wire = tag & 7
            c = first[stack_slot[level] + 1]
            while c >= 0 and numbers[c] != number:
                c = sibling[c]
            if c < 0:
                pos = _skip(data, pos, end, wire)
                good = pos >= 0
                continue
            op = ops[c]
            if wire != wire_of[op]:
                good = False
                break
            g = oneof[c]
            if g >= 0:
                if member[g] >= 0 and member[g] != c:
                    good = False
                    break
                member[g] = c
            if wire == 2:
                n, pos = _uvarint(data, pos, end, 5)
                if pos < 0 or n < 0 or n > end - pos:
                    good = False
                    break
                if op == MESSAGE:
                    if not valid[i, c]:
                        valid[i, c] = True
                        _defaults(c, first, sibling, ops, i, ints, floats, span_start, span_len, valid)
                    level += 1
                    stack_slot[level] = c
                    stack_end[level] = pos + n
                else:
                    if kinds[c] == STRING and span_start[i, c] != 0:
                        good = False     # a string given again: protobuf checks each one's UTF-8, `columns` the last
                        break
                    span_start[i, c] = pos
                    span_len[i, c] = n
                    pos += n
                continue
            if wire == 0:
                v, pos = _uvarint(data, pos, end)
                if pos < 0:
                    good = False
                    break
                if op == SINT32 or op == SINT64:        # zig-zag
                    if op == SINT32 and (v < 0 or v > 0xFFFFFFFF):
                        good = False
                        break
                    v = ((v >> 1) & 0x7FFFFFFFFFFFFFFF) ^ -(v & 1)
                elif (op == VARINT32 or op == VENUM) and (v < -2147483648 or v > 2147483647) \
                        or op == UVARINT32 and (v < 0 or v > 0xFFFFFFFF) or op == UVARINT64 and v < 0 \
                        or op == VBOOL and (v < 0 or v > 1):
                    good = False                       # not what its column holds: protobuf says what it is
                    break
                ints[i, c] = v
                continue
            width = 8 if wire == 1 else 4
            if width > end - pos:
                good = False
                break
            if op == F32 or op == F64:
                for b in range(width):
                    scratch[b] = data[pos + b]
                floats[i, c] = f32[0] if op == F32 else f64[0]
            else:
                v = _fixed(data, pos, width)
                if op == SFIXED32 and v > 2147483647:
                    v -= 1 << 32
                if op == FIXED32 and v > 2147483647 or op == FIXED64 and v < 0:
                    good = False
                    break
                ints[i, c] = v
            pos += width
        ok[i] = good


def walk(plan: ProtoPlan, data: bytes | memoryview, starts: np.ndarray, ends: np.ndarray) -> tuple[
        dict[str, pa.Array], np.ndarray]:
    """The fields of the messages at [starts, ends) of `data` (each after its message-index
    byte) as Arrow arrays by field name, and which were read (one not read is null in every
    field)."""
    w = Walked.empty(len(starts), len(plan.ops))
    _walk(byte_array(data), starts.astype(np.int64), ends.astype(np.int64), plan.kinds, plan.ops, plan.numbers, plan.first,
          plan.sibling, plan.oneof, plan.oneofs, plan.depth, _WIRE, w.ints, w.floats, w.span_start, w.span_len,
          w.valid, w.ok)
    leaves: dict[int, Leaf] = {j: _named(names) for j, names in plan.enums.items()}
    return columns(plan.names, plan.kinds, plan.inner, w, data, leaves), w.ok


def _named(names: Mapping[int, str]) -> Leaf:
    """An enum's numbers as its values' names (an unknown number as its digits, as protobuf's
    per-record path gives it)."""
    known = np.array(sorted(names), np.int64)
    labels = [names[n] for n in known.tolist()]

    def leaf(numbers: np.ndarray, mask: np.ndarray) -> pa.Array:
        at = np.minimum(np.searchsorted(known, numbers), max(len(known) - 1, 0))
        found = known[at] == numbers if len(known) else np.zeros(len(numbers), np.bool_)
        dictionary = list(labels)
        unknown = ~found & ~mask
        if unknown.any():
            extra, where = np.unique(numbers[unknown], return_inverse=True)
            at[unknown] = len(dictionary) + where
            dictionary += [str(n) for n in extra.tolist()]
        return pa.array(dictionary, pa.string()).take(pa.array(at, mask=mask))
    return leaf
