"""A compiled check that Avro payloads decode, over a whole group of records at once.

fastavro decodes a record in 1-3 us, building every value; a produce-time check only needs to
know the bytes are a valid encoding. Here a schema is compiled (`program`, pure) into a flat
array of type nodes, and numba walks every payload of a group through it in one call (`walk`,
~0.1 us a 100 B record), building nothing. The walk is a filter, never the judge: it is at least
as strict as fastavro (bounds, UTF-8, union and enum indexes, the ranges fastavro's logical
types convert), so a payload it passes decodes; one it fails is decoded again by fastavro, whose
verdict and message stand (`memq.schema.check`). A schema the walk cannot mirror (a `uuid`
logical type: fastavro parses the text) gets no program and is decoded by fastavro alone.

Node layout in the program (int64): `[op, ...]`, children by address:
RECORD n a1..an; UNION n a1..an; ARRAY a; MAP a; FIXED size; ENUM n; LONG_IN lo hi (a long
whose value must lie in [lo, hi]: ints and the logical types fastavro converts); the rest bare.
Imported on first use: numba.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numba import njit

from memq.format.kafka_walk import varint   # Avro's longs are Kafka's varints: zigzag, at most 10 bytes

NULL, BOOLEAN, LONG, FLOAT, DOUBLE, BYTES, STRING, FIXED, ENUM, RECORD, UNION, ARRAY, MAP, LONG_IN = range(14)

_PRIMITIVE = {"null": NULL, "boolean": BOOLEAN, "int": LONG, "long": LONG, "float": FLOAT, "double": DOUBLE,
              "bytes": BYTES, "string": STRING}
#: Safe ranges (a little inside what fastavro converts) of the logical types fastavro turns into
#: dates and times: outside them fastavro raises, so the walk fails them and fastavro decides.
_DAY_MS = 86_400_000
_YEARS_MS = 253_402_300_799_999 - 86_400_000 * 366, -62_135_596_800_000 + 86_400_000 * 366   # years 2..9998
_LOGICAL_RANGES = {
    "date": (-719_162 + 366, 2_932_896 - 366),
    "time-millis": (0, _DAY_MS - 1),
    "time-micros": (0, _DAY_MS * 1000 - 1),
    "timestamp-millis": (_YEARS_MS[1], _YEARS_MS[0]),
    "timestamp-micros": (_YEARS_MS[1] * 1000, _YEARS_MS[0] * 1000),
    "local-timestamp-millis": (_YEARS_MS[1], _YEARS_MS[0]),
    "local-timestamp-micros": (_YEARS_MS[1] * 1000, _YEARS_MS[0] * 1000),
}
_INT32 = (-(1 << 31), (1 << 31) - 1)


class Unwalkable(Exception):
    """The schema uses what the walk does not mirror (fastavro alone decodes it)."""


def program(parsed: Any, named: Mapping[str, Any]) -> np.ndarray:
    """The walk's program for a schema as `fastavro.parse_schema` returns it (`named`: its
    named types by full name). Raises Unwalkable for a schema the walk cannot mirror."""
    code: list[int] = []
    at: dict[str, int] = {}   # named type -> its node's address (recursive types refer back)

    def emit(schema: Any) -> int:
        if isinstance(schema, str):
            if schema in _PRIMITIVE:
                return _leaf(LONG_IN, *_INT32) if schema == "int" else _leaf(_PRIMITIVE[schema])
            if schema in at:
                return at[schema]
            if schema not in named:
                raise Unwalkable(f"unknown type {schema}")
            return emit(named[schema])
        if isinstance(schema, list):
            return _composite(UNION, schema)
        kind = schema["type"]
        logical = schema.get("logicalType")
        if logical == "uuid":
            raise Unwalkable("uuid logical type")
        if logical in _LOGICAL_RANGES and kind in ("int", "long"):
            return _leaf(LONG_IN, *_LOGICAL_RANGES[logical])
        if kind in ("record", "error"):
            return _composite(RECORD, [f["type"] for f in schema["fields"]], name=schema.get("name"))
        if kind == "enum":
            return _named(schema, [ENUM, len(schema["symbols"])])
        if kind == "fixed":
            return _named(schema, [FIXED, int(schema["size"])])
        if kind in ("array", "map"):
            node = _leaf(ARRAY if kind == "array" else MAP, -1)
            code[node + 1] = emit(schema["items" if kind == "array" else "values"])
            return node
        return emit(kind)   # {"type": "long"}, a named type's name, or a nested schema

    def _leaf(*node: int) -> int:
        code.extend(node)
        return len(code) - len(node)

    def _named(schema: Mapping[str, Any], node: list[int]) -> int:
        address = _leaf(*node)
        if schema.get("name"):
            at[schema["name"]] = address
        return address

    def _composite(op: int, children: list[Any], name: str | None = None) -> int:
        node = len(code)
        code.extend([op, len(children), *([-1] * len(children))])
        if name:
            at[name] = node
        for i, child in enumerate(children):
            code[node + 2 + i] = emit(child)
        return node

    emit(parsed)
    return np.asarray(code, dtype=np.int64)


#: Nesting the walk follows (a deeper payload is left to fastavro).
MAX_DEPTH = 64


_HIGH_BITS = np.uint64(0x8080808080808080)


@njit(cache=True, nogil=True)
def _utf8(u8: np.ndarray, u64: np.ndarray, pos: int, end: int) -> bool:  # pragma: no cover - compiled
    """Whether u8[pos:end] is UTF-8 as Python's strict decoder takes it (no overlongs,
    surrogates or code points past U+10FFFF). `u64`: the same bytes as words, so ASCII runs
    are passed 8 bytes a step."""
    while pos < end:
        if (pos & 7) == 0:
            while pos + 8 <= end and (u64[pos >> 3] & _HIGH_BITS) == 0:
                pos += 8
            if pos >= end:
                break
        b = u8[pos]
        if b < 0x80:
            pos += 1
            continue
        if 0xC2 <= b <= 0xDF:
            n, lo, hi = 1, 0x80, 0xBF
        elif b == 0xE0:
            n, lo, hi = 2, 0xA0, 0xBF
        elif b == 0xED:
            n, lo, hi = 2, 0x80, 0x9F
        elif 0xE1 <= b <= 0xEF:
            n, lo, hi = 2, 0x80, 0xBF
        elif b == 0xF0:
            n, lo, hi = 3, 0x90, 0xBF
        elif 0xF1 <= b <= 0xF3:
            n, lo, hi = 3, 0x80, 0xBF
        elif b == 0xF4:
            n, lo, hi = 3, 0x80, 0x8F
        else:
            return False
        if pos + n >= end:
            return False
        c = u8[pos + 1]
        if c < lo or c > hi:
            return False
        for k in range(2, n + 1):
            c = u8[pos + k]
            if c < 0x80 or c > 0xBF:
                return False
        pos += n + 1
    return True


@njit(cache=True, nogil=True)
def _one(u8: np.ndarray, u64: np.ndarray, pos: int, end: int, code: np.ndarray, stack: np.ndarray) -> bool:  # pragma: no cover
    """Whether u8[pos:end] is exactly one encoding of the program's root (address 0)."""
    # stack rows: (node address, fields/branch state, items left in the current block)
    sp = 1
    stack[0, 0] = 0
    stack[0, 1] = 0
    stack[0, 2] = 0
    steps = 0
    limit = 8 * (end - pos) + 1024   # items that take no bytes cannot loop for ever
    while sp > 0:
        steps += 1
        if steps > limit:
            return False
        node = stack[sp - 1, 0]
        op = code[node]
        if op == RECORD:
            i = stack[sp - 1, 1]
            if i >= code[node + 1]:
                sp -= 1
                continue
            stack[sp - 1, 1] = i + 1
            child = code[node + 2 + i]
        elif op == UNION:
            if stack[sp - 1, 1]:
                sp -= 1
                continue
            v, pos = varint(u8, pos, end)
            if pos < 0 or v < 0 or v >= code[node + 1]:
                return False
            stack[sp - 1, 1] = 1
            child = code[node + 2 + v]
        elif op == ARRAY or op == MAP:
            left = stack[sp - 1, 2]
            if left == 0:
                v, pos = varint(u8, pos, end)
                if pos < 0:
                    return False
                if v == 0:
                    sp -= 1
                    continue
                if v < 0:
                    v = -v
                    size, pos = varint(u8, pos, end)
                    if pos < 0 or size < 0:
                        return False
                left = v
            stack[sp - 1, 2] = left - 1
            if op == MAP:   # the key: a string
                n, pos = varint(u8, pos, end)
                if pos < 0 or n < 0 or n > end - pos or not _utf8(u8, u64, pos, pos + n):
                    return False
                pos += n
            child = code[node + 1]
        else:
            sp -= 1   # a leaf: consumed here
            if op == NULL:
                pass
            elif op == BOOLEAN:
                if pos >= end or u8[pos] > 1:
                    return False
                pos += 1
            elif op == LONG:
                v, pos = varint(u8, pos, end)
                if pos < 0:
                    return False
            elif op == LONG_IN:
                v, pos = varint(u8, pos, end)
                if pos < 0 or v < code[node + 1] or v > code[node + 2]:
                    return False
            elif op == FLOAT or op == DOUBLE or op == FIXED:
                n = 4 if op == FLOAT else 8 if op == DOUBLE else code[node + 1]
                if n > end - pos:
                    return False
                pos += n
            elif op == BYTES or op == STRING:
                n, pos = varint(u8, pos, end)
                if pos < 0 or n < 0 or n > end - pos:
                    return False
                if op == STRING and not _utf8(u8, u64, pos, pos + n):
                    return False
                pos += n
            elif op == ENUM:
                v, pos = varint(u8, pos, end)
                if pos < 0 or v < 0 or v >= code[node + 1]:
                    return False
            else:
                return False
            continue
        if sp == stack.shape[0]:
            return False
        stack[sp, 0] = child
        stack[sp, 1] = 0
        stack[sp, 2] = 0
        sp += 1
    return pos == end


@njit(cache=True, nogil=True)
def _walk(u8: np.ndarray, u64: np.ndarray, bounds: np.ndarray, skip: int,
          code: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    n = len(bounds) - 1
    ok = np.zeros(n, dtype=np.bool_)
    stack = np.empty((MAX_DEPTH, 3), dtype=np.int64)
    for i in range(n):
        start = bounds[i] + skip
        ok[i] = start <= bounds[i + 1] and _one(u8, u64, start, bounds[i + 1], code, stack)
    return ok


def walk(u8: np.ndarray, bounds: np.ndarray, skip: int, code: np.ndarray) -> np.ndarray:
    """For each payload `u8[bounds[i] + skip : bounds[i + 1]]`, whether it is exactly one
    encoding of the program's root (`u8`: one buffer of them all)."""
    return _walk(u8, u8[:len(u8) & ~7].view(np.uint64), bounds, skip, code)
