"""A typed sync's micro-batch split into table rows and dead letters, and a table's columns as
the evolution plan sees them, without servers."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pytest

pytest.importorskip("pyiceberg")
from pyiceberg.schema import Schema  # noqa: E402
from pyiceberg.types import DecimalType, IntegerType, NestedField, StringType, StructType  # noqa: E402

from memq.errors import SchemaChangedError  # noqa: E402
from spark_source.iceberg_typed import COLLECTED, DLQ_SCHEMA, evolve_table, split_typed, table_columns  # noqa: E402
from spark_source.typed_schema import avro_columns, merge, renames  # noqa: E402
from spark_source.typed_values import ReadSchema, Writer, decode_values  # noqa: E402
from tests.support.typed_versions import READ, VERSIONS, WRITTEN, avro_read_schema, framed  # noqa: E402


def batch(values: list[bytes]) -> pa.Table:
    read = avro_read_schema()
    decoded = decode_values(read, pa.array(values, pa.binary()))
    n = len(values)
    meta = {"key": pa.array([b"k%d" % i for i in range(n)]), "topic": pa.array(["t"] * n),
            "partition": pa.array([0] * n, pa.int32()), "offset": pa.array(range(n), pa.int64()),
            "index": pa.array([0] * n, pa.int32()),
            "timestamp": pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)] * n, pa.timestamp("us", "UTC")),
            "headers": pa.nulls(n, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
            "producerId": pa.array([1] * n, pa.int64()), "value": decoded.value,
            "valueSchemaId": decoded.schema_id, "valueError": decoded.error, "rawValue": pa.array(values)}
    return pa.table({c: meta[c] for c in COLLECTED})


def test_good_values_become_columns_and_bad_ones_dead_letters_with_their_place() -> None:
    rows, letters = split_typed(batch([framed(v, VERSIONS[v], WRITTEN[v]) for v in VERSIONS] + [b"junk"]),
                                avro_read_schema())
    assert rows.column_names[-5:] == ["id", "title", "amount", "note", "address"]
    assert [{c: r[c] for c in READ[1]} for r in rows.to_pylist()] == [READ[v] for v in VERSIONS]
    assert letters.schema == DLQ_SCHEMA
    assert letters.to_pylist()[0] | {"timestamp": None} == {
        "key": b"k6", "value": b"junk", "error": "not framed: no magic byte 0 and schema id", "schemaId": None,
        "topic": "t", "partition": 0, "offset": 6, "index": 0, "timestamp": None}


def test_a_schema_id_registered_after_the_sync_started_restarts_it_instead_of_dead_lettering() -> None:
    with pytest.raises(SchemaChangedError, match=r"schema id\(s\) \[42\]"):
        split_typed(batch([framed(42, VERSIONS[1], WRITTEN[1])]), avro_read_schema())


def test_table_columns_as_the_evolution_plan_reads_them() -> None:
    schema = Schema(NestedField(1, "key", StringType()), NestedField(2, "id", IntegerType()),
                    NestedField(3, "price", DecimalType(9, 2)),
                    NestedField(4, "address", StructType(NestedField(5, "zip", IntegerType()))))
    assert table_columns(schema.as_struct(), frozenset({"key"})) == {
        "id": "int", "price": "decimal(9,2)", "address": {"zip": "int"}}


def test_a_table_evolves_in_place_a_nested_rename_keeps_its_field_id(tmp_path: Path) -> None:
    from pyiceberg.catalog import load_catalog

    def avro(*address: dict) -> str:
        return json.dumps({"type": "record", "name": "O", "fields": [
            {"name": "id", "type": "int"},
            {"name": "address", "type": {"type": "record", "name": "A", "fields": list(address)}}]})
    v1 = avro({"name": "zip", "type": "int"})
    v2 = avro({"name": "postcode", "type": "long", "aliases": ["zip"]}, {"name": "city", "type": ["null", "string"]})
    structs = [(1, avro_columns(v1)), (2, avro_columns(v2))]
    merged = merge(structs)
    read = ReadSchema("o-value", merged.root, {sid: Writer(sid, "AVRO", t, renames(merged.root, s))
                                               for (sid, s), t in zip(structs, (v1, v2))}, {}, {1: 1, 2: 2})
    catalog = load_catalog("t", type="sql", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/w")
    catalog.create_namespace("n")
    first = pa.schema([("key", pa.binary()), ("id", pa.int32()), ("address", pa.struct([("zip", pa.int32())]))])
    table = catalog.create_table("n.t", schema=first)
    zip_id = table.schema().find_field("address.zip").field_id
    rows = pa.schema([("key", pa.binary()), *((f.name, f.type) for f in read.arrow())])
    changes = evolve_table(table, read, rows)
    assert [(c.kind, c.path) for c in changes] == [("rename", ("address", "zip")), ("promote", ("address", "zip")),
                                                  ("add", ("address", "city"))]
    now = catalog.load_table("n.t").schema()
    assert now.find_field("address.postcode").field_id == zip_id
    assert str(now.find_field("address.postcode").field_type) == "long" and now.find_field("address.city")
    assert evolve_table(catalog.load_table("n.t"), read, rows) == []
