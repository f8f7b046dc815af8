"""Framed values (Confluent's framing: magic 0, schema id, payload) of one batch object decoded
into one Arrow struct column of the read schema, in the executors.

Each schema id's values are decoded together: by a compiled walk over the whole group (Avro
records and proto3 messages of scalars and nested records), one pyarrow.json read (JSON), or
else value by value with the schema its id names (fastavro's reader for Avro, protobuf's for
Protobuf, json for JSON), renamed into the merged columns (`typed_schema.rename`) and converted
to Arrow in one call. A value that does not decode is never dropped here:
its row gets a null value and the reason in `error` (the reader's `onError` decides the rest).
"""

from __future__ import annotations

import base64
import io
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from memq.format.spans import Spans, binary_array_parts
from spark_source import proto_walk
from spark_source.avro_walk import FlatPlan, flat_plan, walk
from spark_source.proto_walk import ProtoPlan
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
    cls = message_factory.GetMessageClass(_proto_message(w)[0])

    def protobuf(payload: bytes) -> Any:
        if payload[:1] != b"\0":
            raise ValueError("message indexes other than the schema's first message are not read")
        record = _proto_dict(cls.FromString(payload[1:]))
        return record if plan is None else rename(record, plan)
    return protobuf


def _proto_message(w: Writer) -> tuple[Any, str]:
    """A Protobuf writer's message descriptor (its file's first message) and its file's syntax."""
    fdp = descriptor_pb2.FileDescriptorProto()
    fdp.ParseFromString(base64.standard_b64decode(w.text))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return next(iter(pool.FindFileByName(fdp.name).message_types_by_name.values())), fdp.syntax


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


def decode_values(read: ReadSchema, values: pa.Array, per_record: bool = False) -> Decoded:
    """`values` (binary, framed) as the read schema's struct column, with each one's schema id
    and error. Rows are grouped by schema id (`_group`). `per_record`: every group value by
    value, the reference the whole-batch paths are held to."""
    n = len(values)
    typ = read.arrow()
    offsets = np.frombuffer(values.buffers()[1], np.int32)[values.offset:values.offset + n + 1].astype(np.int64)
    data = values.buffers()[2] if n and values.buffers()[2] is not None else pa.py_buffer(b"")
    buf = np.frombuffer(data, np.uint8)
    present = np.asarray(values.is_valid())
    starts, ends = offsets[:-1], offsets[1:]
    framed = present & (ends - starts >= 5)
    framed[framed] &= buf[starts[framed]] == 0
    ids = np.full(n, -1, np.int64)
    at = starts[framed]
    ids[framed] = (buf[at + 1].astype(np.int64) << 24 | buf[at + 2].astype(np.int64) << 16
                   | buf[at + 3].astype(np.int64) << 8 | buf[at + 4].astype(np.int64))
    errors: dict[int, str] = {}        # row → why it failed: built per failure, not per row
    for i in np.nonzero(present & ~framed)[0].tolist():
        errors[i] = "not framed: no magic byte 0 and schema id"
    groups: list[tuple[np.ndarray, pa.StructArray]] = []
    seen = ids[framed]
    for schema_id in ([int(seen[0])] if len(seen) and (seen == seen[0]).all() else np.unique(seen).tolist()):
        rows = np.nonzero(ids == schema_id)[0]
        writer = read.writers.get(schema_id)
        if writer is None:
            why = read.rejected.get(schema_id)
            message = (f"schema id {schema_id}: incompatible with the read schema: {why}" if why else
                       f"schema id {schema_id} is not a version of subject {read.subject} the read knows")
            for i in rows.tolist():
                errors[i] = message
            continue
        groups += _group(read, writer, values, data, starts[rows] + 5, ends[rows], rows, errors, per_record)
    column = _placed(groups, n, typ)
    schema_ids = pa.array(ids, mask=~framed).cast(pa.int32())
    return Decoded(column, schema_ids, _error_column(errors, n))


def _error_column(errors: Mapping[int, str], n: int) -> pa.StringArray:
    """The `error` column: null but at the rows that failed."""
    column = pa.nulls(n, pa.string())
    if errors:
        rows = sorted(errors)
        mask = np.zeros(n, np.bool_)
        mask[rows] = True
        column = pc.replace_with_mask(column, pa.array(mask), pa.array([errors[i] for i in rows], pa.string()))
    assert isinstance(column, pa.StringArray)
    return column


def _group(read: ReadSchema, w: Writer, values: pa.Array, data: pa.Buffer, starts: np.ndarray, ends: np.ndarray,
           rows: np.ndarray, errors: dict[int, str], per_record: bool) -> list[tuple[np.ndarray, pa.StructArray]]:
    """One schema id's rows (payloads at [starts, ends) of `data`) as (rows, struct column)
    parts: an Avro record of primitives and nested records by one compiled walk (`avro_walk`), a
    proto3 message of scalars and nested messages likewise (`proto_walk`: the values it does not
    read by protobuf), a JSON writer's by one pyarrow.json read where that is exactly what the
    per-record path gives (`_json_lines`), any other a decoder call per value and one Arrow
    conversion."""
    def by_record(subset: np.ndarray) -> pa.StructArray:
        return _decoded(read, w, [values[i].as_py()[5:] for i in subset.tolist()], subset, errors)

    plan = None if per_record else _plan(read.subject, w)
    if isinstance(plan, FlatPlan):
        return [(rows, _walked(read, w, plan, data, starts, ends, rows, errors))]
    if isinstance(plan, ProtoPlan):
        fields, ok = proto_walk.walk(plan, memoryview(data), starts, ends)
        column = _conformed(fields, w.renames, read.arrow(), len(rows), pa.array(~ok))
        if ok.all():
            return [(rows, column)]
        parts = [(rows[~ok], by_record(rows[~ok]))]
        return parts + [(rows[ok], column.filter(pa.array(ok)))] if ok.any() else parts
    column = _json_lines(read.arrow(), data, starts, ends) if not per_record and w.kind == "JSON" \
        and w.renames.identity() else None
    return [(rows, column if column is not None else by_record(rows))]


_PLANS: dict[tuple[str, int], FlatPlan | ProtoPlan | None] = {}


def _plan(subject: str, w: Writer) -> FlatPlan | ProtoPlan | None:
    """The compiled walk's plan of a writer's values, if they have one (per Python worker)."""
    key = (subject, w.schema_id)
    if key not in _PLANS:
        _PLANS[key] = flat_plan(w.text) if w.kind == "AVRO" and not w.named else \
            proto_walk.proto_plan(*_proto_message(w)) if w.kind == "PROTOBUF" else None
    return _PLANS[key]


def _walked(read: ReadSchema, w: Writer, plan: FlatPlan, data: pa.Buffer, starts: np.ndarray, ends: np.ndarray,
            rows: np.ndarray, errors: dict[int, str]) -> pa.StructArray:
    fields, ok = walk(plan, memoryview(data), starts, ends)
    for i in rows[~ok].tolist():
        errors[i] = f"schema id {w.schema_id}: does not decode: not a record of its schema"
    return _conformed(fields, w.renames, read.arrow(), len(rows), pa.array(~ok))


def _conformed(fields: Mapping[str, pa.Array], plan: Renames, typ: pa.StructType, n: int,
               mask: pa.BooleanArray) -> pa.StructArray:
    """A record's walked columns (by the writer's names) as `typ`, the merged struct: renamed,
    cast to its wider types, nested records likewise, a column the writer lacks null."""
    by_merged = {plan.names[name]: (name, arr) for name, arr in fields.items() if name in plan.names}
    arrays = []
    for f in typ:
        if f.name not in by_merged:
            arrays.append(pa.nulls(n, f.type))
            continue
        name, arr = by_merged[f.name]
        if isinstance(arr, pa.StructArray) and isinstance(f.type, pa.StructType) and name in plan.nested:
            arr = _conformed({arr.type.field(i).name: arr.field(i) for i in range(arr.type.num_fields)},
                             plan.nested[name][1], f.type, n, arr.is_null())
        arrays.append(arr if arr.type == f.type else arr.cast(f.type))
    return pa.StructArray.from_arrays(arrays, fields=list(typ), mask=mask)


# An integer literal of 16 digits or more: Python's json makes it an int, which a double column
# refuses past 2**53 (the per-record path's error), where pyarrow.json reads a double.
_LONG_INTEGER = r"(^|[^0-9.eE])-?[0-9]{16,}([^0-9.eE]|$)"


def _json_lines(typ: pa.StructType, data: pa.Buffer, starts: np.ndarray, ends: np.ndarray) -> pa.StructArray | None:
    """The JSON objects at [starts, ends) of `data` read as `typ` by one `pyarrow.json` call over
    them joined by newlines, or None where that could differ from the per-record path (json.loads,
    then `pa.array`), which then reads them and names the bad ones: a type pyarrow.json would read
    otherwise, a payload that is not one line starting with `{` and ending with `}` (so each
    yields at least one row, and exactly one when the rows are as many as the payloads), bytes
    that are not UTF-8, nesting deep enough to exhaust json.loads' recursion, a long integer
    literal where a double column is, or any failure."""
    if not _json_readable(typ):
        return None
    buf = np.frombuffer(data, np.uint8)
    if not ((ends - starts >= 2).all() and (buf[starts] == 0x7B).all() and (buf[ends - 1] == 0x7D).all()):
        return None
    payloads = binary_array_parts([(Spans(starts, ends - starts), data)], pa.string())
    body = np.frombuffer(payloads.buffers()[2], np.uint8)
    offsets = np.frombuffer(payloads.buffers()[1], np.int32)[:len(starts) + 1]
    if ((body == 0x0A) | (body == 0x0D)).any():
        return None
    deep = sys.getrecursionlimit() // 2           # json.loads may run out of stack there, pyarrow.json does not
    if (ends - starts).max() >= deep:             # a payload's `[` and `{` are at least its depth of nesting
        opening = (body == 0x5B) | (body == 0x7B)
        if (np.add.reduceat(opening, offsets[:-1], dtype=np.int64) >= deep).any():
            return None
    try:
        payloads.validate(full=True)
        if _has_double(typ) and pc.any(pc.match_substring_regex(payloads, _LONG_INTEGER)).as_py():
            return None
        lines = np.insert(body, offsets[1:], 0x0A)
        table = pa_json.read_json(
            pa.BufferReader(pa.py_buffer(lines)),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=max(len(lines), 1 << 20)),
            parse_options=pa_json.ParseOptions(explicit_schema=pa.schema(list(typ)),
                                               unexpected_field_behavior="ignore"))
    except pa.ArrowException:
        return None
    if table.num_rows != len(starts):
        return None
    return pa.StructArray.from_arrays([c.combine_chunks() for c in table.columns], fields=list(typ))


def _json_readable(t: pa.DataType) -> bool:
    """Whether pyarrow.json reads `t` as the per-record path does (the types JSON Schemas make but maps)."""
    if pa.types.is_struct(t):
        return all(_json_readable(f.type) for f in t)
    if pa.types.is_list(t):
        return _json_readable(t.value_type)
    return t in (pa.bool_(), pa.int64(), pa.float64(), pa.string())


def _has_double(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return any(_has_double(f.type) for f in t)
    return _has_double(t.value_type) if pa.types.is_list(t) else t == pa.float64()


def _decoded(read: ReadSchema, w: Writer, payloads: list[bytes], rows: np.ndarray,
             errors: dict[int, str]) -> pa.StructArray:
    decode = _decoder(read.subject, w)
    records: list[dict[str, Any] | None] = []
    for i, payload in zip(rows.tolist(), payloads):
        try:
            records.append(decode(payload))
        except Exception as e:   # any decoder's failure on bad bytes is this record's error, never the batch's
            records.append(None)
            errors[i] = f"schema id {w.schema_id}: does not decode: {type(e).__name__}: {e}"
    typ = read.arrow()
    try:
        column = pa.array(records, type=typ)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):   # find the rows that do not fit
        column = _row_by_row(records, typ, rows, errors)
    assert isinstance(column, pa.StructArray)
    return column


def _placed(groups: list[tuple[np.ndarray, pa.StructArray]], n: int, typ: pa.StructType) -> pa.StructArray:
    """The groups' rows back in their places; rows of no group null."""
    if len(groups) == 1 and len(groups[0][0]) == n:     # one schema id, every row: already in place
        return groups[0][1]
    placed = np.concatenate([rows for rows, _ in groups]) if groups else np.empty(0, np.int64)
    free = np.ones(n, np.bool_)
    free[placed] = False
    rest = np.nonzero(free)[0]
    order = np.concatenate([placed, rest])
    where = np.empty(n, np.int64)
    where[order] = np.arange(n)                          # row i is item where[i] of the parts, one after another
    combined = pa.concat_arrays([c for _, c in groups] + [pa.nulls(len(rest), typ)])
    column = combined.take(pa.array(where))
    assert isinstance(column, pa.StructArray)
    return column


def _row_by_row(records: list[dict[str, Any] | None], typ: pa.DataType, rows: np.ndarray,
                errors: dict[int, str]) -> pa.Array:
    out = []
    for i, record in zip(rows.tolist(), records):
        try:
            out.append(pa.array([record], type=typ))
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            errors[i] = f"does not fit the read schema: {e}"
            out.append(pa.nulls(1, typ))
    return pa.concat_arrays(out) if out else pa.array([], type=typ)
