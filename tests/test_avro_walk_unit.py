"""The compiled Avro walk (`memq.schema.avro_walk`) against fastavro, the judge: every valid
encoding passes, and no payload fastavro refuses passes (truncated, flipped, extended, bad UTF-8,
out-of-range indexes and logical values), over a schema with every Avro type."""

from __future__ import annotations

import io
import random
import time
from typing import Any

import fastavro
import numpy as np
import pytest

from memq.schema import avro_walk

SCHEMA = {"type": "record", "name": "Root", "namespace": "t", "fields": [
    {"name": "flag", "type": "boolean"},
    {"name": "i", "type": "int"},
    {"name": "l", "type": "long"},
    {"name": "f", "type": "float"},
    {"name": "d", "type": "double"},
    {"name": "raw", "type": "bytes"},
    {"name": "s", "type": "string"},
    {"name": "fx", "type": {"type": "fixed", "name": "Four", "size": 4}},
    {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}},
    {"name": "opt", "type": ["null", "string", "Four"]},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "attrs", "type": {"type": "map", "values": ["null", "long"]}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "child", "type": ["null", "Root"]},   # recursive
]}


def _value(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    import datetime
    import decimal
    return {"flag": rng.random() < 0.5, "i": rng.randint(-(1 << 31), (1 << 31) - 1),
            "l": rng.randint(-(1 << 63), (1 << 63) - 1), "f": rng.random(), "d": rng.uniform(-1e300, 1e300),
            "raw": rng.randbytes(rng.randint(0, 20)), "s": rng.choice(["", "plain", "é", "日本語", "🙂x" * 3]),
            "fx": rng.randbytes(4), "e": rng.choice(["RED", "GREEN", "BLUE"]),
            "opt": rng.choice([None, "x" * rng.randint(0, 5), b"abcd"]),
            "tags": [str(rng.random()) for _ in range(rng.randint(0, 4))],
            "attrs": {f"k{j}": rng.choice([None, rng.randint(-5, 5)]) for j in range(rng.randint(0, 3))},
            "day": datetime.date(2000, 1, 1) + datetime.timedelta(days=rng.randint(-300, 3000)),
            "at": datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
            + datetime.timedelta(milliseconds=rng.randint(0, 10**11)),
            "amount": decimal.Decimal(rng.randint(-10**8, 10**8)) / 100,
            "child": _value(rng, depth + 1) if depth < 2 and rng.random() < 0.4 else None}


@pytest.fixture(scope="module")
def compiled() -> tuple[Any, np.ndarray]:
    named: dict[str, Any] = {}
    parsed = fastavro.parse_schema(SCHEMA, named_schemas=named)
    return parsed, avro_walk.program(parsed, named)


def _encode(parsed: Any, value: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, value)
    return buf.getvalue()


def _fastavro_ok(parsed: Any, payload: bytes) -> bool:
    buf = io.BytesIO(payload)
    try:
        fastavro.schemaless_reader(buf, parsed, None)
    except Exception:
        return False
    return buf.tell() == len(payload)


def _walk(code: np.ndarray, payloads: list[bytes], skip: int = 0) -> list[bool]:
    bounds = np.zeros(len(payloads) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in payloads], out=bounds[1:])
    return avro_walk.walk(np.frombuffer(b"".join(payloads), dtype=np.uint8), bounds, skip, code).tolist()


def test_every_valid_encoding_passes_also_behind_a_prefix(compiled: tuple[Any, np.ndarray]) -> None:
    parsed, code = compiled
    rng = random.Random(1)
    payloads = [_encode(parsed, _value(rng)) for _ in range(300)]
    assert all(_walk(code, payloads))
    assert all(_walk(code, [b"\0\0\0\0\7" + p for p in payloads], skip=5))   # Confluent's framing skipped


def test_arrays_and_maps_in_blocks_with_byte_sizes_pass() -> None:
    """Avro lets a writer give a block's count negative, followed by its size in bytes."""
    named: dict[str, Any] = {}
    parsed = fastavro.parse_schema({"type": "array", "items": "long"}, named_schemas=named)
    code = avro_walk.program(parsed, named)
    # blocks: count -2 (size 2) [1, 2], then count 1 [3], then 0
    payload = bytes([3, 4, 2, 4, 2, 6, 0])
    assert _fastavro_ok(parsed, payload) and _walk(code, [payload]) == [True]


def test_no_payload_fastavro_refuses_passes(compiled: tuple[Any, np.ndarray]) -> None:
    parsed, code = compiled
    rng = random.Random(2)
    mutated: list[bytes] = []
    for _ in range(60):
        good = _encode(parsed, _value(rng))
        mutated += [good[:n] for n in range(0, len(good), max(1, len(good) // 25))]   # truncated
        mutated.append(good + rng.randbytes(rng.randint(1, 3)))                         # bytes after it
        for _ in range(15):                                                             # a byte changed
            at = rng.randrange(len(good))
            mutated.append(good[:at] + bytes([rng.randrange(256)]) + good[at + 1:])
    verdicts = _walk(code, mutated)
    judged = [_fastavro_ok(parsed, p) for p in mutated]
    assert not any(w and not j for w, j in zip(verdicts, judged, strict=True))   # never passes a refused one
    assert sum(verdicts) > 0.5 * sum(judged)    # and a filter worth having: most valid mutants pass


@pytest.mark.parametrize("text", [b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\xff"])
def test_strings_that_are_not_utf8_fail(text: bytes) -> None:
    named: dict[str, Any] = {}
    parsed = fastavro.parse_schema("string", named_schemas=named)
    payload = bytes([len(text) * 2]) + text
    assert _walk(avro_walk.program(parsed, named), [payload]) == [False]
    assert not _fastavro_ok(parsed, payload)


def test_out_of_range_indexes_and_logical_values_fail() -> None:
    def one(schema: Any, payload: bytes) -> bool:
        named: dict[str, Any] = {}
        parsed = fastavro.parse_schema(schema, named_schemas=named)
        return _walk(avro_walk.program(parsed, named), [payload])[0]

    enum = {"type": "enum", "name": "E", "symbols": ["A", "B"]}
    assert one(enum, bytes([2])) and not one(enum, bytes([4])) and not one(enum, bytes([1]))   # 1, 2, -1
    assert one(["null", "long"], bytes([2, 2])) and not one(["null", "long"], bytes([4]))
    day = {"type": "int", "logicalType": "date"}
    assert one(day, _zigzag(0)) and not one(day, _zigzag(3_000_000))     # past year 9999
    millis = {"type": "int", "logicalType": "time-millis"}
    assert one(millis, _zigzag(1_000)) and not one(millis, _zigzag(-1)) and not one(millis, _zigzag(86_400_000))


def _zigzag(v: int) -> bytes:
    u = (v << 1) ^ (v >> 63)
    out = bytearray()
    while u >= 0x80:
        out.append(u & 0x7F | 0x80)
        u >>= 7
    return bytes(out + bytes([u]))


def test_items_that_take_no_bytes_cannot_loop_for_ever() -> None:
    named: dict[str, Any] = {}
    parsed = fastavro.parse_schema({"type": "array", "items": "null"}, named_schemas=named)
    code = avro_walk.program(parsed, named)
    huge = bytes([0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0])   # 2^62 nulls in one block
    t0 = time.monotonic()
    assert _walk(code, [huge]) == [False]
    assert time.monotonic() - t0 < 5


def test_a_uuid_schema_has_no_walk() -> None:
    named: dict[str, Any] = {}
    parsed = fastavro.parse_schema({"type": "string", "logicalType": "uuid"}, named_schemas=named)
    with pytest.raises(avro_walk.Unwalkable):
        avro_walk.program(parsed, named)
