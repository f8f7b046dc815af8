"""JSON Schema, pure: parsing (checked against its draft's meta-schema), the stored and
normalised texts, and the compatibility rules Confluent applies to JSON Schema.

Compatibility compares what the writer's schema admits with what the reader's admits: a change
that lets the reader accept less than the writer may have written is incompatible. Confluent's
change kinds that memq checks (incompatible unless said otherwise): TYPE_NARROWED, TYPE_CHANGED,
ENUM_ARRAY_NARROWED, ENUM_ARRAY_CHANGED, MAX_LENGTH_ADDED/DECREASED, MIN_LENGTH_ADDED/INCREASED,
PATTERN_ADDED/CHANGED, MAXIMUM_ADDED/DECREASED, MINIMUM_ADDED/INCREASED (and the exclusive
forms), MULTIPLE_OF_ADDED/CHANGED, REQUIRED_ATTRIBUTE_ADDED, PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL
(unless the writer's additionalProperties admits it), REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL,
PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL, ADDITIONAL_PROPERTIES_REMOVED/NARROWED,
MAX_ITEMS_ADDED/DECREASED, MIN_ITEMS_ADDED/INCREASED, UNIQUE_ITEMS_ADDED,
MAX_PROPERTIES_ADDED/DECREASED, MIN_PROPERTIES_ADDED/INCREASED, SUM_TYPE_NARROWED, NOT_TYPE_CHANGED.
Compatible: a property removed from an open content model, an optional one added to a closed
one, a type or enum extended, bounds relaxed or removed. `$ref`s resolve within the document and
into its references (by the reference's name, with an optional `#/...` fragment).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.validators

from memq.errors import SchemaError

from .model import INVALID_SCHEMA

ALL_TYPES = frozenset({"null", "boolean", "object", "array", "number", "integer", "string"})


@dataclass(eq=False)
class JsonSchema:
    raw: Any
    name: str = ""                                   # as a reference names it ("" for the one registered)
    docs: dict[str, Any] = field(default_factory=dict)   # referenced documents by name

    def canonical(self) -> str:
        return json.dumps(self.raw, separators=(",", ":"), ensure_ascii=False)

    def normalized(self) -> str:
        """Keys sorted at every level (JSON Schema's object keys have no order of meaning)."""
        return json.dumps(self.raw, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def parse(text: str, refs: Sequence[JsonSchema] = ()) -> JsonSchema:
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise SchemaError(INVALID_SCHEMA, f"Invalid schema: not JSON: {e}") from None
    if not isinstance(raw, (dict, bool)):
        raise SchemaError(INVALID_SCHEMA, "Invalid schema: a JSON Schema is an object or a boolean")
    try:
        jsonschema.validators.validator_for(raw, default=jsonschema.Draft7Validator).check_schema(raw)
    except jsonschema.exceptions.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path)
        raise SchemaError(INVALID_SCHEMA, f"Invalid schema: {e.message} at #/{where}") from None
    docs: dict[str, Any] = {}
    for r in refs:
        docs.update(r.docs)
        docs[r.name] = r.raw
    return JsonSchema(raw, docs=docs)


def named(schema: JsonSchema, name: str) -> JsonSchema:
    """`schema` as a reference called `name` (its `$ref`s from others use that name)."""
    return JsonSchema(schema.raw, name, schema.docs)


# --- compatibility --------------------------------------------------------------------------


def compatibility(reader: JsonSchema, writer: JsonSchema, *, reader_is: str = "new",
                  writer_is: str = "old") -> list[str]:
    d = _Diff(reader, writer, reader_is, writer_is)
    d.schema(reader.raw, writer.raw, "#", reader.raw, writer.raw)
    return d.errors


def _pointer(doc: Any, fragment: str) -> Any:
    node = doc
    for part in [p for p in fragment.lstrip("/").split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return True   # an unresolvable pointer admits anything (the parser let it through)
    return node


class _Diff:
    def __init__(self, reader: JsonSchema, writer: JsonSchema, reader_is: str, writer_is: str) -> None:
        self.docs = {**writer.docs, **reader.docs}
        self.r, self.w = reader_is, writer_is
        self.errors: list[str] = []
        self._busy: set[tuple[int, int]] = set()

    def _error(self, kind: str, path: str, what: str) -> None:
        self.errors.append(f"{{errorType:'{kind}', description:'{what} at path '{path}' in the {self.r} "
                           f"schema', additionalInfo:'{self.w} schema: {self.w}'}}")

    def _resolve(self, node: Any, root: Any) -> tuple[Any, Any]:
        seen = 0
        while isinstance(node, dict) and isinstance(node.get("$ref"), str) and seen < 32:
            ref: str = node["$ref"]
            base, _, fragment = ref.partition("#")
            if base:
                root = self.docs.get(base, True)
            node, seen = _pointer(root, fragment), seen + 1
        return node, root

    def schema(self, reader: Any, writer: Any, path: str, rroot: Any, wroot: Any) -> None:
        reader, rroot = self._resolve(reader, rroot)
        writer, wroot = self._resolve(writer, wroot)
        key = (id(reader), id(writer))
        if key in self._busy:
            return
        self._busy.add(key)
        try:
            self._schema(reader, writer, path, rroot, wroot)
        finally:
            self._busy.discard(key)

    def _schema(self, reader: Any, writer: Any, path: str, rroot: Any, wroot: Any) -> None:
        if writer is False or reader is True or reader == {}:
            return
        if reader is False:
            self._error("TYPE_NARROWED", path, "The schema admits nothing")
            return
        if writer is True:
            writer = {}
        for combiner in ("anyOf", "oneOf"):
            if combiner in writer or combiner in reader:
                self._sum(reader, writer, combiner, path, rroot, wroot)
                return
        self._types(reader, writer, path)
        self._enum(reader, writer, path)
        self._bounds(reader, writer, path)
        if "not" in reader and reader.get("not") != writer.get("not"):
            self._error("NOT_TYPE_CHANGED", f"{path}/not", "The 'not' schema changed")
        if _admits(writer, "object") and _admits(reader, "object"):
            self._object(reader, writer, path, rroot, wroot)
        if _admits(writer, "array") and _admits(reader, "array"):
            ri, wi = reader.get("items", True), writer.get("items", True)
            if isinstance(ri, (dict, bool)) and isinstance(wi, (dict, bool)):
                self.schema(ri, wi, f"{path}/items", rroot, wroot)

    def _sum(self, reader: Any, writer: Any, combiner: str, path: str, rroot: Any, wroot: Any) -> None:
        """Each branch the writer may have used must be read by some branch of the reader."""
        rbranches = reader.get(combiner, [reader]) if isinstance(reader, dict) else [reader]
        wbranches = writer.get(combiner, [writer]) if isinstance(writer, dict) else [writer]
        for i, wb in enumerate(wbranches):
            if not any(self._quiet(rb, wb, rroot, wroot) for rb in rbranches):
                self._error("SUM_TYPE_NARROWED", f"{path}/{combiner}/{i}", "A branch of a sum type was removed")

    def _quiet(self, reader: Any, writer: Any, rroot: Any, wroot: Any) -> bool:
        saved, self.errors = self.errors, []
        try:
            self.schema(reader, writer, "#", rroot, wroot)
            return not self.errors
        finally:
            self.errors = saved

    def _types(self, reader: dict[str, Any], writer: dict[str, Any], path: str) -> None:
        rt, wt = _types(reader), _types(writer)
        missing = {t for t in wt if t not in rt and not (t == "integer" and "number" in rt)}
        if missing:
            kind = "TYPE_NARROWED" if rt & wt else "TYPE_CHANGED"
            self._error(kind, path, f"The type {sorted(missing)} is no longer admitted")

    def _enum(self, reader: dict[str, Any], writer: dict[str, Any], path: str) -> None:
        for key in ("enum", "const"):
            if key not in reader:
                continue
            rv = reader[key] if key == "enum" else [reader[key]]
            if key not in writer:
                self._error("ENUM_ARRAY_CHANGED", f"{path}/{key}", f"An {key} was added")
            else:
                wv = writer[key] if key == "enum" else [writer[key]]
                if any(v not in rv for v in wv):
                    self._error("ENUM_ARRAY_NARROWED", f"{path}/{key}", f"The {key} values were narrowed")

    def _bounds(self, reader: dict[str, Any], writer: dict[str, Any], path: str) -> None:
        # keyword -> (Confluent's name, True when a larger reader value admits more)
        for key, name, larger_admits in (
                ("maxLength", "MAX_LENGTH", True), ("minLength", "MIN_LENGTH", False),
                ("maximum", "MAXIMUM", True), ("minimum", "MINIMUM", False),
                ("exclusiveMaximum", "EXCLUSIVE_MAXIMUM", True), ("exclusiveMinimum", "EXCLUSIVE_MINIMUM", False),
                ("maxItems", "MAX_ITEMS", True), ("minItems", "MIN_ITEMS", False),
                ("maxProperties", "MAX_PROPERTIES", True), ("minProperties", "MIN_PROPERTIES", False)):
            rv, wv = reader.get(key), writer.get(key)
            if not isinstance(rv, (int, float)) or isinstance(rv, bool):
                continue
            if not isinstance(wv, (int, float)) or isinstance(wv, bool):
                self._error(f"{name}_ADDED", f"{path}/{key}", f"{key} was added")
            elif (rv < wv) if larger_admits else (rv > wv):
                self._error(f"{name}_{'DECREASED' if larger_admits else 'INCREASED'}", f"{path}/{key}",
                            f"{key} was {'decreased' if larger_admits else 'increased'}")
        for key, name in (("pattern", "PATTERN"), ("multipleOf", "MULTIPLE_OF")):
            if key in reader and reader[key] != writer.get(key):
                self._error(f"{name}_{'CHANGED' if key in writer else 'ADDED'}", f"{path}/{key}",
                            f"{key} was {'changed' if key in writer else 'added'}")
        if reader.get("uniqueItems") is True and writer.get("uniqueItems") is not True:
            self._error("UNIQUE_ITEMS_ADDED", f"{path}/uniqueItems", "uniqueItems was added")

    def _object(self, reader: dict[str, Any], writer: dict[str, Any], path: str, rroot: Any, wroot: Any) -> None:
        rprops, wprops = reader.get("properties", {}), writer.get("properties", {})
        radd, wadd = reader.get("additionalProperties", True), writer.get("additionalProperties", True)
        rreq, wreq = set(reader.get("required", ())), set(writer.get("required", ()))
        for name, rp in rprops.items():
            p = f"{path}/properties/{name}"
            if name in wprops:
                self.schema(rp, wprops[name], p, rroot, wroot)
            elif wadd is False:
                if name in rreq:
                    self._error("REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL", p,
                                f"The required property '{name}' was added to a closed content model")
            elif not self._quiet(rp, wadd, rroot, wroot):
                self._error("PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL", p,
                            f"The property '{name}' was added to an open content model")
        for name, wp in wprops.items():
            if name in rprops:
                continue
            p = f"{path}/properties/{name}"
            if radd is False:
                self._error("PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL", p,
                            f"The property '{name}' was removed from a closed content model")
            elif not self._quiet(radd, wp, rroot, wroot):
                self._error("PROPERTY_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL", p,
                            f"The property '{name}' was removed and additionalProperties does not admit it")
        for name in sorted(rreq - wreq):
            if name in wprops or wadd is not False:
                self._error("REQUIRED_ATTRIBUTE_ADDED", f"{path}/required", f"The property '{name}' became required")
        if wadd is not False and radd is False:
            self._error("ADDITIONAL_PROPERTIES_REMOVED", f"{path}/additionalProperties",
                        "additionalProperties was removed")
        elif wadd is not False and isinstance(radd, dict) and not self._quiet(radd, wadd, rroot, wroot):
            self._error("ADDITIONAL_PROPERTIES_NARROWED", f"{path}/additionalProperties",
                        "additionalProperties was narrowed")


def _types(node: dict[str, Any]) -> set[str]:
    t = node.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    return set(ALL_TYPES)


def _admits(node: Any, kind: str) -> bool:
    return isinstance(node, dict) and kind in _types(node)
