"""A typed sync's micro-batch split into table rows and dead letters, and a table's columns as
the evolution plan sees them, without servers."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

pytest.importorskip("pyiceberg")
from pyiceberg.schema import Schema  # noqa: E402
from pyiceberg.types import DecimalType, IntegerType, NestedField, StringType, StructType  # noqa: E402

from memq.errors import SchemaChangedError  # noqa: E402
from spark_source.iceberg_typed import COLLECTED, DLQ_SCHEMA, split_typed, table_columns  # noqa: E402
from spark_source.typed_values import decode_values  # noqa: E402
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
