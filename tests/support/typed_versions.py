"""A subject whose Avro schema goes through the evolutions typed reads and tables follow, and
values framed with it: shared by the unit tests and the real-path typed tests."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro

from spark_source.typed_schema import avro_columns, merge, renames
from spark_source.typed_values import ReadSchema, Writer


def _order(*fields: dict[str, Any]) -> str:
    return json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": list(fields)})


ID_INT = {"name": "id", "type": "int"}
ID_LONG = {"name": "id", "type": "long"}
NAME = {"name": "name", "type": "string"}
TITLE = {"name": "title", "type": "string", "aliases": ["name"]}
AMOUNT = {"name": "amount", "type": "float"}
NOTE = {"name": "note", "type": ["null", "string"], "default": None}
ADDRESS = {"name": "address", "type": ["null", {"type": "record", "name": "Address", "fields": [
    {"name": "city", "type": "string"}, {"name": "zip", "type": "int"}]}], "default": None}

# version → schema text: 1 the first; 2 adds note; 3 deletes amount; 4 renames name → title (alias);
# 5 promotes id int → long; 6 adds a nested record; INCOMPATIBLE turns id into a string.
VERSIONS = {
    1: _order(ID_INT, NAME, AMOUNT),
    2: _order(ID_INT, NAME, AMOUNT, NOTE),
    3: _order(ID_INT, NAME, NOTE),
    4: _order(ID_INT, TITLE, NOTE),
    5: _order(ID_LONG, TITLE, NOTE),
    6: _order(ID_LONG, TITLE, NOTE, ADDRESS),
}
INCOMPATIBLE = _order({"name": "id", "type": "string"}, TITLE, NOTE, ADDRESS)

# what one record per version holds (as written), and what it reads as in the merged columns
WRITTEN: dict[int, dict[str, Any]] = {
    1: {"id": 1, "name": "one", "amount": 1.5},
    2: {"id": 2, "name": "two", "amount": 2.5, "note": "n2"},
    3: {"id": 3, "name": "three", "note": None},
    4: {"id": 4, "title": "four", "note": "n4"},
    5: {"id": 5_000_000_000, "title": "five", "note": None},
    6: {"id": 6, "title": "six", "note": "n6", "address": {"city": "Oslo", "zip": 150}},
}
READ: dict[int, dict[str, Any]] = {
    1: {"id": 1, "title": "one", "amount": 1.5, "note": None, "address": None},
    2: {"id": 2, "title": "two", "amount": 2.5, "note": "n2", "address": None},
    3: {"id": 3, "title": "three", "amount": None, "note": None, "address": None},
    4: {"id": 4, "title": "four", "amount": None, "note": "n4", "address": None},
    5: {"id": 5_000_000_000, "title": "five", "amount": None, "note": None, "address": None},
    6: {"id": 6, "title": "six", "amount": None, "note": "n6", "address": {"city": "Oslo", "zip": 150}},
}
MERGED_COLUMNS = ["id", "title", "amount", "note", "address"]


def framed(schema_id: int, text: str, value: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    buf.write(b"\0" + schema_id.to_bytes(4, "big"))
    fastavro.schemaless_writer(buf, fastavro.parse_schema(json.loads(text)), value)
    return buf.getvalue()


def avro_read_schema(extra: dict[int, str] | None = None) -> ReadSchema:
    """The read schema of VERSIONS (and `extra` versions after them), schema id = version."""
    texts = {**VERSIONS, **(extra or {})}
    structs = [(sid, avro_columns(t)) for sid, t in texts.items()]
    merged = merge(structs)
    writers = {sid: Writer(sid, "AVRO", texts[sid], renames(merged.root, s)) for sid, s in structs
               if sid not in merged.rejected}
    return ReadSchema("orders-value", merged.root, writers, merged.rejected, {sid: sid for sid in texts})
