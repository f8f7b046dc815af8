"""memq.schema.check: which records of a batch fail a topic's schema checks, over a registry in
memory: valid ones pass; no magic byte, truncated, an unknown id, another subject's id, and
payloads that do not decode (in each format) fail, each naming why."""

from __future__ import annotations

import io
import json
import sys

import fastavro
import pytest

from memq.config import TopicConfig
from memq.format import LogMessage
from memq.schema.check import Checker, frame, message_indexes, subject_for
from memq.schema.service import SchemaRegistry
from memq.schema.store import MemorySchemaStore
from tests.support.schemas import order_message_class

AVRO = {"type": "record", "name": "Order", "namespace": "shop",
        "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}]}
JSON_SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "item": {"type": "string", "maxLength": 8}},
               "required": ["id"], "additionalProperties": False}
PROTO = 'syntax = "proto3";\npackage shop;\nmessage Order { int64 id = 1; string item = 2; }\n'


def framed(schema_id: int, payload: bytes, indexes: bytes = b"") -> bytes:
    return b"\0" + schema_id.to_bytes(4, "big") + indexes + payload


def avro_bytes(value: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(AVRO), value)
    return buf.getvalue()


@pytest.fixture
def registry() -> SchemaRegistry:
    return SchemaRegistry(MemorySchemaStore())


def records(values: list[bytes | None]) -> list[LogMessage]:
    return [LogMessage(value=v) for v in values]   # type: ignore[arg-type]


def test_framing_indexes_and_subjects() -> None:
    assert frame(b"\0\0\0\0\x07rest")[0] == 7   # type: ignore[index]
    assert "magic" in frame(b"\x01\0\0\0\x07")   # type: ignore[operator]
    assert "truncated" in frame(b"\0\0\0")        # type: ignore[operator]
    assert "no data" in frame(None)               # type: ignore[operator]
    assert message_indexes(memoryview(b"\0abc"))[0] == (0,)
    assert message_indexes(memoryview(b"\x04\x02\x04xyz"))[0] == (1, 2)   # count 2 (zig-zag 4), then 1 and 2
    assert subject_for("TopicNameStrategy", "t", "value", "shop.Order") == "t-value"
    assert subject_for("RecordNameStrategy", "t", "value", "shop.Order") == "shop.Order"
    assert subject_for("TopicRecordNameStrategy", "t", "key", "shop.Order") == "t-shop.Order"


@pytest.mark.parametrize("fmt", ["AVRO", "JSON", "PROTOBUF"])
def test_a_mixed_batch_fails_exactly_its_bad_records(registry: SchemaRegistry, fmt: str) -> None:
    topic = f"orders-{fmt.lower()}"
    text = {"AVRO": json.dumps(AVRO), "JSON": json.dumps(JSON_SCHEMA), "PROTOBUF": PROTO}[fmt]
    sid = registry.register(f"{topic}-value", {"schema": text, "schemaType": fmt})["id"]
    other = registry.register("elsewhere-value", {"schema": json.dumps({"type": "string"})})["id"]
    idx = b"\0" if fmt == "PROTOBUF" else b""
    if fmt == "AVRO":
        good, wrong = avro_bytes({"id": 1, "item": "tea"}), avro_bytes({"id": 1, "item": "tea"})[:2]
    elif fmt == "JSON":
        good, wrong = json.dumps({"id": 1, "item": "tea"}).encode(), json.dumps({"id": "one"}).encode()
    else:
        good = order_message_class()(id=1, item="tea").SerializeToString()
        wrong = b"\x0a\xff"   # field 1 as a length-delimited field running past the end
    batch = [framed(sid, good), framed(sid, good + b"\0" if fmt == "AVRO" else wrong), framed(999, good),
             framed(other, good), good, framed(sid, good)[:3], None, framed(sid, wrong)]
    batch = [b if b is None or i in (4, 5, 6) else b[:5] + idx + b[5:] for i, b in enumerate(batch)]
    cfg = TopicConfig(topic, value_schema_validation=True)
    failures = Checker(registry).check(topic, cfg, records(batch))
    assert [f.index for f in failures] == [1, 2, 3, 4, 5, 6, 7], failures
    why = {f.index: f.reason for f in failures}
    assert "unknown schema id 999" in why[2] and f"not registered under subject {topic}-value" in why[3]
    assert "magic" in why[4] and "truncated" in why[5] and "no data" in why[6]
    if fmt == "JSON":
        assert "/id" in why[7]   # the field is named
    assert Checker(registry).check(topic, TopicConfig(topic), records(batch)) == []   # no checks asked


def test_keys_and_record_name_strategy(registry: SchemaRegistry) -> None:
    sid = registry.register("shop.Order", {"schema": json.dumps(AVRO)})["id"]
    cfg = TopicConfig("t", key_schema_validation=True, key_subject_name_strategy="RecordNameStrategy")
    ok = LogMessage(value=b"anything", key=framed(sid, avro_bytes({"id": 2, "item": "x"})))
    bad = LogMessage(value=b"anything", key=b"plain key")
    assert [f.part for f in Checker(registry).check("t", cfg, [ok, bad])] == ["key"]


def test_json_checks_a_group_at_once_and_means_what_the_schema_alone_means(registry: SchemaRegistry) -> None:
    """The JSON decoder validates a group of documents as one array; a schema whose `$ref`s point
    into its root (where wrapping would move them) is validated document by document, and both
    fail exactly the documents the schema alone fails."""
    from memq.schema.check import _refs_stay
    with_defs = {"$defs": {"id": {"type": "integer", "minimum": 1}}, "type": "object",
                 "properties": {"id": {"$ref": "#/$defs/id"}}, "required": ["id"]}
    into_root = {"type": "object", "properties": {"id": {"type": "integer"}, "copy": {"$ref": "#/properties/id"}}}
    assert _refs_stay(with_defs) and not _refs_stay(into_root)
    for n, schema in enumerate((with_defs, into_root)):
        topic = f"j{n}"
        sid = registry.register(f"{topic}-value", {"schema": json.dumps(schema), "schemaType": "JSON"})["id"]
        values = [json.dumps(d).encode() for d in ({"id": 3}, {"id": 0}, {"id": 2, "copy": "x"}, {"id": 5}, [1])]
        cfg = TopicConfig(topic, value_schema_validation=True)
        failures = Checker(registry).check(topic, cfg, records([framed(sid, v) for v in values]))
        expected = [1, 4] if n == 0 else [2, 4]
        assert [f.index for f in failures] == expected, failures
        if n == 1:
            assert "/copy" in failures[0].reason


def test_protobuf_groups_records_by_their_message_indexes(registry: SchemaRegistry) -> None:
    text = ('syntax = "proto3";\npackage shop;\nmessage Order { int64 id = 1; string item = 2; }\n'
            'message Refund { string why = 1; }\n')
    sid = registry.register("p-value", {"schema": text, "schemaType": "PROTOBUF"})["id"]
    order = order_message_class()(id=1, item="tea").SerializeToString()
    batch = [framed(sid, order, b"\0"), framed(sid, b"\x0a\x03why", b"\x02\x02"),   # Refund: indexes [1]
             framed(sid, order, b"\x02\x00"),                                      # [0] written long-hand
             framed(sid, b"\x0a\xff", b"\x02\x02"), framed(sid, order, b"\x02\x04"),   # broken Refund; no message 2
             framed(sid, order, b"\x03")]                                          # a count that is negative
    failures = Checker(registry).check("p", TopicConfig("p", value_schema_validation=True), records(batch))
    assert [f.index for f in failures] == [3, 4, 5], failures
    assert "shop.Refund" in failures[0].reason and "name no message" in failures[1].reason


def test_checks_read_fields_as_the_kafka_door_passes_them(registry: SchemaRegistry) -> None:
    from memq.format.kafka_records import encode_kafka_batch, kafka_fields
    from memq.schema.check import Fields
    sid = registry.register("f-value", {"schema": json.dumps(AVRO)})["id"]
    good = framed(sid, avro_bytes({"id": 1, "item": "tea"}))
    batch = encode_kafka_batch([LogMessage(good, b"k", (("h", b"v"),)), LogMessage(b"bad", None)])
    fields = kafka_fields(batch)
    assert fields.keys == [b"k", None] and fields.values == [good, b"bad"]
    failures = Checker(registry).check("f", TopicConfig("f", value_schema_validation=True), Fields(*fields))
    assert [(f.index, "magic" in f.reason) for f in failures] == [(1, True)]


@pytest.mark.parametrize("numba", [True, False])
def test_avro_groups_fail_the_same_records_with_the_walk_and_without_numba(
        registry: SchemaRegistry, numba: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group large enough for the compiled walk, and the same where numba is not installed (the
    broker role): fastavro's verdicts and reasons either way."""
    if not numba:
        import memq.schema
        monkeypatch.setitem(sys.modules, "memq.schema.avro_walk", None)   # its import fails
        monkeypatch.delattr(memq.schema, "avro_walk", raising=False)
    sid = registry.register("walked-value", {"schema": json.dumps(AVRO)})["id"]
    good = [framed(sid, avro_bytes({"id": i, "item": f"item-{i}"})) for i in range(40)]
    bad = {3: good[3][:-1], 17: good[17] + b"\0", 29: framed(sid, b"\x02\x10\xff\xfe")}   # truncated, extra, not UTF-8
    batch = [bad.get(i, v) for i, v in enumerate(good)]
    failures = Checker(registry).check("walked", TopicConfig("walked", value_schema_validation=True), records(batch))
    assert [f.index for f in failures] == sorted(bad)
    assert "does not decode as Avro" in failures[0].reason and "1 bytes after the Avro record" in failures[1].reason
    assert "does not decode as Avro" in failures[2].reason
