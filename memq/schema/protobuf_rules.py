"""Protobuf schemas, pure: a `.proto` text or a base64 `FileDescriptorProto` (what confluent-kafka's
Python serializer sends) parsed into a descriptor, checked by building it in a descriptor pool
with its references (imports, by the reference's name) and the well-known types; and the
compatibility rules Confluent applies to Protobuf.

Compatibility compares messages by full name and fields by number. Incompatible (Confluent's
difference types): PACKAGE_CHANGED, MESSAGE_REMOVED, FIELD_KIND_CHANGED (scalar / message /
enum), FIELD_SCALAR_KIND_CHANGED (outside the wire-compatible groups int32/uint32/int64/uint64/
bool, sint32/sint64, fixed32/sfixed32, fixed64/sfixed64, string/bytes), FIELD_NAMED_TYPE_CHANGED,
FIELD_LABEL_CHANGED (singular <-> repeated), REQUIRED_FIELD_ADDED, REQUIRED_FIELD_REMOVED,
ONEOF_FIELD_REMOVED, MULTIPLE_FIELDS_MOVED_TO_ONEOF. Compatible: fields added or removed, a
field renamed, messages added (to the reader), enum values added or removed.

The `.proto` parser reads what a schema needs: syntax, package, imports, options (skipped),
messages (fields, maps, oneofs, proto3 `optional`, nested messages and enums, reserved ranges),
enums and services (skipped); the descriptor pool resolves type names and checks the rest.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.message import DecodeError

from memq.errors import SchemaError

from .model import INVALID_SCHEMA

F = descriptor_pb2.FieldDescriptorProto
SCALARS = {"double": F.TYPE_DOUBLE, "float": F.TYPE_FLOAT, "int64": F.TYPE_INT64, "uint64": F.TYPE_UINT64,
           "int32": F.TYPE_INT32, "fixed64": F.TYPE_FIXED64, "fixed32": F.TYPE_FIXED32, "bool": F.TYPE_BOOL,
           "string": F.TYPE_STRING, "bytes": F.TYPE_BYTES, "uint32": F.TYPE_UINT32, "sfixed32": F.TYPE_SFIXED32,
           "sfixed64": F.TYPE_SFIXED64, "sint32": F.TYPE_SINT32, "sint64": F.TYPE_SINT64}
_GROUPS = [{F.TYPE_INT32, F.TYPE_UINT32, F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_BOOL}, {F.TYPE_SINT32, F.TYPE_SINT64},
           {F.TYPE_FIXED32, F.TYPE_SFIXED32}, {F.TYPE_FIXED64, F.TYPE_SFIXED64}, {F.TYPE_STRING, F.TYPE_BYTES}]
_TOKEN = re.compile(r'\s+|//[^\n]*|/\*.*?\*/|"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|[A-Za-z_][\w.]*|\.[A-Za-z_][\w.]*'
                    r'|-?(?:0[xX][0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)|[{}\[\]()<>;,=:.-]', re.S)
WELL_KNOWN = ("any", "api", "descriptor", "duration", "empty", "field_mask", "source_context", "struct",
              "timestamp", "type", "wrappers")


@dataclass(eq=False)
class ProtobufSchema:
    text: str
    file: descriptor_pb2.FileDescriptorProto
    name: str = "schema.proto"
    deps: list[descriptor_pb2.FileDescriptorProto] = field(default_factory=list)   # its references, recursively
    _pool: Any = None

    def canonical(self) -> str:
        return self.text.strip()

    def normalized(self) -> str:
        """The descriptor, serialized (base64): one text for every way of writing the same schema."""
        return self.serialized()

    def serialized(self) -> str:
        """As `format=serialized` answers it: the FileDescriptorProto in base64."""
        return base64.standard_b64encode(self.file.SerializeToString()).decode("ascii")

    def pool(self) -> Any:
        if self._pool is None:
            self._pool = _build(self.file, self.deps)
        return self._pool

    def messages(self) -> dict[str, Any]:
        """Every message type it defines (nested ones too), by full name."""
        out: dict[str, Any] = {}
        fd = self.pool().FindFileByName(self.file.name)

        def walk(d: Any) -> None:
            out[d.full_name] = d
            for n in d.nested_types:
                walk(n)
        for d in fd.message_types_by_name.values():
            walk(d)
        return out


def parse(text: str, refs: Sequence[ProtobufSchema] = ()) -> ProtobufSchema:
    deps: list[descriptor_pb2.FileDescriptorProto] = []
    for r in refs:
        deps += [d for d in r.deps if all(d.name != x.name for x in deps)]
        if all(r.file.name != x.name for x in deps):
            deps.append(r.file)
    fdp = _from_base64(text)
    if fdp is None:
        fdp = _Parser(text).file()
    if not fdp.name:
        fdp.name = "schema.proto"
    schema = ProtobufSchema(text, fdp, fdp.name, deps)
    schema.pool()   # resolves every name, or 42201
    return schema


def named(schema: ProtobufSchema, name: str) -> ProtobufSchema:
    """`schema` as the import path `name` (how the file importing it names it)."""
    f = descriptor_pb2.FileDescriptorProto()
    f.CopyFrom(schema.file)
    f.name = name
    return ProtobufSchema(schema.text, f, name, schema.deps)


def _from_base64(text: str) -> descriptor_pb2.FileDescriptorProto | None:
    stripped = text.strip()
    if not stripped or any(c in stripped for c in " ;{\n"):
        return None
    try:
        raw = base64.b64decode(stripped.encode("ascii"), validate=True)
        fdp = descriptor_pb2.FileDescriptorProto()
        fdp.ParseFromString(raw)
    except (binascii.Error, ValueError, DecodeError):
        return None
    return fdp if fdp.message_type or fdp.enum_type or fdp.package else None


def _build(fdp: descriptor_pb2.FileDescriptorProto, deps: Sequence[descriptor_pb2.FileDescriptorProto]) -> Any:
    pool = descriptor_pool.DescriptorPool()
    wanted = set(fdp.dependency) | {d for dep in deps for d in dep.dependency}
    for wk in WELL_KNOWN:
        if f"google/protobuf/{wk}.proto" in wanted:
            module = __import__(f"google.protobuf.{wk}_pb2", fromlist=["DESCRIPTOR"])
            pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    try:
        for d in [*deps, fdp]:
            if not d.name.startswith("google/protobuf/"):
                pool.AddSerializedFile(d.SerializeToString())
    except (TypeError, ValueError) as e:
        raise SchemaError(INVALID_SCHEMA, f"Invalid schema: {e}") from None
    return pool


class _Parser:
    """A `.proto` file's declarations as a FileDescriptorProto (names left for the pool to resolve)."""

    def __init__(self, text: str) -> None:
        pos, tokens = 0, []
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise self._bad(f"unexpected character {text[pos]!r}")
            tok = m.group()
            if not (tok.isspace() or tok.startswith(("//", "/*"))):
                tokens.append(tok)
            pos = m.end()
        self.tokens = tokens
        self.i = 0

    @staticmethod
    def _bad(why: str) -> SchemaError:
        return SchemaError(INVALID_SCHEMA, f"Invalid schema: {why}")

    def _peek(self) -> str:
        return self.tokens[self.i] if self.i < len(self.tokens) else ""

    def _next(self) -> str:
        if self.i >= len(self.tokens):
            raise self._bad("unexpected end of the schema")
        self.i += 1
        return self.tokens[self.i - 1]

    def _expect(self, tok: str) -> None:
        got = self._next()
        if got != tok:
            raise self._bad(f"expected {tok!r}, found {got!r}")

    def _skip_statement(self) -> None:
        """Up to the `;` ending this statement, or past the `{...}` block it opens."""
        depth = 0
        while True:
            t = self._next()
            if t == "{":
                depth += 1
            elif t == "}":
                depth -= 1
                if depth == 0:
                    return
            elif t == ";" and depth == 0:
                return

    def _int(self) -> int:
        t = self._next()
        try:
            return int(t, 0)
        except ValueError:
            raise self._bad(f"expected a number, found {t!r}") from None

    def _string(self) -> str:
        t = self._next()
        if len(t) < 2 or t[0] not in "\"'":
            raise self._bad(f"expected a string, found {t!r}")
        return t[1:-1]

    def file(self) -> descriptor_pb2.FileDescriptorProto:
        f = descriptor_pb2.FileDescriptorProto(syntax="proto2")
        while self._peek():
            t = self._next()
            if t == "syntax":
                self._expect("=")
                f.syntax = self._string()
                self._expect(";")
            elif t == "edition":
                raise self._bad("editions are not served")
            elif t == "package":
                f.package = self._next()
                self._expect(";")
            elif t == "import":
                if self._peek() in ("public", "weak"):
                    self._next()
                f.dependency.append(self._string())
                self._expect(";")
            elif t == "message":
                self._message(f.message_type.add(), f.syntax)
            elif t == "enum":
                self._enum(f.enum_type.add())
            elif t in ("option", "service", "extend"):
                self._skip_statement()
            elif t != ";":
                raise self._bad(f"unexpected {t!r} at the top level")
        return f

    def _enum(self, e: descriptor_pb2.EnumDescriptorProto) -> None:
        e.name = self._next()
        self._expect("{")
        while (t := self._next()) != "}":
            if t in ("option", "reserved"):
                self._skip_statement()
            elif t != ";":
                self._expect("=")
                e.value.add(name=t, number=self._int())
                self._options_then_end()

    def _options_then_end(self) -> None:
        if self._peek() == "[":
            while self._next() != "]":
                pass
        self._expect(";")

    def _message(self, m: descriptor_pb2.DescriptorProto, syntax: str) -> None:
        m.name = self._next()
        self._expect("{")
        self._body(m, syntax, None)

    def _body(self, m: descriptor_pb2.DescriptorProto, syntax: str, oneof: int | None) -> None:
        while (t := self._next()) != "}":
            if t == "message":
                self._message(m.nested_type.add(), syntax)
            elif t == "enum":
                self._enum(m.enum_type.add())
            elif t == "oneof":
                m.oneof_decl.add(name=self._next())
                self._expect("{")
                self._body(m, syntax, len(m.oneof_decl) - 1)
            elif t in ("option", "reserved", "extensions", "extend"):
                self._skip_statement()
            elif t == "map":
                self._map(m)
            elif t != ";":
                self._field(m, t, syntax, oneof)

    def _field(self, m: descriptor_pb2.DescriptorProto, first: str, syntax: str, oneof: int | None) -> None:
        label, proto3_optional, type_name = F.LABEL_OPTIONAL, False, first
        if first in ("optional", "required", "repeated"):
            label = {"optional": F.LABEL_OPTIONAL, "required": F.LABEL_REQUIRED, "repeated": F.LABEL_REPEATED}[first]
            proto3_optional = first == "optional" and syntax == "proto3"
            type_name = self._next()
        name = self._next()
        self._expect("=")
        f = m.field.add(name=name, number=self._int(), label=label)
        self._options_then_end()
        if type_name in SCALARS:
            f.type = SCALARS[type_name]
        else:
            f.type_name = type_name
        if oneof is not None:
            f.oneof_index = oneof
        elif proto3_optional:   # proto3 `optional`: a synthetic oneof of its own, as protoc makes
            f.proto3_optional = True
            m.oneof_decl.add(name=f"_{name}")
            f.oneof_index = len(m.oneof_decl) - 1

    def _map(self, m: descriptor_pb2.DescriptorProto) -> None:
        self._expect("<")
        key = self._next()
        self._expect(",")
        value = self._next()
        self._expect(">")
        name = self._next()
        self._expect("=")
        number = self._int()
        self._options_then_end()
        entry = m.nested_type.add(name="".join(p[:1].upper() + p[1:] for p in name.split("_")) + "Entry")
        entry.options.map_entry = True
        for i, (n, t) in enumerate((("key", key), ("value", value)), 1):
            f = entry.field.add(name=n, number=i, label=F.LABEL_OPTIONAL)
            if t in SCALARS:
                f.type = SCALARS[t]
            else:
                f.type_name = t
        m.field.add(name=name, number=number, label=F.LABEL_REPEATED, type_name=entry.name)


# --- compatibility --------------------------------------------------------------------------


def compatibility(reader: ProtobufSchema, writer: ProtobufSchema, *, reader_is: str = "new",
                  writer_is: str = "old") -> list[str]:
    errors: list[str] = []

    def error(kind: str, path: str, what: str) -> None:
        errors.append(f"{{errorType:'{kind}', description:'{what} at '{path}' in the {reader_is} schema "
                      f"(against the {writer_is} schema)'}}")

    if reader.file.package != writer.file.package:
        error("PACKAGE_CHANGED", "#/", f"The package {writer.file.package!r} became {reader.file.package!r}")
        return errors
    rmsgs, wmsgs = reader.messages(), writer.messages()
    for name, wd in wmsgs.items():
        rd = rmsgs.get(name)
        if rd is None:
            if not wd.GetOptions().map_entry:
                error("MESSAGE_REMOVED", f"#/{name}", f"The message {name} was removed")
            continue
        for kind, path, what in _message_diff(rd, wd, f"#/{name}"):
            error(kind, path, what)
    return errors


def _kind(f: Any) -> str:
    return "message" if f.message_type is not None else "enum" if f.enum_type is not None else "scalar"


def _message_diff(reader: Any, writer: Any, path: str) -> Iterator[tuple[str, str, str]]:
    rfields = {f.number: f for f in reader.fields}
    wfields = {f.number: f for f in writer.fields}
    for number, wf in wfields.items():
        p = f"{path}/{number}"
        rf = rfields.get(number)
        if rf is None:
            if _required(wf):
                yield "REQUIRED_FIELD_REMOVED", p, f"The required field {wf.name} was removed"
            elif _real_oneof(wf) is not None:
                yield "ONEOF_FIELD_REMOVED", p, f"The field {wf.name} of a oneof was removed"
            continue
        if _kind(rf) != _kind(wf):
            yield "FIELD_KIND_CHANGED", p, f"The field {wf.name} changed kind ({_kind(wf)} to {_kind(rf)})"
        elif _kind(rf) == "scalar" and rf.type != wf.type and not any(
                rf.type in g and wf.type in g for g in _GROUPS):
            yield "FIELD_SCALAR_KIND_CHANGED", p, f"The field {wf.name} changed its scalar type"
        elif _kind(rf) != "scalar":
            rt = (rf.message_type or rf.enum_type).full_name
            wt = (wf.message_type or wf.enum_type).full_name
            if rt != wt:
                yield "FIELD_NAMED_TYPE_CHANGED", p, f"The field {wf.name} changed type ({wt} to {rt})"
        if _repeated(rf) != _repeated(wf):
            yield "FIELD_LABEL_CHANGED", p, f"The field {wf.name} changed between singular and repeated"
    for number, rf in rfields.items():
        if number not in wfields and _required(rf):
            yield "REQUIRED_FIELD_ADDED", f"{path}/{number}", f"The required field {rf.name} was added"
    moved: dict[str, int] = {}
    for number, rf in rfields.items():
        wf = wfields.get(number)
        oneof = _real_oneof(rf)
        if wf is not None and oneof is not None and _real_oneof(wf) is None:
            moved[oneof] = moved.get(oneof, 0) + 1
    for oneof, n in moved.items():
        if n > 1:
            yield "MULTIPLE_FIELDS_MOVED_TO_ONEOF", f"{path}/{oneof}", f"{n} fields moved into the oneof {oneof}"


def _required(f: Any) -> bool:
    """(protobuf >= 6 has `is_required`; older ones only `label`)"""
    return bool(f.is_required) if hasattr(f, "is_required") else f.label == F.LABEL_REQUIRED


def _repeated(f: Any) -> bool:
    return bool(f.is_repeated) if hasattr(f, "is_repeated") else f.label == F.LABEL_REPEATED


def _real_oneof(f: Any) -> str | None:
    o = f.containing_oneof
    if o is None or getattr(f, "has_presence", False) and len(o.fields) == 1 and o.name == f"_{f.name}":
        return None   # proto3 `optional`'s synthetic oneof
    return str(o.name)
