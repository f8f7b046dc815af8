"""The pure schema rules: Avro and JSON Schema parsing and the seven compatibility modes, by
tables of evolutions with the answers Confluent's registry gives."""

from __future__ import annotations

import json

import pytest

from memq.errors import SchemaError
from memq.schema import avro, jsonschema_rules
from memq.schema.compat import FORMATS, Earlier, check
from memq.schema.model import MODES


def rec(*fields: dict, name: str = "User") -> str:
    return json.dumps({"type": "record", "name": name, "namespace": "ex", "fields": list(fields)})


def enum(*symbols: str, default: str | None = None) -> str:
    e: dict = {"type": "enum", "name": "Color", "symbols": list(symbols)}
    if default:
        e["default"] = default
    return rec({"name": "c", "type": e})


A = {"name": "a", "type": "int"}
B_DEFAULT = {"name": "b", "type": "string", "default": ""}
B = {"name": "b", "type": "string"}
OK, NO = True, False

# (case, versions oldest first, then the new one; {mode: compatible?} for the modes that differ from
# its base mode's answer; BACKWARD/FORWARD/FULL given, the TRANSITIVE ones equal to them unless listed)
AVRO_CASES = [
    ("optional field added", [rec(A), rec(A, B_DEFAULT)], {"BACKWARD": OK, "FORWARD": OK, "FULL": OK}),
    ("field without default added", [rec(A), rec(A, B)], {"BACKWARD": NO, "FORWARD": OK, "FULL": NO}),
    ("field with default removed", [rec(A, B_DEFAULT), rec(A)], {"BACKWARD": OK, "FORWARD": OK, "FULL": OK}),
    ("field without default removed", [rec(A, B), rec(A)], {"BACKWARD": OK, "FORWARD": NO, "FULL": NO}),
    ("int promoted to long", [rec(A), rec({"name": "a", "type": "long"})],
     {"BACKWARD": OK, "FORWARD": NO, "FULL": NO}),
    ("int changed to string", [rec(A), rec({"name": "a", "type": "string"})],
     {"BACKWARD": NO, "FORWARD": NO, "FULL": NO}),
    ("string to bytes", [rec(B), rec({"name": "b", "type": "bytes"})], {"BACKWARD": OK, "FORWARD": OK, "FULL": OK}),
    ("enum symbol added", [enum("R", "G"), enum("R", "G", "B")], {"BACKWARD": OK, "FORWARD": NO, "FULL": NO}),
    ("enum symbol removed", [enum("R", "G"), enum("R")], {"BACKWARD": NO, "FORWARD": OK, "FULL": NO}),
    ("enum symbol added, with a default", [enum("R", "G", default="R"), enum("R", "G", "B", default="R")],
     {"BACKWARD": OK, "FORWARD": OK, "FULL": OK}),
    ("field renamed with an alias", [rec(A), rec({"name": "z", "type": "int", "aliases": ["a"]})],
     {"BACKWARD": OK, "FORWARD": NO, "FULL": NO}),
    ("field made nullable (union)", [rec(A), rec({"name": "a", "type": ["null", "int"]})],
     {"BACKWARD": OK, "FORWARD": NO, "FULL": NO}),
    ("record renamed", [rec(A), rec(A, name="Person")], {"BACKWARD": NO, "FORWARD": NO, "FULL": NO}),
    ("record renamed with an alias",
     [rec(A), json.dumps({**json.loads(rec(A, name="Person")), "aliases": ["User"]})],
     {"BACKWARD": OK, "FORWARD": NO, "FULL": NO}),
    ("fixed size changed", [rec({"name": "f", "type": {"type": "fixed", "name": "H", "size": 16}}),
                            rec({"name": "f", "type": {"type": "fixed", "name": "H", "size": 32}})],
     {"BACKWARD": NO, "FORWARD": NO, "FULL": NO}),
    # v1 -> v2 adds b with a default, v3 drops the default: v3 reads v2 but not v1
    ("v1 -> v2 -> v3 chain", [rec(A), rec(A, B_DEFAULT), rec(A, B)],
     {"BACKWARD": OK, "BACKWARD_TRANSITIVE": NO, "FORWARD": OK, "FULL": OK, "FULL_TRANSITIVE": NO}),
    # v1 -> v2 removes b (it had no default), v3 adds it back with a default: forward refuses only v1
    ("v1 -> v2 -> v3 forward chain", [rec(A, B), rec(A, B_DEFAULT), rec(A)],
     {"BACKWARD": OK, "FORWARD": OK, "FORWARD_TRANSITIVE": NO, "FULL": OK, "FULL_TRANSITIVE": NO}),
]


def _expected(answers: dict[str, bool], mode: str) -> bool:
    if mode == "NONE":
        return True
    return answers.get(mode, answers.get(mode.removesuffix("_TRANSITIVE")))


def _matrix(fmt_name: str, cases: list) -> list:
    return [pytest.param(fmt_name, versions, mode, _expected(answers, mode), id=f"{case}-{mode}")
            for case, versions, answers in cases for mode in MODES]


def _check(fmt_name: str, versions: list[str], mode: str) -> list[str]:
    fmt = FORMATS[fmt_name]
    *old, new = versions
    earlier = [Earlier(i + 1, fmt.parse(t, ()), t) for i, t in enumerate(old)]
    return check(fmt, fmt.parse(new, ()), earlier, mode)


@pytest.mark.parametrize(("fmt_name", "versions", "mode", "compatible"), _matrix("AVRO", AVRO_CASES))
def test_avro_compatibility_matrix(fmt_name: str, versions: list[str], mode: str, compatible: bool) -> None:
    reasons = _check(fmt_name, versions, mode)
    assert (not reasons) == compatible, reasons


def test_avro_reasons_as_confluent_words_them() -> None:
    reasons = _check("AVRO", [rec(A), rec(A, B)], "BACKWARD")
    assert reasons[0].startswith("{errorType:'READER_FIELD_MISSING_DEFAULT_VALUE'")
    assert "'/fields/1'" in reasons[0] and "additionalInfo:'b'" in reasons[0]
    assert reasons[1:] == ["{oldSchemaVersion: 1}", f"{{oldSchema: '{rec(A)}'}}", "{compatibility: 'BACKWARD'}"]
    reasons = _check("AVRO", [enum("R", "G"), enum("R")], "BACKWARD")
    assert "MISSING_ENUM_SYMBOLS" in reasons[0] and "[G]" in reasons[0]


@pytest.mark.parametrize("text", [
    "{", '"nosuchtype"', '{"type": "record", "name": "R"}', '{"type": "record", "name": "R", "fields": [{"name": "a"}]}',
    '{"type": "enum", "name": "E", "symbols": ["A", "A"]}', '{"type": "fixed", "name": "F"}',
    '["int", "int"]', '{"type": "record", "name": "1R", "fields": []}',
    '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "Other"}]}',
])
def test_avro_invalid_schemas_are_42201(text: str) -> None:
    with pytest.raises(SchemaError) as e:
        avro.parse(text)
    assert e.value.code == 42201 and e.value.status == 422


def test_avro_references_recursion_and_texts() -> None:
    address = avro.parse(json.dumps({"type": "record", "name": "Address", "namespace": "ex",
                                     "fields": [{"name": "city", "type": "string"}]}))
    text = '{"type": "record", "name": "User", "namespace": "ex", "fields": [{"name": "home", "type": "Address"},' \
           ' {"name": "next", "type": ["null", "User"], "default": null}]}'
    user = avro.parse(text, [address])
    assert user.canonical() == text.replace(", ", ",").replace(": ", ":")
    normalized = json.loads(user.normalized())
    assert normalized["name"] == "ex.User" and "namespace" not in normalized
    assert normalized["fields"][0]["type"] == "ex.Address"
    assert avro.compatibility(user, user) == []    # a recursive record is compatible with itself
    with pytest.raises(SchemaError):
        avro.parse(text)                           # Address unknown without the reference


def obj(props: dict, required: tuple = (), closed: bool = False) -> str:
    s: dict = {"type": "object", "properties": props}
    if required:
        s["required"] = list(required)
    if closed:
        s["additionalProperties"] = False
    return json.dumps(s)


S, N, INT = {"type": "string"}, {"type": "number"}, {"type": "integer"}
JSON_CASES = [
    ("optional property added to a closed model", [obj({"a": S}, closed=True), obj({"a": S, "b": S}, closed=True)],
     {"BACKWARD": OK, "FORWARD": NO, "FULL": NO}),
    ("optional property added to an open model", [obj({"a": S}), obj({"a": S, "b": S})],
     {"BACKWARD": NO, "FORWARD": OK, "FULL": NO}),
    ("property removed from an open model", [obj({"a": S, "b": S}), obj({"a": S})],
     {"BACKWARD": OK, "FORWARD": NO, "FULL": NO}),
    ("property removed from a closed model", [obj({"a": S, "b": S}, closed=True), obj({"a": S}, closed=True)],
     {"BACKWARD": NO, "FORWARD": OK, "FULL": NO}),
    ("integer widened to number", [obj({"a": INT}), obj({"a": N})], {"BACKWARD": OK, "FORWARD": NO, "FULL": NO}),
    ("string changed to number", [obj({"a": S}), obj({"a": N})], {"BACKWARD": NO, "FORWARD": NO, "FULL": NO}),
    ("enum extended", [obj({"c": {"enum": ["R", "G"]}}), obj({"c": {"enum": ["R", "G", "B"]}})],
     {"BACKWARD": OK, "FORWARD": NO, "FULL": NO}),
    ("maxLength added", [obj({"a": S}), obj({"a": {"type": "string", "maxLength": 4}})],
     {"BACKWARD": NO, "FORWARD": OK, "FULL": NO}),
    ("property made required", [obj({"a": S}), obj({"a": S}, required=("a",))],
     {"BACKWARD": NO, "FORWARD": OK, "FULL": NO}),
    ("v1 -> v2 -> v3 chain", [obj({"a": {"type": "string"}}), obj({"a": {"type": "string", "maxLength": 9}}),
                              obj({"a": {"type": "string", "maxLength": 8}})],
     {"BACKWARD": NO, "FORWARD": OK, "FORWARD_TRANSITIVE": OK, "FULL": NO}),
    ("closed model opened", [obj({"a": S}, closed=True), obj({"a": S})],
     {"BACKWARD": OK, "FORWARD": NO, "FULL": NO}),
]


@pytest.mark.parametrize(("fmt_name", "versions", "mode", "compatible"), _matrix("JSON", JSON_CASES))
def test_json_schema_compatibility_matrix(fmt_name: str, versions: list[str], mode: str, compatible: bool) -> None:
    reasons = _check(fmt_name, versions, mode)
    assert (not reasons) == compatible, reasons


def test_json_schema_invalid_and_references() -> None:
    with pytest.raises(SchemaError) as e:
        jsonschema_rules.parse('{"type": "nosuch"}')
    assert e.value.code == 42201
    address = jsonschema_rules.named(jsonschema_rules.parse(obj({"city": S})), "address.json")
    v1 = jsonschema_rules.parse(obj({"home": {"$ref": "address.json"}}), [address])
    v2 = jsonschema_rules.parse(obj({"home": {"$ref": "#/definitions/A"}}) [:-1]
                                + ', "definitions": {"A": ' + obj({"city": N}) + "}}")
    assert jsonschema_rules.compatibility(v1, v1) == []
    assert any("TYPE_CHANGED" in r for r in jsonschema_rules.compatibility(v2, v1))


def proto(body: str, package: str = "shop") -> str:
    return f'syntax = "proto3";\npackage {package};\n{body}\n'


ORDER = "message Order { int64 id = 1; string item = 2; }"
PROTOBUF_CASES = [
    ("field added", [proto(ORDER), proto("message Order { int64 id = 1; string item = 2; int32 qty = 3; }")],
     {"BACKWARD": OK, "FORWARD": OK, "FULL": OK}),
    ("field removed", [proto(ORDER), proto("message Order { int64 id = 1; }")],
     {"BACKWARD": OK, "FORWARD": OK, "FULL": OK}),
    ("field renamed", [proto(ORDER), proto("message Order { int64 id = 1; string name = 2; }")],
     {"BACKWARD": OK, "FORWARD": OK, "FULL": OK}),
    ("int32 widened to int64", [proto("message Order { int32 id = 1; }"), proto("message Order { int64 id = 1; }")],
     {"BACKWARD": OK, "FORWARD": OK, "FULL": OK}),
    ("scalar kind changed", [proto(ORDER), proto("message Order { int64 id = 1; double item = 2; }")],
     {"BACKWARD": NO, "FORWARD": NO, "FULL": NO}),
    ("scalar became a message", [proto(ORDER), proto("message Item { string sku = 1; }\n"
                                                     "message Order { int64 id = 1; Item item = 2; }")],
     {"BACKWARD": NO, "FORWARD": NO, "FULL": NO}),
    ("message added", [proto(ORDER), proto(ORDER + "\nmessage Refund { int64 id = 1; }")],
     {"BACKWARD": OK, "FORWARD": NO, "FULL": NO}),
    ("package changed", [proto(ORDER), proto(ORDER, package="store")], {"BACKWARD": NO, "FORWARD": NO, "FULL": NO}),
    ("enum value added", [proto("enum Color { RED = 0; }\nmessage Order { Color c = 1; }"),
                          proto("enum Color { RED = 0; BLUE = 1; }\nmessage Order { Color c = 1; }")],
     {"BACKWARD": OK, "FORWARD": OK, "FULL": OK}),
    ("fields moved into a oneof", [proto(ORDER), proto("message Order { oneof k { int64 id = 1; string item = 2; } }")],
     {"BACKWARD": NO, "FORWARD": OK, "FULL": NO}),
    # v1 -> v2 adds a message, v3 drops another: v3 keeps v2's, so only the transitive forward check sees v1's
    ("v1 -> v2 -> v3 chain", [proto(ORDER + "\nmessage Old { int64 id = 1; }"),
                              proto(ORDER + "\nmessage Old { int64 id = 1; }\nmessage New { int64 id = 1; }"),
                              proto(ORDER + "\nmessage New { int64 id = 1; }")],
     {"BACKWARD": NO, "FORWARD": OK, "FORWARD_TRANSITIVE": NO, "FULL": NO}),
]


@pytest.mark.parametrize(("fmt_name", "versions", "mode", "compatible"), _matrix("PROTOBUF", PROTOBUF_CASES))
def test_protobuf_compatibility_matrix(fmt_name: str, versions: list[str], mode: str, compatible: bool) -> None:
    reasons = _check(fmt_name, versions, mode)
    assert (not reasons) == compatible, reasons


def test_protobuf_text_descriptors_maps_imports_and_invalid() -> None:
    from google.protobuf import timestamp_pb2  # noqa: F401  (a well-known type, imported by name)

    from memq.schema import protobuf_rules

    text = proto('import "google/protobuf/timestamp.proto";\nmessage Order { int64 id = 1; '
                 'map<string, int32> counts = 2; optional string note = 3; google.protobuf.Timestamp at = 4; }')
    parsed = protobuf_rules.parse(text)
    order = parsed.messages()["shop.Order"]
    assert [f.name for f in order.fields] == ["id", "counts", "note", "at"]
    as_descriptor = protobuf_rules.parse(parsed.serialized())        # what confluent-kafka's serializer sends
    assert protobuf_rules.compatibility(as_descriptor, parsed) == [] and as_descriptor.serialized() == parsed.serialized()
    item = protobuf_rules.named(protobuf_rules.parse(proto("message Item { string sku = 1; }")), "item.proto")
    uses = protobuf_rules.parse(proto('import "item.proto";\nmessage Order { Item item = 1; }'), [item])
    assert uses.messages()["shop.Order"].fields[0].message_type.full_name == "shop.Item"
    for bad in (proto("message Order { Nope x = 1; }"), proto("message Order { int64 id = 1"), "}{"):
        with pytest.raises(SchemaError) as e:
            protobuf_rules.parse(bad)
        assert e.value.code == 42201
