"""A typed table's side of `memq table sync --typed`: a micro-batch's rows split into the table's
rows (the value's fields as columns) and dead letters, and the table's schema brought to the read
schema by field identity (`typed_schema.evolve`): a renamed field is an Iceberg rename of the same
column (its field id kept), then pyiceberg's union by name adds new columns and promotes types.
Nothing is dropped: a column no version has any more stays, optional."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table import Table
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    StringType,
    StructType,
    TimestamptzType,
)

from memq.errors import ConfigError, SchemaChangedError
from spark_source.typed_schema import Change, evolve
from spark_source.typed_values import ReadSchema

log = logging.getLogger("memq.table")

# the columns a micro-batch of a typed read is collected with (the memq ones a table keeps, then the value's)
META = ("key", "topic", "partition", "offset", "index", "timestamp", "headers", "producerId")
COLLECTED = (*META, "value", "valueSchemaId", "valueError", "rawValue")
DLQ_SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("error", pa.string()),
                        ("schemaId", pa.int32()), ("topic", pa.string()), ("partition", pa.int32()),
                        ("offset", pa.int64()), ("index", pa.int32()), ("timestamp", pa.timestamp("us", tz="UTC"))])
_NAMES: Mapping[type, str] = {IntegerType: "int", LongType: "long", FloatType: "float", DoubleType: "double",
                              StringType: "string", BinaryType: "bytes", BooleanType: "boolean", DateType: "date",
                              TimestamptzType: "timestamp"}


def split_typed(batch: pa.Table, read: ReadSchema) -> tuple[pa.Table, pa.Table]:
    """(the table's rows: META then the value's fields; the dead letters: DLQ_SCHEMA). A value of a
    schema id the read does not know (registered after it started) raises SchemaChangedError:
    the sync restarts with the new read schema instead of dead-lettering valid records."""
    if batch.schema.field("value").type != read.arrow():
        raise SchemaChangedError(f"subject {read.subject}: the stream's read schema is not the sync's (a version "
                                 f"registered while it started)")
    ids = batch.column("valueSchemaId")
    known = pa.array(sorted({*read.writers, *read.rejected}), pa.int32())
    unknown = pc.and_(pc.is_valid(ids), pc.invert(pc.is_in(ids, value_set=known)))
    if pc.any(unknown).as_py():
        new = sorted(set(pc.filter(ids, unknown).to_pylist()))
        raise SchemaChangedError(f"subject {read.subject}: schema id(s) {new} registered since the sync started")
    failed = pc.is_valid(batch.column("valueError"))
    good = batch.filter(pc.invert(failed))
    value = good.column("value").combine_chunks() if good.num_rows else pa.array([], read.arrow())
    clash = set(META) & set(read.arrow().names)
    if clash:
        raise ConfigError(f"table sync --typed: value field(s) {sorted(clash)} clash with memq's columns")
    fields = value.flatten() if isinstance(value, pa.StructArray) else []
    rows = pa.Table.from_arrays([*(good.column(n) for n in META), *fields],
                                names=[*META, *read.arrow().names])
    bad = batch.filter(failed)
    letters = pa.Table.from_arrays([bad.column("key"), bad.column("rawValue"), bad.column("valueError"),
                                    bad.column("valueSchemaId"), *(bad.column(n) for n in DLQ_SCHEMA.names[4:])],
                                   schema=DLQ_SCHEMA)
    return rows, letters


def table_columns(struct: StructType | Any, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """An Iceberg struct's fields as `evolve` takes them: name → nested mapping or type name."""
    out: dict[str, Any] = {}
    for f in struct.fields:
        if f.name in skip:
            continue
        t: IcebergType = f.field_type
        out[f.name] = table_columns(t) if isinstance(t, StructType) else _name(t)
    return out


def _name(t: IcebergType) -> str:
    if isinstance(t, DecimalType):
        return f"decimal({t.precision},{t.scale})"
    return _NAMES.get(type(t), str(t))


def evolve_table(table: Table, read: ReadSchema, rows: pa.Schema) -> list[Change]:
    """Bring `table`'s columns to `read`'s merged columns (the batch's `rows` schema); the changes made."""
    changes = list(evolve(table_columns(table.schema().as_struct(), frozenset(META)), read.root))
    if not changes:
        return []
    with table.update_schema() as update:
        for c in changes:
            if c.kind == "rename":
                update.rename_column(".".join(c.path), str(c.to))
    with table.update_schema() as update:
        update.union_by_name(rows)
    log.info("table %s: schema evolved to subject %s's read schema: %s", table.name(), read.subject,
             ", ".join(f"{c.kind} {'.'.join(c.path)}" for c in changes))
    return changes
