"""Typed reads' pure parts, without servers: registered schemas as columns (Avro, JSON Schema,
Protobuf), the merge of versions by field identity, Arrow types, a table's evolution, and the
decoding of a batch of framed values into the merged struct with each failure named."""

from __future__ import annotations

import base64
import io
import json

import fastavro
import numpy as np

import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from memq.errors import SchemaError
from spark_source.avro_walk import flat_plan, walk
from spark_source.typed_schema import (
    Change,
    Decimal,
    ListOf,
    MapOf,
    Struct,
    arrow_type,
    avro_columns,
    evolve,
    json_columns,
    merge,
    protobuf_columns,
    renames,
)
from spark_source.typed_values import ReadSchema, Writer, decode_values
from tests.support.typed_versions import INCOMPATIBLE, MERGED_COLUMNS, READ, VERSIONS, WRITTEN, avro_read_schema, framed


def test_avro_versions_merge_by_identity_a_renamed_field_stays_one_column_and_types_widen() -> None:
    read = avro_read_schema({7: INCOMPATIBLE})
    assert [c.name for c in read.root.columns] == MERGED_COLUMNS
    title = read.root.columns[1]
    assert title.names == ["title", "name"]                         # renamed by alias: one column
    assert read.arrow() == pa.struct([
        ("id", pa.int64()), ("title", pa.string()), ("amount", pa.float32()), ("note", pa.string()),
        ("address", pa.struct([("city", pa.string()), ("zip", pa.int32())]))])
    assert list(read.rejected) == [7] and "id: long → string is not a promotion" in read.rejected[7]


def test_avro_logical_types_enums_maps_arrays_and_unions() -> None:
    s = avro_columns(json.dumps({"type": "record", "name": "R", "fields": [
        {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}},
        {"name": "m", "type": {"type": "map", "values": "long"}},
        {"name": "a", "type": {"type": "array", "items": "E"}}]}))
    assert [c.type for c in s.fields] == [Decimal(9, 2), "timestamp", "string", MapOf("long"), ListOf("string")]
    with pytest.raises(SchemaError, match="union"):
        avro_columns(json.dumps({"type": "record", "name": "R", "fields": [{"name": "u", "type": ["int", "string"]}]}))
    def decimal(precision: int) -> Struct:
        return avro_columns(json.dumps({"type": "record", "name": "R", "fields": [{"name": "d", "type": {
            "type": "bytes", "logicalType": "decimal", "precision": precision, "scale": 2}}]}))
    wider = merge([(1, decimal(9)), (2, decimal(12))])
    assert wider.root.columns[0].type == Decimal(12, 2) and not wider.rejected
    assert arrow_type(wider.root.columns[0].type) == pa.decimal128(12, 2)


def test_protobuf_fields_are_identified_by_number_so_a_rename_is_one_column() -> None:
    def message(*fields: tuple[str, int, int]) -> Struct:
        fdp = descriptor_pb2.FileDescriptorProto(name=f"m{len(fields)}.proto", package="p", syntax="proto3")
        m = fdp.message_type.add(name="M")
        for name, number, typ in fields:
            m.field.add(name=name, number=number, type=typ, label=1)
        pool = descriptor_pool.DescriptorPool()
        pool.Add(fdp)
        return protobuf_columns(pool.FindMessageTypeByName("p.M"))
    F = descriptor_pb2.FieldDescriptorProto
    merged = merge([(1, message(("id", 1, F.TYPE_INT32), ("name", 2, F.TYPE_STRING))),
                    (2, message(("id", 1, F.TYPE_INT64), ("title", 2, F.TYPE_STRING), ("n", 3, F.TYPE_DOUBLE)))])
    assert [(c.names, c.type, c.number) for c in merged.root.columns] == [
        (["id"], "long", 1), (["title", "name"], "string", 2), (["n"], "double", 3)]


def test_json_schema_properties_are_columns() -> None:
    s = json_columns(json.dumps({"type": "object", "properties": {
        "id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
        "where": {"$ref": "#/definitions/P"}, "x": {"type": ["null", "number"]}},
        "definitions": {"P": {"type": "object", "properties": {"lat": {"type": "number"}}}}}))
    assert arrow_type(merge([(1, s)]).root) == pa.struct([
        ("id", pa.int64()), ("tags", pa.list_(pa.string())), ("where", pa.struct([("lat", pa.float64())])),
        ("x", pa.float64())])


def test_a_batch_of_every_version_decodes_into_the_merged_columns_and_bad_values_are_named() -> None:
    read = avro_read_schema({7: INCOMPATIBLE})
    values = [framed(v, VERSIONS[v], WRITTEN[v]) for v in VERSIONS]
    values += [framed(7, INCOMPATIBLE, {"id": "x", "title": "t", "note": None, "address": None}),
               b"not framed", b"\0\0\0\0\x01\xff\xff", b"\0\0\0\0\x63abc", None]
    got = decode_values(read, pa.array(values, pa.binary()))
    assert got.value.to_pylist()[:6] == [READ[v] for v in VERSIONS]
    assert got.schema_id.to_pylist() == [1, 2, 3, 4, 5, 6, 7, None, 1, 99, None]
    errors = got.error.to_pylist()
    assert errors[:6] == [None] * 6 and errors[10] is None
    assert "schema id 7: incompatible with the read schema: field id" in errors[6]
    assert errors[7] == "not framed: no magic byte 0 and schema id"
    assert errors[8].startswith("schema id 1: does not decode")
    assert errors[9] == "schema id 99 is not a version of subject orders-value the read knows"
    assert got.value.to_pylist()[6:] == [None] * 5


def test_protobuf_and_json_values_decode() -> None:
    fdp = descriptor_pb2.FileDescriptorProto(name="o.proto", package="p", syntax="proto3")
    m = fdp.message_type.add(name="O")
    F = descriptor_pb2.FieldDescriptorProto
    m.field.add(name="id", number=1, type=F.TYPE_INT64, label=1)
    m.field.add(name="tags", number=2, type=F.TYPE_STRING, label=3)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    desc = pool.FindMessageTypeByName("p.O")
    struct = protobuf_columns(desc)
    merged = merge([(1, struct)])
    proto = Writer(1, "PROTOBUF", base64.standard_b64encode(fdp.SerializeToString()).decode(),
                   renames(merged.root, struct))
    read = ReadSchema("p-value", merged.root, {1: proto}, {}, {1: 1})
    msg = message_factory.GetMessageClass(desc)(id=7, tags=["a", "b"])
    got = decode_values(read, pa.array([b"\0\0\0\0\x01\0" + msg.SerializeToString()], pa.binary()))
    assert got.value.to_pylist() == [{"id": 7, "tags": ["a", "b"]}] and got.error.to_pylist() == [None]
    js = json_columns(json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}}))
    jm = merge([(2, js)])
    jread = ReadSchema("j-value", jm.root, {2: Writer(2, "JSON", "{}", renames(jm.root, js))}, {}, {2: 1})
    got = decode_values(jread, pa.array([b"\0\0\0\0\x02" + b'{"id": 5}', b"\0\0\0\0\x02" + b'{"id": "five"}'], pa.binary()))
    assert got.value.to_pylist() == [{"id": 5}, None]
    assert got.error.to_pylist()[0] is None and "does not fit the read schema" in got.error.to_pylist()[1]


def test_a_tables_columns_evolve_by_identity_renames_promotions_and_additions() -> None:
    read = avro_read_schema()
    table = {"id": "int", "name": "string", "amount": "float"}          # the table as version 1 made it
    assert list(evolve(table, read.root)) == [
        Change("promote", ("id",), "long"), Change("rename", ("name",), "title"),
        Change("add", ("note",), "string"), Change("add", ("address",), read.root.columns[4].type)]
    now = {"id": "long", "title": "string", "amount": "float", "note": "string",
           "address": {"city": "string", "zip": "int"}}
    assert list(evolve(now, read.root)) == []


def test_the_compiled_walk_reads_flat_records_and_marks_every_kind_of_bad_one() -> None:
    schema = {"type": "record", "name": "F", "fields": [
        {"name": "b", "type": "boolean"}, {"name": "i", "type": "int"}, {"name": "l", "type": ["long", "null"]},
        {"name": "f", "type": "float"}, {"name": "d", "type": "double"}, {"name": "s", "type": ["null", "string"]},
        {"name": "y", "type": "bytes"}]}
    plan = flat_plan(json.dumps(schema))
    assert plan is not None
    parsed = fastavro.parse_schema(schema)

    def encode(record: dict) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, record)
        return buf.getvalue()
    good = [{"b": i % 2 == 0, "i": -i, "l": None if i == 1 else -(2**40) * i, "f": 0.25 * i, "d": 1e300 / (i + 1),
             "s": None if i == 2 else f"s{i}é", "y": bytes([i] * i)} for i in range(4)]
    bad = [encode(good[0]) + b"\0",                                      # a byte left over
           encode(good[0])[:-1],                                         # cut short
           b"\x00\x80\x80\x80\x80\x20",                                  # an int past 32 bits
           encode(good[0]).replace(b"s0\xc3\xa9", b"s0\xff\xfe"),        # a string that is not UTF-8
           b"\x02" + encode(good[0])[1:]]                                # a boolean byte of 2
    data = [encode(r) for r in good] + bad
    offsets = np.cumsum([0] + [len(d) for d in data])
    fields, ok = walk(plan, b"".join(data), offsets[:-1], offsets[1:])
    assert ok.tolist() == [True] * 4 + [False] * 5
    got = [{k: fields[k][i].as_py() for k in fields} for i in range(4)]
    assert got == [{**r, "f": pytest.approx(r["f"]), "d": pytest.approx(r["d"])} for r in good]
    assert all(fields[k][i].as_py() is None for k in fields for i in range(4, 9))


def test_nested_records_are_walked_into_structs_null_where_the_record_is() -> None:
    inner = {"type": "record", "name": "In", "fields": [{"name": "x", "type": "long"},
                                                        {"name": "s", "type": ["null", "string"]}]}
    schema = {"type": "record", "name": "N", "fields": [
        {"name": "id", "type": "int"},
        {"name": "opt", "type": ["null", {"type": "record", "name": "Mid", "fields": [
            {"name": "deep", "type": inner}, {"name": "f", "type": "double"}]}]},
        {"name": "tail", "type": "string"}]}
    plan = flat_plan(json.dumps(schema))
    assert plan is not None and plan.names == ("id", "opt", "deep", "x", "s", "f", "tail")
    assert flat_plan(VERSIONS[6]) is not None                             # the subject's nested version too
    assert flat_plan(json.dumps({**schema, "fields": [{"name": "e", "type": "In"}]})) is None   # a named reference
    parsed = fastavro.parse_schema(schema)
    records = [{"id": i, "opt": None if i % 3 == 0 else {"deep": {"x": -i, "s": None if i % 2 else f"s{i}"},
                                                         "f": i / 4}, "tail": f"t{i}"} for i in range(7)]
    data = []
    for r in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, r)
        data.append(buf.getvalue())
    data.append(data[1][:-2])                                             # cut inside the nested record's tail
    offsets = np.cumsum([0] + [len(d) for d in data])
    fields, ok = walk(plan, b"".join(data), offsets[:-1], offsets[1:])
    assert ok.tolist() == [True] * 7 + [False]
    assert pa.StructArray.from_arrays(list(fields.values()), names=list(fields)).to_pylist() == \
        records + [{"id": None, "opt": None, "tail": None}]
