"""Typed reads' whole-batch decoders held to the per-record path, without servers: JSON Schema
values read by one pyarrow.json call, Protobuf messages by a compiled walk; each must give
exactly the struct column, schema ids and errors that decoding value by value gives
(`decode_values(..., per_record=True)`), bad values mixed in included."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from spark_source import typed_values
from spark_source.typed_schema import json_columns, merge, protobuf_columns, renames
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
    return ReadSchema("lines-value", merged.root, {sid: Writer(sid, "JSON", "{}", renames(merged.root, s))
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
    b'{"deep": ' + b"[" * 5000 + b"]" * 5000 + b"}",   # json.loads runs out of stack, pyarrow.json reads it
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


# --- Protobuf ----------------------------------------------------------------------------------

_F = descriptor_pb2.FieldDescriptorProto
# every scalar kind, an enum, an optional, a oneof, nested messages two deep; version 2 renames
# field 1 (and widens it to int64), renames Inner.t, adds a field, drops `y`
_SCALARS = [("i32", _F.TYPE_INT32), ("i64", _F.TYPE_INT64), ("u32", _F.TYPE_UINT32), ("u64", _F.TYPE_UINT64),
            ("s32", _F.TYPE_SINT32), ("s64", _F.TYPE_SINT64), ("b", _F.TYPE_BOOL), ("f32", _F.TYPE_FIXED32),
            ("sf32", _F.TYPE_SFIXED32), ("f64", _F.TYPE_FIXED64), ("sf64", _F.TYPE_SFIXED64), ("fl", _F.TYPE_FLOAT),
            ("d", _F.TYPE_DOUBLE), ("s", _F.TYPE_STRING), ("y", _F.TYPE_BYTES)]


def _proto_file(version: int) -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto(name=f"m{version}.proto", package="t", syntax="proto3")
    m = fdp.message_type.add(name="M")
    for number, (name, typ) in enumerate(_SCALARS, 1):
        if version == 2 and name == "y":
            continue
        if version == 2 and name == "i32":
            name, typ = "count", _F.TYPE_INT64
        m.field.add(name=name, number=number, type=typ, label=_F.LABEL_OPTIONAL)
    m.field.add(name="e", number=16, type=_F.TYPE_ENUM, type_name=".t.Color", label=_F.LABEL_OPTIONAL)
    m.field.add(name="inner", number=17, type=_F.TYPE_MESSAGE, type_name=".t.Inner", label=_F.LABEL_OPTIONAL)
    m.field.add(name="c1", number=19, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL, oneof_index=0)
    m.field.add(name="c2", number=20, type=_F.TYPE_MESSAGE, type_name=".t.Inner", label=_F.LABEL_OPTIONAL,
                oneof_index=0)
    m.oneof_decl.add(name="choice")
    m.field.add(name="opt", number=18, type=_F.TYPE_INT64, label=_F.LABEL_OPTIONAL, proto3_optional=True,
                oneof_index=1)
    m.oneof_decl.add(name="_opt")
    if version == 2:
        m.field.add(name="added", number=21, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    inner = fdp.message_type.add(name="Inner")
    inner.field.add(name="x", number=1, type=_F.TYPE_INT32, label=_F.LABEL_OPTIONAL)
    inner.field.add(name="t" if version == 1 else "text", number=2, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    inner.field.add(name="deep", number=3, type=_F.TYPE_MESSAGE, type_name=".t.Deep", label=_F.LABEL_OPTIONAL)
    fdp.message_type.add(name="Deep").field.add(name="z", number=1, type=_F.TYPE_DOUBLE, label=_F.LABEL_OPTIONAL)
    color = fdp.enum_type.add(name="Color")
    for number, name in enumerate(["RED", "GREEN", "BLUE"]):
        color.value.add(name=name, number=number)
    return fdp


def _proto_read() -> tuple[ReadSchema, dict[int, Any]]:
    """The read schema of both versions (schema id = version), and each version's message class."""
    structs, writers, classes = [], {}, {}
    for v in (1, 2):
        fdp = _proto_file(v)
        pool = descriptor_pool.DescriptorPool()
        pool.Add(fdp)
        desc = pool.FindMessageTypeByName("t.M")
        classes[v] = message_factory.GetMessageClass(desc)
        structs.append((v, protobuf_columns(desc), base64.standard_b64encode(fdp.SerializeToString()).decode()))
    merged = merge([(v, s) for v, s, _ in structs])
    assert not merged.rejected
    for v, s, text in structs:
        writers[v] = Writer(v, "PROTOBUF", text, renames(merged.root, s))
    return ReadSchema("walked-value", merged.root, writers, {}, {1: 1, 2: 2}), classes


_EDGES = {"i32": [-2**31, 2**31 - 1], "i64": [-2**63, 2**63 - 1], "u32": [2**32 - 1], "u64": [2**63 - 1, 2**64 - 1],
          "s32": [-2**31, 2**31 - 1], "s64": [-2**63, 2**63 - 1], "f32": [2**31 - 1, 2**32 - 1],
          "sf32": [-2**31], "f64": [2**63 - 1, 2**64 - 1], "sf64": [-2**63], "fl": [3.4e38, -0.0, 1e-45],
          "d": [1e308, float("inf")], "s": ["", "é🙂"], "y": [b"", b"\xff\0"], "count": [-2**63, 2**63 - 1]}


def _message(rng: random.Random, cls: Any) -> Any:
    m = cls()
    for f in cls.DESCRIPTOR.fields:
        if rng.random() < 0.3 or f.containing_oneof is not None and f.containing_oneof.name == "choice":
            continue
        if f.message_type is not None:
            sub = getattr(m, f.name)
            sub.x = rng.randint(-2**31, 2**31 - 1)
            if rng.random() < 0.5:
                sub.deep.z = rng.random()
            continue
        if f.enum_type is not None:
            setattr(m, f.name, rng.choice([0, 1, 2, 2, 7, -3]))    # open enum: unknown numbers kept
            continue
        edge = _EDGES.get(f.name, [])
        if f.type in (_F.TYPE_FLOAT, _F.TYPE_DOUBLE):
            value: Any = rng.choice(edge + [rng.uniform(-1e6, 1e6)] * 4)
        elif f.type == _F.TYPE_STRING:
            value = rng.choice(edge + [f"s{rng.random()}"])
        elif f.type == _F.TYPE_BYTES:
            value = rng.choice(edge + [rng.randbytes(5)])
        elif f.type == _F.TYPE_BOOL:
            value = rng.random() < 0.5
        else:
            lo = -2**31 if f.type in (_F.TYPE_INT32, _F.TYPE_SINT32, _F.TYPE_SFIXED32) else \
                -2**63 if f.type in (_F.TYPE_INT64, _F.TYPE_SINT64, _F.TYPE_SFIXED64) else 0
            value = rng.choice(edge + [rng.randint(lo, 2**31 - 1)] * 6) if rng.random() < 0.3 else rng.randint(lo, 1000)
        setattr(m, f.name, value)
    which = rng.random()
    if which < 0.3:
        m.c1 = "one"
    elif which < 0.6:
        m.c2.x = 5
    return m


def _framed(version: int, payload: bytes) -> bytes:
    return b"\0" + version.to_bytes(4, "big") + b"\0" + payload


def test_protobuf_messages_of_two_versions_are_walked_into_the_columns_protobuf_gives(
        monkeypatch: pytest.MonkeyPatch) -> None:
    read, classes = _proto_read()
    rng = random.Random(11)
    values = []
    for i in range(300):
        v = 1 + i % 2
        m = _message(rng, classes[v])
        for f in m.DESCRIPTOR.fields:      # values every column holds: the walk reads them all
            if f.name in ("u64", "f64") and getattr(m, f.name) >= 2**63 or f.name == "f32" and m.f32 >= 2**31:
                setattr(m, f.name, 1)
        values.append(_framed(v, m.SerializeToString()))
    values += [_framed(1, b""), _framed(2, b"")]             # every field absent: defaults, messages null
    ref = decode_values(read, pa.array(values, pa.binary()), per_record=True)
    assert ref.error.null_count == len(values)
    _no_per_record(monkeypatch)
    got = decode_values(read, pa.array(values, pa.binary()))
    assert got.value.type == ref.value.type and got.value.to_pylist() == ref.value.to_pylist()
    assert got.value.to_pylist()[-1] == {**{c: 0 for c in ("count", "i64", "u32", "u64", "s32", "s64", "f32", "sf32",
                                                           "f64", "sf64", "opt")},
                                         "b": False, "fl": 0.0, "d": 0.0, "s": "", "y": None, "e": "RED", "inner": None,
                                         "c1": "", "c2": None, "added": ""}


def test_protobuf_values_the_walk_does_not_read_are_decoded_by_protobuf_with_todays_errors() -> None:
    read, classes = _proto_read()
    rng = random.Random(12)
    values: list[bytes | None] = []
    for i in range(400):
        v = 1 + i % 2
        payload = _message(rng, classes[v]).SerializeToString()
        kind = i % 8
        if kind == 1:        # two messages back to back: protobuf merges them (last scalar wins, oneofs switch)
            payload += _message(rng, classes[v]).SerializeToString()
        elif kind == 2:      # the other version's bytes: unknown fields, or known ones of another type
            payload = _message(rng, classes[3 - v]).SerializeToString()
        elif kind == 3 and payload:    # a byte changed
            at = rng.randrange(len(payload))
            payload = payload[:at] + bytes([rng.randrange(256)]) + payload[at + 1:]
        elif kind == 4:      # cut short
            payload = payload[:rng.randrange(len(payload) + 1)]
        elif kind == 5:      # fields in reverse order
            payload = b"".join(reversed([f.SerializeToString() for f in _fields(classes[v], payload)]))
        values.append(_framed(v, payload))
    values += [b"\0\0\0\0\x01\x01\x08\x01",          # a message index other than the first
               _framed(1, bytes([0x72, 2, 0xff, 0xfe])), _framed(1, bytes([0x0b, 0x0c])),   # bad UTF-8; a group
               _framed(1, bytes([0x72, 2, 0xff, 0xfe, 0x72, 1, 0x41])),  # bad UTF-8, then a good string
               _framed(1, b"\x08\x80\x80\x80\x80\x10"),  # an int32 given past 32 bits: protobuf truncates it
               _framed(1, b"\x40\x05"),                  # fixed32 f32 as a varint: protobuf keeps it as unknown
               _framed(1, b"\x90\x80\x80\x80\x80\x00\x05"),  # a tag in 6 bytes: protobuf refuses it
               _framed(1, b"\x72\x83\x80\x80\x80\x80\x00abc"),  # a length in 7 bytes: likewise
               b"plain", None, b"\0\0\0\0\x07\0"]
    got = _same(read, values)
    errors = [e for e in got.error.to_pylist() if e is not None]
    assert any("does not fit the read schema" in e for e in errors) and any("DecodeError" in e for e in errors)


def test_protobuf_random_wire_tokens_agree_with_protobuf() -> None:
    """Fields of every number and wire type, nested, over-long varints, cut short: whatever the
    walk reads it reads as protobuf does, and the rest gets protobuf's own answer."""
    read, _ = _proto_read()
    rng = random.Random(5)

    def varint(v: int, padding: int = 0) -> bytes:
        v &= (1 << 64) - 1
        out = bytearray()
        while v >= 0x80:
            out.append(v & 0x7F | 0x80)
            v >>= 7
        out.append(v)
        for _ in range(padding):            # the same value in more bytes
            out[-1] |= 0x80
            out.append(0)
        return bytes(out)

    def token(depth: int) -> bytes:
        number = rng.choice([*range(1, 22), 99, 0, 2**29 - 1])
        wire = rng.choice([0, 0, 1, 2, 2, 5, 3, 4, 6])
        body = varint(rng.choice([0, 1, 2, -1, 2**31, 2**32, 2**63, -2**31, rng.randrange(2**64)]),
                      rng.choice([0] * 10 + [1, 3])) if wire == 0 else rng.randbytes({1: 8, 5: 4}.get(wire, 0))
        if wire == 2:
            inner = b"".join(token(depth + 1) for _ in range(rng.randint(0, 3))) if depth < 3 and rng.random() < 0.5 \
                else rng.choice([b"", b"abc", "é".encode(), b"\xff", rng.randbytes(3)])
            body = varint(len(inner), rng.choice([0] * 10 + [1, 5])) + inner
        out = varint(number << 3 | wire, rng.choice([0] * 20 + [1, 4, 5])) + body
        return out[:rng.randrange(len(out) + 1)] if rng.random() < 0.03 else out

    values = [_framed(rng.choice([1, 2]), b"".join(token(0) for _ in range(rng.randint(0, 6)))) for _ in range(3000)]
    for at in range(0, len(values), 500):
        got = _same(read, values[at:at + 500])
        assert 0 < got.error.null_count < 500      # both kinds in every chunk


def _fields(cls: Any, payload: bytes) -> list[Any]:
    """A message as one message per set field (their bytes joined are the message)."""
    m = cls.FromString(payload)
    out = []
    for f, value in m.ListFields():
        one = cls()
        if f.message_type is not None:
            getattr(one, f.name).CopyFrom(value)
        else:
            setattr(one, f.name, value)
        out.append(one)
    return out
