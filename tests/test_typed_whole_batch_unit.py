"""Typed reads' whole-batch decoders held to the per-record path, without servers: JSON Schema
values read by one pyarrow.json call, and each must give exactly the struct column, schema ids and
errors that decoding value by value gives (`decode_values(..., per_record=True)`), bad values
mixed in included."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest

from spark_source import typed_values
from spark_source.typed_schema import json_columns, merge, renames
from spark_source.typed_values import Decoded, ReadSchema, Writer, decode_values


def _same(read: ReadSchema, values: Sequence[bytes | None]) -> Decoded:
    """The batch decoded both ways; they must agree on every row."""
    got = decode_values(read, pa.array(values, pa.binary()))
    ref = decode_values(read, pa.array(values, pa.binary()), per_record=True)
    assert got.value.type == ref.value.type
    assert got.value.to_pylist() == ref.value.to_pylist()
    assert got.schema_id.to_pylist() == ref.schema_id.to_pylist()
    assert got.error.to_pylist() == ref.error.to_pylist()
    return got


def _no_per_record(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> None:
        raise AssertionError("decoded value by value")
    monkeypatch.setattr(typed_values, "_decoded", refuse)


# --- JSON Schema -------------------------------------------------------------------------------

_PLACE: dict[str, Any] = {"type": "object", "properties": {"lat": {"type": "number"}, "city": {"type": "string"}}}
_JSON_V1: dict[str, Any] = {"type": "object", "properties": {
    "id": {"type": "integer"}, "name": {"type": "string"}, "score": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string"}}, "where": _PLACE}}
_JSON_V2 = {"type": "object", "properties": {**_JSON_V1["properties"], "active": {"type": "boolean"},
                                             "visits": {"type": "array", "items": _PLACE}}}


def _json_read() -> ReadSchema:
    structs = [(1, json_columns(json.dumps(_JSON_V1))), (2, json_columns(json.dumps(_JSON_V2)))]
    merged = merge(structs)
    return ReadSchema("j-value", merged.root, {sid: Writer(sid, "JSON", "{}", renames(merged.root, s))
                                               for sid, s in structs}, {}, {1: 1, 2: 2})


def _json(schema_id: int, record: Any, **dumps: Any) -> bytes:
    return b"\0" + schema_id.to_bytes(4, "big") + json.dumps(record, **dumps).encode()


def test_json_values_of_two_versions_are_read_in_one_call_as_the_per_record_path_reads_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    values = [_json(1 + i % 2, {
        "id": -i * 2**40, "name": f"n{i}é🙂", "score": i / 3 if i % 3 else i, "tags": ["a"] * (i % 3),
        "where": None if i % 4 == 0 else {"lat": i * 0.25, "city": "Oslo"}, "active": i % 2 == 1,
        "visits": [{"lat": 1.5}, None], "unknown": {"nested": [1, "x"]}}, separators=(",", ":") if i % 2 else None)
        for i in range(40)] + [_json(2, {}), _json(1, {"score": 1e308, "tags": []})]
    ref = decode_values(_json_read(), pa.array(values, pa.binary()), per_record=True)
    _no_per_record(monkeypatch)
    got = decode_values(_json_read(), pa.array(values, pa.binary()))
    assert got.value.type == ref.value.type and got.value.to_pylist() == ref.value.to_pylist()
    assert got.error.null_count == len(values) and got.schema_id.to_pylist() == ref.schema_id.to_pylist()


@pytest.mark.parametrize("bad", [
    b'{"id": 5.0}',                             # the per-record path reads 5: pyarrow.json refuses
    b'{"id": 1, "id": 2}',                      # a key twice: the last one for json.loads
    b'{"score": 12345678901234567}',            # an int a double column cannot hold exactly
    b'{"score": true}', b'{"name": 5}', b'{"where": [1]}', b'{"id": 9223372036854775808}',
    b'{"id": 1}{"id": 2}', b'{"id": 1} null', b'[1]', b'null', b' {"id": 1}', b'{"id": 1}\n', b'',
    b'{\n"id": 1}',                            # valid JSON over two lines
    b'{"name": "\xff"}', b'{"name": "\\ud800"}', b'{"score": -Infinity}', b'{"score": 1e999}', b'{"id": 1e2}',
    b'{"id": 1,}', b'{"tags": ["a", 1]}', b'{"visits": [{"lat": "x"}]}',
])
def test_json_a_value_pyarrow_json_could_read_otherwise_falls_back_and_every_row_agrees(bad: bytes) -> None:
    good = [_json(1, {"id": i, "name": "x", "score": 0.1 * i}) for i in range(3)]
    _same(_json_read(), good[:2] + [b"\0\0\0\0\x02" + bad] + good[2:] + [b"not framed", None, b"\0\0\0\0\x09{}"])


def test_json_random_records_agree_with_the_per_record_path() -> None:
    rng = random.Random(7)
    odd = [1, -5, 2**60, 1.5, 5.0, "s", True, None, [1], {"lat": 1}, 12345678901234567, 0.1234567890123456, 1e300]
    fields = {"id": lambda: rng.randint(-2**62, 2**62), "name": lambda: rng.choice(["a", "é", ""]),
              "score": lambda: rng.choice([rng.random(), rng.randint(0, 10**6)]), "tags": lambda: ["t"] * rng.randint(0, 2),
              "where": lambda: rng.choice([None, {"lat": rng.random(), "city": "c"}]), "active": lambda: rng.random() < 0.5,
              "visits": lambda: [{"lat": 0.5}], "extra": lambda: {"x": [1, 2]}}
    values: list[bytes | None] = []
    for _ in range(600):
        record = {k: (make() if rng.random() < 0.95 else rng.choice(odd)) for k, make in fields.items() if rng.random() < 0.8}
        values.append(_json(rng.choice([1, 2, 1, 2, 3]), record))
    for at in range(0, len(values), 20):
        _same(_json_read(), values[at:at + 20])
