"""Registered schemas as typed columns, pure (no I/O): one column tree per schema version (Avro,
JSON Schema, Protobuf), the merge of a subject's versions by field identity, its Arrow type, and
how a table's columns evolve to it.

Field identity: an Avro field is the column of an earlier version when its name or one of its
aliases is a name that column has had; a Protobuf field is its number; a JSON Schema property
its name. A merged column keeps every name it has had (the latest first), so a rename stays one
column. Types widen as Iceberg promotes them (int→long, float→double, decimal precision at the
same scale); any other change of a field's type makes that version incompatible: the merge
leaves it out and names why (its records then fail to decode, by the reader's `onError`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import pyarrow as pa

from memq.errors import SchemaError

_AVRO_PRIMITIVE = {"boolean": "boolean", "int": "int", "long": "long", "float": "float", "double": "double",
                   "string": "string", "bytes": "bytes"}
_AVRO_LOGICAL = {("int", "date"): "date", ("long", "timestamp-millis"): "timestamp",
                 ("long", "timestamp-micros"): "timestamp"}
_WIDER = {("int", "long"): "long", ("long", "int"): "long", ("float", "double"): "double",
          ("double", "float"): "double"}


@dataclass(frozen=True)
class Decimal:
    precision: int
    scale: int


@dataclass(frozen=True)
class ListOf:
    item: AnyType


@dataclass(frozen=True)
class MapOf:
    value: AnyType                     # keys are strings


@dataclass(frozen=True)
class Struct:
    fields: tuple[Column, ...]


# str: a primitive, one of boolean, int, long, float, double, string, bytes, date, timestamp
ColType = Union[str, Decimal, ListOf, MapOf, Struct]


@dataclass(frozen=True)
class Column:
    """A field of one schema version: `aliases` (Avro) and `number` (Protobuf) are its identity."""

    name: str
    type: ColType
    aliases: frozenset[str] = frozenset()
    number: int | None = None


@dataclass
class MergedColumn:
    """A column of the merged schema: `names` every name it has had, the latest first."""

    names: list[str]
    type: MergedType
    number: int | None = None

    @property
    def name(self) -> str:
        return self.names[0]


@dataclass
class MergedStruct:
    columns: list[MergedColumn] = field(default_factory=list)


MergedType = Union[str, Decimal, ListOf, MapOf, MergedStruct]
AnyType = Union[str, Decimal, ListOf, MapOf, Struct, MergedStruct]   # lists and maps hold either kind


class Incompatible(Exception):
    """A version's field cannot share its column (internal to the merge: the version is left out)."""


# --- one version's columns -----------------------------------------------------------------


def avro_columns(text: str, named: Mapping[str, Any] | None = None) -> Struct:
    """An Avro record schema's columns (`named`: referenced named types' JSON, by full name)."""
    raw = json.loads(text)
    known: dict[str, Any] = dict(named or {})
    root = _avro(raw, "", known)
    if not isinstance(root, Struct):
        raise SchemaError(42201, "typed reads need an Avro record schema at the top")
    return root


def _avro(raw: Any, namespace: str, known: dict[str, Any]) -> ColType:
    if isinstance(raw, str):
        if raw in _AVRO_PRIMITIVE:
            return _AVRO_PRIMITIVE[raw]
        full = raw if "." in raw else f"{namespace}.{raw}".strip(".")
        if full not in known and raw not in known:
            raise SchemaError(42201, f"Avro type {raw!r} is not defined")
        return _avro(known.get(full, known.get(raw)), namespace, known)
    if isinstance(raw, list):
        branches = [b for b in raw if b != "null"]
        if len(branches) != 1:
            raise SchemaError(42201, f"Avro union {json.dumps(raw)} has no column type (only [null, T] has)")
        return _avro(branches[0], namespace, known)
    if not isinstance(raw, dict):
        raise SchemaError(42201, f"Avro type {raw!r} is not a type")
    kind, logical = raw.get("type"), raw.get("logicalType")
    if logical == "decimal":
        return Decimal(int(raw["precision"]), int(raw.get("scale", 0)))
    if isinstance(kind, str) and isinstance(logical, str) and (kind, logical) in _AVRO_LOGICAL:
        return _AVRO_LOGICAL[(kind, logical)]
    if kind == "array":
        return ListOf(_avro(raw["items"], namespace, known))
    if kind == "map":
        return MapOf(_avro(raw["values"], namespace, known))
    if kind in ("record", "error", "enum", "fixed"):
        ns = raw.get("namespace", namespace) if "." not in raw["name"] else raw["name"].rpartition(".")[0]
        known[f"{ns}.{raw['name'].rpartition('.')[2]}".strip(".")] = raw
        if kind == "enum":
            return "string"
        if kind == "fixed":
            return "bytes"
        return Struct(tuple(Column(f["name"], _avro(f["type"], ns, known), frozenset(f.get("aliases", ())))
                            for f in raw["fields"]))
    return _avro(kind, namespace, known)


_JSON_PRIMITIVE = {"integer": "long", "number": "double", "string": "string", "boolean": "boolean"}


def json_columns(text: str) -> Struct:
    """A JSON Schema object's columns (`properties`; `$ref` to `#/definitions/...` or `#/$defs/...`)."""
    doc = json.loads(text)
    root = _json(doc, doc)
    if not isinstance(root, Struct):
        raise SchemaError(42201, "typed reads need a JSON Schema of type object with properties")
    return root


def _json(node: Any, root: Any) -> ColType:
    if not isinstance(node, dict):
        raise SchemaError(42201, f"JSON Schema {node!r} has no column type")
    if "$ref" in node:
        target: Any = root
        for part in str(node["$ref"]).removeprefix("#/").split("/"):
            target = target[part]
        return _json(target, root)
    kind = node.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1:
            raise SchemaError(42201, f"JSON Schema type {kind} has no column type")
        kind = kinds[0]
    if kind in _JSON_PRIMITIVE:
        return _JSON_PRIMITIVE[kind]
    if kind == "array":
        return ListOf(_json(node.get("items", {}), root))
    if kind == "object" and "properties" in node:
        return Struct(tuple(Column(name, _json(sub, root)) for name, sub in node["properties"].items()))
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return MapOf(_json(node["additionalProperties"], root))
    raise SchemaError(42201, f"JSON Schema {json.dumps(node)[:80]} has no column type")


# FieldDescriptor types (google.protobuf.descriptor.FieldDescriptor.TYPE_*) -> column types
_PROTO_TYPES = {1: "double", 2: "float", 3: "long", 4: "long", 5: "int", 6: "long", 7: "int", 8: "boolean",
                9: "string", 12: "bytes", 13: "long", 14: "string", 15: "int", 16: "long", 17: "int", 18: "long"}


def protobuf_columns(message: Any) -> Struct:
    """A Protobuf message descriptor's columns, each field identified by its number."""
    return _proto_message(message, ())


def _proto_message(message: Any, seen: tuple[str, ...]) -> Struct:
    if message.full_name in seen:
        raise SchemaError(42201, f"Protobuf message {message.full_name} is recursive: no column type")
    return Struct(tuple(Column(f.name, _proto_field(f, (*seen, message.full_name)), number=f.number)
                        for f in message.fields))


def _proto_field(f: Any, seen: tuple[str, ...]) -> ColType:
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        return MapOf(_proto_field(f.message_type.fields_by_name["value"], seen))
    one: ColType = _proto_message(f.message_type, seen) if f.message_type is not None else _PROTO_TYPES[f.type]
    return ListOf(one) if repeated(f) else one


def repeated(f: Any) -> bool:
    is_repeated = getattr(f, "is_repeated", None)
    return bool(is_repeated) if is_repeated is not None else f.label == 3


# --- the merge -------------------------------------------------------------------------------


@dataclass
class Merged:
    """The read schema of a subject's versions: `root` the merged columns; `rejected` each
    version left out (its schema id → why)."""

    root: MergedStruct
    rejected: dict[int, str]


def merge(versions: Sequence[tuple[int, Struct]]) -> Merged:
    """Merge (schema id, columns) in version order into one read schema, by field identity."""
    root = MergedStruct()
    rejected: dict[int, str] = {}
    for schema_id, struct in versions:
        trial = _copy(root)
        try:
            _merge_struct(trial, struct, "")
        except Incompatible as e:
            rejected[schema_id] = str(e)
            continue
        root = trial
    return Merged(root, rejected)


def _copy(s: MergedStruct) -> MergedStruct:
    return MergedStruct([MergedColumn(list(c.names), _copy_type(c.type), c.number) for c in s.columns])


def _copy_type(t: MergedType) -> MergedType:
    if isinstance(t, MergedStruct):
        return _copy(t)
    if isinstance(t, ListOf) and isinstance(t.item, MergedStruct):
        return ListOf(_copy(t.item))
    if isinstance(t, MapOf) and isinstance(t.value, MergedStruct):
        return MapOf(_copy(t.value))
    return t


def find(columns: Sequence[MergedColumn], col: Column) -> MergedColumn | None:
    """The merged column `col` is (field identity), or None: a new column."""
    for c in columns:
        if col.number is not None and c.number is not None:
            if c.number == col.number:
                return c
        elif col.name in c.names or c.name in col.aliases or col.aliases & set(c.names):
            return c
    return None


def _merge_struct(into: MergedStruct, struct: Struct, path: str) -> None:
    for col in struct.fields:
        where = f"{path}.{col.name}".lstrip(".")
        found = find(into.columns, col)
        if found is None:
            if any(c.name == col.name for c in into.columns):
                raise Incompatible(f"field {where}: its name is another field's (a different number)")
            into.columns.append(MergedColumn([col.name], _merge_type(None, col.type, where), col.number))
            continue
        found.type = _merge_type(found.type, col.type, where)
        if found.name != col.name:
            if any(c is not found and c.name == col.name for c in into.columns):
                raise Incompatible(f"field {where}: renamed onto another field's name")
            found.names = [col.name, *(n for n in found.names if n != col.name)]


def _merge_type(old: AnyType | None, new: AnyType, where: str) -> MergedType:
    if isinstance(new, Struct):
        into = _copy(old) if isinstance(old, MergedStruct) else MergedStruct() if old is None else None
        if into is None:
            raise Incompatible(f"field {where}: {describe(old)} became a record")
        _merge_struct(into, new, where)
        return into
    if isinstance(new, ListOf):
        if old is not None and not isinstance(old, ListOf):
            raise Incompatible(f"field {where}: {describe(old)} became an array")
        return ListOf(_merge_type(None if old is None else old.item, new.item, f"{where}[]"))
    if isinstance(new, MapOf):
        if old is not None and not isinstance(old, MapOf):
            raise Incompatible(f"field {where}: {describe(old)} became a map")
        return MapOf(_merge_type(None if old is None else old.value, new.value, f"{where}{{}}"))
    if old is None or old == new:
        return new
    if isinstance(old, str) and isinstance(new, str) and (old, new) in _WIDER:
        return _WIDER[(old, new)]
    if isinstance(old, Decimal) and isinstance(new, Decimal) and old.scale == new.scale:
        return Decimal(max(old.precision, new.precision), old.scale)
    raise Incompatible(f"field {where}: {describe(old)} → {describe(new)} is not a promotion "
                       f"(int→long, float→double, decimal precision)")


def describe(t: MergedType | ColType | None) -> str:
    if isinstance(t, Decimal):
        return f"decimal({t.precision},{t.scale})"
    if isinstance(t, (Struct, MergedStruct)):
        return "record"
    if isinstance(t, ListOf):
        return f"array<{describe(t.item)}>"
    if isinstance(t, MapOf):
        return f"map<{describe(t.value)}>"
    return str(t)


# --- what decoded values are renamed to ------------------------------------------------------


@dataclass(frozen=True)
class Renames:
    """A version's field names → the merged column names, at each level of nesting: `nested`
    gives a field's own renames and whether they apply to its record, its list's or its map's."""

    names: Mapping[str, str]
    nested: Mapping[str, tuple[str, Renames]]      # field → (record | list | map, renames)

    def identity(self) -> bool:
        return all(k == v for k, v in self.names.items()) and all(r.identity() for _, r in self.nested.values())


def renames(merged: MergedStruct, struct: Struct) -> Renames:
    """How a record of `struct` (a version the merge took) is renamed into `merged`'s columns."""
    names: dict[str, str] = {}
    nested: dict[str, tuple[str, Renames]] = {}
    for col in struct.fields:
        found = find(merged.columns, col)
        if found is None:
            continue
        names[col.name] = found.name
        kind = "list" if isinstance(col.type, ListOf) else "map" if isinstance(col.type, MapOf) else "record"
        inner, target = _record_of(col.type), _record_of(found.type)
        if isinstance(inner, Struct) and isinstance(target, MergedStruct):
            nested[col.name] = (kind, renames(target, inner))
    return Renames(names, nested)


def _record_of(t: Any) -> Any:
    return t.item if isinstance(t, ListOf) else t.value if isinstance(t, MapOf) else t


def rename(record: Mapping[str, Any], plan: Renames) -> dict[str, Any]:
    """A decoded record with the merged column names (fields the merge does not know dropped)."""
    out: dict[str, Any] = {}
    for k, v in record.items():
        name = plan.names.get(k)
        if name is None:
            continue
        sub = plan.nested.get(k)
        if sub is None or v is None:
            out[name] = v
        elif sub[0] == "list":
            out[name] = [None if x is None else rename(x, sub[1]) for x in v]
        elif sub[0] == "map":
            out[name] = {mk: None if mv is None else rename(mv, sub[1]) for mk, mv in v.items()}
        else:
            out[name] = rename(v, sub[1])
    return out


# --- Arrow -----------------------------------------------------------------------------------


_ARROW: dict[str, Callable[[], pa.DataType]] = {
    "boolean": pa.bool_, "int": pa.int32, "long": pa.int64, "float": pa.float32, "double": pa.float64,
    "string": pa.string, "bytes": pa.binary, "date": pa.date32, "timestamp": lambda: pa.timestamp("us", tz="UTC")}


def arrow_type(t: AnyType) -> pa.DataType:
    """The Arrow type of a merged column (every field nullable: older rows lack newer fields)."""
    if isinstance(t, MergedStruct):
        return pa.struct([pa.field(c.name, arrow_type(c.type)) for c in t.columns])
    if isinstance(t, Struct):
        return pa.struct([pa.field(c.name, arrow_type(c.type)) for c in t.fields])
    if isinstance(t, ListOf):
        return pa.list_(arrow_type(t.item))
    if isinstance(t, MapOf):
        return pa.map_(pa.string(), arrow_type(t.value))
    if isinstance(t, Decimal):
        return pa.decimal128(t.precision, t.scale)
    return _ARROW[t]()


# --- a table's columns evolving to the merged schema ----------------------------------------


@dataclass(frozen=True)
class Change:
    """One schema update of a table: `kind` add | rename | promote; `path` the column's names
    from the top (as the table has them before this change), `to` the new name or type."""

    kind: str
    path: tuple[str, ...]
    to: MergedType | str


def evolve(table: Mapping[str, Any], merged: MergedStruct, prefix: tuple[str, ...] = ()) -> Iterator[Change]:
    """The changes that bring a table's columns (`table`: name → its type as a nested mapping
    for a struct, else the describe() of its type) to `merged`, by field identity: a column
    the table has under an earlier name is renamed, a wider type promoted, a new one added;
    a column the merge no longer has a version of stays (nothing is ever dropped)."""
    for col in merged.columns:
        have = next((n for n in col.names if n in table), None)
        if have is None:
            yield Change("add", (*prefix, col.name), col.type)
            continue
        if have != col.name:
            yield Change("rename", (*prefix, have), col.name)
        current = table[have]
        if isinstance(col.type, MergedStruct) and isinstance(current, Mapping):
            yield from evolve(current, col.type, (*prefix, have))
        elif not isinstance(col.type, MergedStruct) and current != describe(col.type) and \
                not isinstance(col.type, (ListOf, MapOf)):
            yield Change("promote", (*prefix, have), col.type)
