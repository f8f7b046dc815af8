"""Framed values (Confluent's framing: magic 0, schema id, payload) of one batch object decoded
into one Arrow struct column of the read schema, in the executors.

Each value is decoded with the schema its id names (fastavro's compiled reader for Avro, protobuf's
for Protobuf, json for JSON), renamed into the merged columns (`typed_schema.rename`), and the
whole batch becomes Arrow in one conversion. A value that does not decode is never dropped here:
its row gets a null value and the reason in `error` (the reader's `onError` decides the rest).
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import fastavro
import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from spark_source.typed_schema import MergedStruct, Renames, arrow_type, rename, repeated


@dataclass(frozen=True)
class Writer:
    """One registered version the read knows: its id, format, text and renames into the merge."""

    schema_id: int
    kind: str                           # AVRO | JSON | PROTOBUF
    text: str                           # Avro JSON, JSON Schema, or a base64 FileDescriptorProto
    renames: Renames
    named: tuple[str, ...] = ()         # Avro: the referenced schemas' texts, dependencies first


@dataclass(frozen=True)
class ReadSchema:
    """What typed reads decode with: picklable, built once on the driver (`spark_source.registry`)."""

    subject: str
    root: MergedStruct
    writers: Mapping[int, Writer]
    rejected: Mapping[int, str]         # versions left out of the merge: id → why
    version_of: Mapping[int, int]       # schema id → its version in the subject

    def arrow(self) -> pa.StructType:
        t = arrow_type(self.root)
        assert isinstance(t, pa.StructType)
        return t


@dataclass(frozen=True)
class Decoded:
    value: pa.StructArray
    schema_id: pa.Int32Array            # null where a value is not framed
    error: pa.StringArray               # null where it decoded


_DECODERS: dict[tuple[str, int], Callable[[bytes], Any]] = {}   # per Python worker: an id never changes meaning


def _decoder(subject: str, w: Writer) -> Callable[[bytes], Any]:
    key = (subject, w.schema_id)
    found = _DECODERS.get(key)
    if found is None:
        found = _DECODERS[key] = _make(w)
    return found


def _make(w: Writer) -> Callable[[bytes], Any]:
    plan = None if w.renames.identity() else w.renames
    if w.kind == "AVRO":
        named: dict[str, Any] = {}
        for text in w.named:
            fastavro.parse_schema(json.loads(text), named_schemas=named)
        parsed = fastavro.parse_schema(json.loads(w.text), named_schemas=named)

        def avro(payload: bytes) -> Any:
            buf = io.BytesIO(payload)
            record = fastavro.schemaless_reader(buf, parsed, None)
            if buf.tell() != len(payload):
                raise ValueError(f"{len(payload) - buf.tell()} bytes left after the record")
            if not isinstance(record, dict):
                raise ValueError("not a record")
            return record if plan is None else rename(record, plan)
        return avro
    if w.kind == "JSON":
        def as_json(payload: bytes) -> Any:
            record = json.loads(payload)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
            return record if plan is None else rename(record, plan)
        return as_json
    fdp = descriptor_pb2.FileDescriptorProto()
    fdp.ParseFromString(base64.standard_b64decode(w.text))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    cls = message_factory.GetMessageClass(next(iter(pool.FindFileByName(fdp.name).message_types_by_name.values())))

    def protobuf(payload: bytes) -> Any:
        if payload[:1] != b"\0":
            raise ValueError("message indexes other than the schema's first message are not read")
        record = _proto_dict(cls.FromString(payload[1:]))
        return record if plan is None else rename(record, plan)
    return protobuf


def _proto_dict(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in message.DESCRIPTOR.fields:
        value = getattr(message, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            vf = f.message_type.fields_by_name["value"]
            out[f.name] = {str(k): _proto_value(vf, v) for k, v in value.items()}
        elif repeated(f):
            out[f.name] = [_proto_value(f, v) for v in value]
        elif f.message_type is not None and not message.HasField(f.name):
            out[f.name] = None
        else:
            out[f.name] = _proto_value(f, value)
    return out


def _proto_value(f: Any, value: Any) -> Any:
    if f.message_type is not None:
        return _proto_dict(value)
    if f.enum_type is not None:
        found = f.enum_type.values_by_number.get(value)
        return found.name if found is not None else str(value)
    return value


def decode_values(read: ReadSchema, values: Sequence[bytes | None]) -> Decoded:
    """`values` (framed) as the read schema's struct column, with each one's schema id and error."""
    records: list[dict[str, Any] | None] = []
    ids: list[int | None] = []
    errors: list[str | None] = []
    for raw in values:
        record, schema_id, error = _one(read, raw)
        records.append(record)
        ids.append(schema_id)
        errors.append(error)
    typ = read.arrow()
    try:
        column = pa.array(records, type=typ)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):   # find the rows that do not fit
        column = _row_by_row(records, typ, errors)
    assert isinstance(column, pa.StructArray)
    return Decoded(column, pa.array(ids, type=pa.int32()), pa.array(errors, type=pa.string()))


def _one(read: ReadSchema, raw: bytes | None) -> tuple[dict[str, Any] | None, int | None, str | None]:
    if raw is None:
        return None, None, None
    if len(raw) < 5 or raw[0] != 0:
        return None, None, "not framed: no magic byte 0 and schema id"
    schema_id = int.from_bytes(raw[1:5], "big")
    writer = read.writers.get(schema_id)
    if writer is None:
        why = read.rejected.get(schema_id)
        return None, schema_id, (f"schema id {schema_id}: incompatible with the read schema: {why}" if why else
                                 f"schema id {schema_id} is not a version of subject {read.subject} the read knows")
    try:
        return _decoder(read.subject, writer)(raw[5:]), schema_id, None
    except Exception as e:   # any decoder's failure on bad bytes is this record's error, never the batch's
        return None, schema_id, f"schema id {schema_id}: does not decode: {type(e).__name__}: {e}"


def _row_by_row(records: list[dict[str, Any] | None], typ: pa.DataType, errors: list[str | None]) -> pa.Array:
    rows = []
    for i, record in enumerate(records):
        try:
            rows.append(pa.array([record], type=typ))
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            errors[i] = f"does not fit the read schema: {e}"
            rows.append(pa.nulls(1, typ))
    return pa.concat_arrays(rows) if rows else pa.array([], type=typ)
