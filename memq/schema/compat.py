"""The compatibility modes, pure: which earlier versions a new schema is checked against, in which
direction, and the reasons Confluent gives when it fails.

BACKWARD: the new schema reads data written with the previous one (the reader is new);
FORWARD: the previous schema reads data written with the new one; FULL: both. The plain modes
check the latest live version only, the *_TRANSITIVE ones every live version, newest first,
stopping at the first that fails (its reasons, then `{oldSchemaVersion: n}`, `{oldSchema: '...'}`
and `{compatibility: 'MODE'}`, as Confluent's verbose answer lists them). NONE checks nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from memq.errors import SchemaError

from . import avro, jsonschema_rules, protobuf_rules
from .model import INVALID_COMPATIBILITY, INVALID_SCHEMA, MODES


class Parsed(Protocol):
    def canonical(self) -> str: ...

    def normalized(self) -> str: ...


@dataclass(frozen=True)
class Format:
    """One schema format's pure rules."""

    name: str
    parse: Callable[[str, Sequence[Any]], Any]     # (text, parsed references) -> Parsed, or SchemaError 42201
    compatibility: Callable[..., list[str]]        # (reader, writer, *, reader_is, writer_is) -> reasons
    named: Callable[[Any, str], Any] = lambda parsed, name: parsed   # a parsed schema as a reference `name`


FORMATS: dict[str, Format] = {
    "AVRO": Format("AVRO", avro.parse, avro.compatibility),
    "JSON": Format("JSON", jsonschema_rules.parse, jsonschema_rules.compatibility, jsonschema_rules.named),
    "PROTOBUF": Format("PROTOBUF", protobuf_rules.parse, protobuf_rules.compatibility, protobuf_rules.named),
}


def format_of(schema_type: str) -> Format:
    f = FORMATS.get(schema_type)
    if f is None:
        raise SchemaError(INVALID_SCHEMA, f"Invalid schema: schemaType {schema_type} is not served by this registry")
    return f


def check_mode(mode: Any) -> str:
    """A compatibility level as given (any case) in upper case, else 42203."""
    if not isinstance(mode, str) or mode.upper() not in MODES:
        raise SchemaError(INVALID_COMPATIBILITY, f"Invalid compatibility level. Valid values are {', '.join(MODES)}")
    return mode.upper()


@dataclass(frozen=True)
class Earlier:
    """A live version a new schema may be checked against."""

    version: int
    parsed: Any
    text: str


def check(fmt: Format, new: Any, earlier: Sequence[Earlier], mode: str) -> list[str]:
    """Why `new` may not follow `earlier` (oldest first) under `mode`; empty: it may."""
    mode = check_mode(mode)
    if mode == "NONE" or not earlier:
        return []
    against = list(reversed(earlier)) if mode.endswith("_TRANSITIVE") else [earlier[-1]]
    base = mode.removesuffix("_TRANSITIVE")
    for old in against:
        reasons: list[str] = []
        if base in ("BACKWARD", "FULL"):
            reasons += fmt.compatibility(new, old.parsed, reader_is="new", writer_is="old")
        if base in ("FORWARD", "FULL"):
            reasons += fmt.compatibility(old.parsed, new, reader_is="old", writer_is="new")
        if reasons:
            return reasons + [f"{{oldSchemaVersion: {old.version}}}", f"{{oldSchema: '{old.text}'}}",
                              f"{{compatibility: '{mode}'}}"]
    return []
