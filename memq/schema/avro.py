"""Avro schemas, pure: parsing (named types across references), the stored and normalised texts,
and Avro's schema-resolution rules as Confluent applies them.

`parse(text, refs)` gives an `AvroSchema`: the JSON as given plus a graph of types in which every
name is resolved (a recursive record points at itself). `compatibility(reader, writer)` lists
why data written with `writer` cannot be read with `reader` (empty: it can), with the error
types of Avro's SchemaCompatibility (NAME_MISMATCH, FIXED_SIZE_MISMATCH, MISSING_ENUM_SYMBOLS,
READER_FIELD_MISSING_DEFAULT_VALUE, TYPE_MISMATCH, MISSING_UNION_BRANCH) and JSON-pointer paths.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from memq.errors import SchemaError

from .model import INVALID_SCHEMA

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
# writer type -> reader types that read it (Avro's promotions)
PROMOTIONS = {"int": {"long", "float", "double"}, "long": {"float", "double"}, "float": {"double"},
              "string": {"bytes"}, "bytes": {"string"}}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(eq=False)
class Field:
    name: str
    type: AvroType
    has_default: bool
    aliases: frozenset[str]


@dataclass(eq=False)
class Named:
    kind: str                      # record, error, enum, fixed
    fullname: str
    aliases: frozenset[str]        # full names
    fields: list[Field] = field(default_factory=list)
    symbols: tuple[str, ...] = ()
    enum_default: str | None = None
    size: int = 0

    @property
    def name(self) -> str:
        return self.fullname.rpartition(".")[2]


@dataclass(eq=False)
class Array:
    items: AvroType


@dataclass(eq=False)
class Map:
    values: AvroType


@dataclass(eq=False)
class Union_:
    branches: list[AvroType]


AvroType = Union[str, Named, Array, Map, Union_]   # str: a primitive


@dataclass(eq=False)
class AvroSchema:
    raw: Any                       # the JSON as given
    root: AvroType
    names: dict[str, Named]        # every named type it defines or references, by full name
    deps: list[Any] = field(default_factory=list)   # the JSON of its references, those they reference first

    def canonical(self) -> str:
        """The text stored for a plain registration: the JSON as given, without whitespace."""
        return json.dumps(self.raw, separators=(",", ":"), ensure_ascii=False)

    def normalized(self) -> str:
        """The text stored with `normalize=true`: full names, no namespace attributes, each
        named type's keys in one order (type, name, then the rest as given)."""
        return json.dumps(_normalize(self.raw, "", set()), separators=(",", ":"), ensure_ascii=False)


def parse(text: str, refs: Sequence[AvroSchema] = ()) -> AvroSchema:
    """42201 with the reason when `text` is not a valid Avro schema; `refs` are the referenced
    schemas whose named types `text` may use."""
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise SchemaError(INVALID_SCHEMA, f"Invalid schema: not JSON: {e}") from None
    known: dict[str, Named] = {}
    for r in refs:
        known.update(r.names)
    parser = _Parser(known)
    root = parser.type(raw, "", "")
    deps: list[Any] = []
    for r in refs:
        deps += [*r.deps, r.raw]
    return AvroSchema(raw, root, parser.names, deps)


def _bad(why: str, path: str) -> SchemaError:
    return SchemaError(INVALID_SCHEMA, f"Invalid schema: {why} at {path or '/'}")


def _fullname(name: Any, namespace: Any, enclosing: str, path: str) -> str:
    if not isinstance(name, str) or not name:
        raise _bad("a named type needs a name", path)
    if namespace is not None and not isinstance(namespace, str):
        raise _bad(f"namespace of {name} must be a string", path)
    if "." in name:
        full = name
    else:
        ns = enclosing if namespace is None else namespace
        full = f"{ns}.{name}" if ns else name
    for part in full.split("."):
        if not _NAME.match(part):
            raise _bad(f"illegal name {full!r}", path)
    return full


class _Parser:
    def __init__(self, known: dict[str, Named]) -> None:
        self.names: dict[str, Named] = dict(known)
        self._own: set[str] = set()

    def type(self, raw: Any, namespace: str, path: str) -> AvroType:
        if isinstance(raw, str):
            return self._reference(raw, namespace, path)
        if isinstance(raw, list):
            return self._union(raw, namespace, path)
        if not isinstance(raw, dict):
            raise _bad(f"a type must be a name, an object or a union, not {raw!r}", path)
        t = raw.get("type")
        if isinstance(t, (dict, list)):
            return self.type(t, namespace, f"{path}/type")
        if not isinstance(t, str):
            raise _bad("no 'type'", path)
        if t in PRIMITIVES:
            return t
        if t == "array":
            if "items" not in raw:
                raise _bad("an array needs 'items'", path)
            return Array(self.type(raw["items"], namespace, f"{path}/items"))
        if t == "map":
            if "values" not in raw:
                raise _bad("a map needs 'values'", path)
            return Map(self.type(raw["values"], namespace, f"{path}/values"))
        if t in ("record", "error", "enum", "fixed"):
            return self._named(t, raw, namespace, path)
        return self._reference(t, namespace, path)

    def _reference(self, name: str, namespace: str, path: str) -> AvroType:
        if name in PRIMITIVES:
            return name
        for full in ((f"{namespace}.{name}", name) if namespace and "." not in name else (name,)):
            if full in self.names:
                return self.names[full]
        raise _bad(f"undefined name: {name!r}", path)

    def _union(self, raw: list[Any], namespace: str, path: str) -> Union_:
        branches = [self.type(b, namespace, f"{path}/{i}") for i, b in enumerate(raw)]
        seen: set[str] = set()
        for i, b in enumerate(branches):
            if isinstance(b, Union_):
                raise _bad("a union may not hold a union", f"{path}/{i}")
            key = _type_key(b)
            if key in seen:
                raise _bad(f"duplicate in union: {key}", f"{path}/{i}")
            seen.add(key)
        return Union_(branches)

    def _named(self, kind: str, raw: dict[str, Any], namespace: str, path: str) -> Named:
        full = _fullname(raw.get("name"), raw.get("namespace"), namespace, path)
        if full in self._own:
            raise _bad(f"can't redefine: {full}", path)
        ns = full.rpartition(".")[0]
        aliases = raw.get("aliases", [])
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise _bad("aliases must be a list of names", path)
        node = Named(kind, full, frozenset(a if "." in a else (f"{ns}.{a}" if ns else a) for a in aliases))
        self._own.add(full)
        self.names[full] = node   # before the fields: a record may name itself
        if kind in ("record", "error"):
            fields = raw.get("fields")
            if not isinstance(fields, list):
                raise _bad(f"record {full} needs a list of fields", path)
            names: set[str] = set()
            for i, f in enumerate(fields):
                fp = f"{path}/fields/{i}"
                if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not _NAME.match(f["name"]):
                    raise _bad("a field needs a valid name", fp)
                if f["name"] in names:
                    raise _bad(f"duplicate field {f['name']!r} in {full}", fp)
                names.add(f["name"])
                if "type" not in f:
                    raise _bad(f"field {f['name']!r} has no type", fp)
                fa = f.get("aliases", [])
                node.fields.append(Field(f["name"], self.type(f["type"], ns, f"{fp}/type"), "default" in f,
                                         frozenset(fa) if isinstance(fa, list) else frozenset()))
        elif kind == "enum":
            symbols = raw.get("symbols")
            if (not isinstance(symbols, list) or not all(isinstance(s, str) and _NAME.match(s) for s in symbols)
                    or len(set(symbols)) != len(symbols)):
                raise _bad(f"enum {full} needs a list of distinct valid symbols", path)
            node.symbols = tuple(symbols)
            default = raw.get("default")
            if default is not None and default not in symbols:
                raise _bad(f"enum {full}'s default {default!r} is not one of its symbols", path)
            node.enum_default = default
        else:
            size = raw.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise _bad(f"fixed {full} needs a size", path)
            node.size = size
        return node


def _type_key(t: AvroType) -> str:
    if isinstance(t, str):
        return t
    if isinstance(t, Named):
        return t.fullname
    return "array" if isinstance(t, Array) else "map" if isinstance(t, Map) else "union"


_FIRST_KEYS = ("type", "name")


def _normalize(raw: Any, namespace: str, seen: set[str]) -> Any:
    if isinstance(raw, str):
        if raw in PRIMITIVES or "." in raw or not namespace:
            return raw
        return f"{namespace}.{raw}"
    if isinstance(raw, list):
        return [_normalize(b, namespace, seen) for b in raw]
    if not isinstance(raw, dict):
        return raw
    t = raw.get("type")
    if isinstance(t, str) and t in PRIMITIVES and set(raw) == {"type"}:
        return t
    out: dict[str, Any] = {}
    if t in ("record", "error", "enum", "fixed") and isinstance(raw.get("name"), str):
        full = _fullname(raw["name"], raw.get("namespace"), namespace, "")
        namespace = full.rpartition(".")[0]
        out["type"], out["name"] = t, full
    elif "type" in raw:
        out["type"] = _normalize(t, namespace, seen)
    for k, v in raw.items():
        if k in out or k == "namespace":
            continue
        if k == "fields" and isinstance(v, list):
            out[k] = [{**f, "type": _normalize(f["type"], namespace, seen)} if isinstance(f, dict) and "type" in f
                      else f for f in v]
        elif k in ("items", "values"):
            out[k] = _normalize(v, namespace, seen)
        else:
            out[k] = v
    return out


# --- compatibility (Avro's schema resolution) ----------------------------------------------


def compatibility(reader: AvroSchema, writer: AvroSchema, *, reader_is: str = "new",
                  writer_is: str = "old") -> list[str]:
    """Why data written with `writer` cannot be read with `reader`, as Confluent words it (empty:
    it can). `reader_is`/`writer_is` name the two in messages ("new"/"old" for BACKWARD)."""
    c = _Checker(reader_is, writer_is)
    c.check(reader.root, writer.root, "")
    return c.errors


class _Checker:
    def __init__(self, reader_is: str, writer_is: str) -> None:
        self.r, self.w = reader_is, writer_is
        self.errors: list[str] = []
        self._busy: set[tuple[int, int]] = set()

    def _error(self, kind: str, path: str, info: str, description: str) -> None:
        self.errors.append(f"{{errorType:'{kind}', description:'{description}', additionalInfo:'{info}'}}"
                           .replace("PATH", path or "/"))

    def check(self, reader: AvroType, writer: AvroType, path: str) -> bool:
        """True when `reader` reads `writer`; appends each reason when it does not."""
        key = (id(reader), id(writer))
        if key in self._busy:   # a recursive type: assume yes while deciding it
            return True
        self._busy.add(key)
        try:
            return self._check(reader, writer, path)
        finally:
            self._busy.discard(key)

    def _check(self, reader: AvroType, writer: AvroType, path: str) -> bool:
        if isinstance(writer, Union_):
            ok = True
            for i, b in enumerate(writer.branches):
                if isinstance(reader, Union_):
                    if not any(self._quiet(rb, b) for rb in reader.branches):
                        self._error("MISSING_UNION_BRANCH", f"{path}/{i}", f"reader union lacking writer type: "
                                    f"{_type_key(b).upper()}", f"The {self.r} schema is missing a type inside a "
                                    f"union field at path 'PATH' in the {self.w} schema")
                        ok = False
                elif not self.check(reader, b, f"{path}/{i}" if len(writer.branches) > 1 else path):
                    ok = False
            return ok
        if isinstance(reader, Union_):
            if any(self._quiet(rb, writer) for rb in reader.branches):
                return True
            self._error("MISSING_UNION_BRANCH", path, f"reader union lacking writer type: {_type_key(writer).upper()}",
                        f"The {self.r} schema is missing a type inside a union field at path 'PATH' in the "
                        f"{self.w} schema")
            return False
        if isinstance(reader, str) or isinstance(writer, str):
            if reader == writer or (isinstance(reader, str) and isinstance(writer, str)
                                    and reader in PROMOTIONS.get(writer, ())):
                return True
            return self._mismatch(reader, writer, path)
        if isinstance(reader, Array) and isinstance(writer, Array):
            return self.check(reader.items, writer.items, f"{path}/items")
        if isinstance(reader, Map) and isinstance(writer, Map):
            return self.check(reader.values, writer.values, f"{path}/values")
        if isinstance(reader, Named) and isinstance(writer, Named) and _kind(reader) == _kind(writer):
            if reader.name != writer.name and writer.fullname not in reader.aliases:
                self._error("NAME_MISMATCH", f"{path}/name", f"expected: {writer.fullname}",
                            f"The type (path 'PATH') of a field in the {self.r} schema does not match with "
                            f"the {self.w} schema")
                return False
            if reader.kind == "fixed":
                if reader.size != writer.size:
                    self._error("FIXED_SIZE_MISMATCH", f"{path}/size", f"expected: {writer.size}, found: "
                                f"{reader.size}", f"The size of FIXED type field at path 'PATH' in the {self.r} "
                                f"schema does not match with the {self.w} schema")
                    return False
                return True
            if reader.kind == "enum":
                missing = [s for s in writer.symbols if s not in reader.symbols]
                if missing and reader.enum_default is None:
                    self._error("MISSING_ENUM_SYMBOLS", f"{path}/symbols", f"[{', '.join(missing)}]",
                                f"The {self.r} schema is missing enum symbols '[{', '.join(missing)}]' at path "
                                f"'PATH' in the {self.w} schema")
                    return False
                return True
            return self._record(reader, writer, path)
        return self._mismatch(reader, writer, path)

    def _record(self, reader: Named, writer: Named, path: str) -> bool:
        ok = True
        by_name = {f.name: f for f in writer.fields}
        for i, rf in enumerate(reader.fields):
            wf = by_name.get(rf.name) or next((by_name[a] for a in rf.aliases if a in by_name), None)
            if wf is None:
                if not rf.has_default:
                    self._error("READER_FIELD_MISSING_DEFAULT_VALUE", f"{path}/fields/{i}", rf.name,
                                f"The field '{rf.name}' at path 'PATH' in the {self.r} schema has no default "
                                f"value and is missing in the {self.w} schema")
                    ok = False
            elif not self.check(rf.type, wf.type, f"{path}/fields/{i}/type"):
                ok = False
        return ok

    def _mismatch(self, reader: AvroType, writer: AvroType, path: str) -> bool:
        self._error("TYPE_MISMATCH", path, f"reader type: {_type_key(reader).upper()} not compatible with "
                    f"writer type: {_type_key(writer).upper()}", f"The type (path 'PATH') of a field in the "
                    f"{self.r} schema does not match with the {self.w} schema")
        return False

    def _quiet(self, reader: AvroType, writer: AvroType) -> bool:
        """Whether `reader` reads `writer`, recording no reason (a union's branch search)."""
        saved = self.errors
        self.errors = []
        try:
            return self.check(reader, writer, "")
        finally:
            self.errors = saved


def _kind(t: Named) -> str:
    return "record" if t.kind == "error" else t.kind
