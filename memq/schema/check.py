"""The produce-time payload check: which records of a batch do not decode with the schema their id
names, or name no schema of the topic's subject.

A checked record's key or value is framed as Confluent's serializers frame it: magic byte 0, the
schema id (4 bytes, big-endian), for Protobuf the message indexes (zig-zag varints, `0` alone for
the first message), then the payload. A record fails when it is not framed so, when its id names
no schema, when the id is not a version of the topic's subject (by the topic's subject name
strategy: `<topic>-value`, the record's name, or `<topic>-<record name>`), or when its payload
does not decode: Avro with fastavro (every byte read), JSON Schema with its validator (every
constraint), Protobuf by parsing the message. `Checker.check` is called by the admission path
(memq.broker.admission) only for topics with `value_schema_validation` or `key_schema_validation`;
topics without them never reach this module.

Decoders are built once per id and kept (an id never changes meaning); the ids of a subject are
read from the registry at most every `subject_ttl_s`, so a version registered elsewhere is
accepted within that time.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import fastavro
import jsonschema_rs
from google.protobuf import message_factory

from memq.config import TopicConfig
from memq.errors import SchemaError
from memq.format import LogMessage

from .avro import AvroSchema, Named
from .jsonschema_rules import JsonSchema
from .model import INVALID_SCHEMA
from .protobuf_rules import ProtobufSchema
from .service import SchemaRegistry

MAGIC = 0
#: A decoder: the reason the payload does not decode (None: it does).
Decoder = Callable[[memoryview, tuple[int, ...]], str | None]


@dataclass(frozen=True, slots=True)
class Failure:
    """One record that failed: its index in the checked records, which part, why, and its id."""

    index: int
    part: str              # "key" or "value"
    reason: str
    schema_id: int | None = None

    def __str__(self) -> str:
        at = f" (schema id {self.schema_id})" if self.schema_id is not None else ""
        return f"record {self.index}: {self.part}{at}: {self.reason}"


def dlq_topic(topic: str) -> str:
    """Where a topic's failing records go under `schema_validation_action = dlq`."""
    return f"{topic}.dlq"


def dead_letters(records: Sequence[LogMessage], failures: Sequence[Failure], topic: str,
                 partition: int) -> list[LogMessage]:
    """The failing records as dead letters: each with headers naming why (`memq.dlq.reason`), its
    schema id, its topic, partition and index among the request's records (a refused record has
    no offset)."""
    return [r._replace(headers=(*r.headers, ("memq.dlq.reason", f.reason.encode()),
                                ("memq.dlq.schema.id", b"" if f.schema_id is None else str(f.schema_id).encode()),
                                ("memq.dlq.topic", topic.encode()), ("memq.dlq.partition", str(partition).encode()),
                                ("memq.dlq.index", str(f.index).encode())))
            for f in failures for r in (records[f.index],)]


def checked(cfg: TopicConfig) -> bool:
    """Whether the topic asks for any check (the only topics that pay for one)."""
    return cfg.value_schema_validation or cfg.key_schema_validation


def frame(data: bytes | memoryview | None) -> tuple[int, memoryview] | str:
    """(schema id, the rest) of a framed key or value, or why it is not framed."""
    if data is None or len(data) == 0:
        return "no data (a null or empty payload carries no schema id)"
    view = memoryview(data)
    if view[0] != MAGIC:
        return f"no magic byte (first byte {view[0]}, not 0)"
    if len(view) < 5:
        return "truncated: fewer than 5 bytes of magic byte and schema id"
    return int.from_bytes(view[1:5], "big"), view[5:]


def message_indexes(view: memoryview) -> tuple[tuple[int, ...], memoryview]:
    """Protobuf's message indexes (a zig-zag varint count, then that many) and the rest."""
    def varint(pos: int) -> tuple[int, int]:
        shift = value = 0
        while True:
            if pos >= len(view) or shift > 63:
                raise ValueError("truncated message indexes")
            b = view[pos]
            value |= (b & 0x7F) << shift
            pos, shift = pos + 1, shift + 7
            if not b & 0x80:
                return (value >> 1) ^ -(value & 1), pos
    count, pos = varint(0)
    if count == 0:
        return (0,), view[pos:]
    if count < 0 or count > 100:
        raise ValueError(f"{count} message indexes")
    out = []
    for _ in range(count):
        i, pos = varint(pos)
        out.append(i)
    return tuple(out), view[pos:]


def subject_for(strategy: str, topic: str, part: str, record_name: str | None) -> str | None:
    """The subject a record's schema must be a version of (None: the strategy needs a record name
    the schema does not give)."""
    if strategy == "TopicNameStrategy":
        return f"{topic}-{part}"
    if record_name is None:
        return None
    return record_name if strategy == "RecordNameStrategy" else f"{topic}-{record_name}"


# --- decoders, one per format ---------------------------------------------------------------


def _avro_decoder(parsed: AvroSchema) -> Decoder:
    named: dict[str, Any] = {}
    for dep in parsed.deps:
        fastavro.parse_schema(dep, named_schemas=named)
    schema = fastavro.parse_schema(parsed.raw, named_schemas=named)

    def decode(payload: memoryview, _: tuple[int, ...]) -> str | None:
        buf = io.BytesIO(payload)
        try:
            fastavro.schemaless_reader(buf, schema, None)
        except Exception as e:   # fastavro raises what the bytes make it raise (EOFError, ValueError, ...)
            return f"does not decode as Avro: {type(e).__name__} {e}"
        if buf.tell() != len(payload):
            return f"{len(payload) - buf.tell()} bytes after the Avro record"
        return None
    return decode


def _json_decoder(parsed: JsonSchema) -> Decoder:
    """jsonschema-rs (compiled) decides; a failing document's first error names the field."""
    registry = jsonschema_rs.Registry(list(parsed.docs.items())) if parsed.docs else None
    try:
        validator = jsonschema_rs.validator_for(parsed.raw, registry=registry)
    except (ValueError, jsonschema_rs.ReferencingError) as e:
        raise SchemaError(INVALID_SCHEMA, f"Invalid schema: {e}") from None

    def decode(payload: memoryview, _: tuple[int, ...]) -> str | None:
        try:
            doc = json.loads(payload.tobytes())
        except ValueError as e:
            return f"not JSON: {e}"
        if validator.is_valid(doc):
            return None
        error = next(iter(validator.iter_errors(doc)))
        where = "/".join(str(p) for p in error.instance_path)
        return f"field /{where}: {error.message}" if where else error.message
    return decode


def _protobuf_decoder(parsed: ProtobufSchema) -> Decoder:
    fd = parsed.pool().FindFileByName(parsed.file.name)
    top = list(fd.message_types_by_name.values())
    classes: dict[tuple[int, ...], Any] = {}

    def message_class(indexes: tuple[int, ...]) -> Any:
        cls = classes.get(indexes)
        if cls is None:
            d = top[indexes[0]]
            for i in indexes[1:]:
                d = d.nested_types[i]
            cls = classes[indexes] = message_factory.GetMessageClass(d)
        return cls

    def decode(payload: memoryview, indexes: tuple[int, ...]) -> str | None:
        try:
            cls = message_class(indexes)
        except IndexError:
            return f"message indexes {list(indexes)} name no message of the schema"
        try:
            cls.FromString(bytes(payload))
        except Exception as e:   # protobuf's DecodeError, and what a broken wire format raises
            return f"does not decode as {cls.DESCRIPTOR.full_name}: {e}"
        return None
    return decode


def _record_name(parsed: Any, indexes: tuple[int, ...]) -> str | None:
    if isinstance(parsed, AvroSchema):
        return parsed.root.fullname if isinstance(parsed.root, Named) else None
    if isinstance(parsed, ProtobufSchema):
        try:
            d = list(parsed.pool().FindFileByName(parsed.file.name).message_types_by_name.values())[indexes[0]]
            for i in indexes[1:]:
                d = d.nested_types[i]
            return str(d.full_name)
        except IndexError:
            return None
    title = parsed.raw.get("title") if isinstance(parsed.raw, dict) else None
    return title if isinstance(title, str) else None


@dataclass(frozen=True)
class _Known:
    parsed: Any
    decode: Decoder


@dataclass
class _Batch:
    """What one check of one batch looked up once: decoders by id, subject verdicts by (id, indexes)."""

    topic: str
    part: str
    strategy: str
    decoders: dict[int, _Known | str] = field(default_factory=dict)
    refusals: dict[tuple[int, tuple[int, ...]], str | None] = field(default_factory=dict)


class Checker:
    """The payload check over one broker's registry (thread-safe; blocking: call it in a thread)."""

    def __init__(self, registry: SchemaRegistry, *, subject_ttl_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._registry = registry
        self._ttl = subject_ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._known: dict[int, _Known | str] = {}                    # id -> decoder, or why none
        self._subjects: dict[str, tuple[float, frozenset[int]]] = {}   # subject -> (read at, ids)

    def check(self, topic: str, cfg: TopicConfig, records: Sequence[LogMessage]) -> list[Failure]:
        """The records of `records` (indexes into it) that fail the topic's checks."""
        parts = [(p, strategy) for p, on, strategy in (
            ("key", cfg.key_schema_validation, cfg.key_subject_name_strategy),
            ("value", cfg.value_schema_validation, cfg.value_subject_name_strategy)) if on]
        failures: dict[int, Failure] = {}
        for part, strategy in parts:
            batch = _Batch(topic, part, strategy)
            for i, r in enumerate(records):
                if i not in failures:
                    why = self._one(batch, r.key if part == "key" else r.value)
                    if why is not None:
                        failures[i] = Failure(i, part, *why)
        return [failures[i] for i in sorted(failures)]

    def _one(self, batch: _Batch, data: bytes | None) -> tuple[str, int | None] | None:
        framed = frame(data)
        if isinstance(framed, str):
            return framed, None
        schema_id, rest = framed
        known = batch.decoders.get(schema_id)
        if known is None:
            known = batch.decoders[schema_id] = self._decoder(schema_id)
        if isinstance(known, str):
            return known, schema_id
        indexes: tuple[int, ...] = ()
        if isinstance(known.parsed, ProtobufSchema):
            try:
                indexes, rest = message_indexes(rest)
            except ValueError as e:
                return f"bad Protobuf message indexes: {e}", schema_id
        key = (schema_id, indexes)
        if key not in batch.refusals:
            batch.refusals[key] = self._subject_refusal(batch, schema_id, known, indexes)
        refusal = batch.refusals[key]
        if refusal is not None:
            return refusal, schema_id
        why = known.decode(rest, indexes)
        return None if why is None else (why, schema_id)

    def _subject_refusal(self, batch: _Batch, schema_id: int, known: _Known, indexes: tuple[int, ...]) -> str | None:
        """Why `schema_id` may not be used on this topic (None: it is a version of its subject)."""
        subject = subject_for(batch.strategy, batch.topic, batch.part, _record_name(known.parsed, indexes))
        if subject is None:
            return f"the schema gives no record name for {batch.strategy}"
        if schema_id not in self._ids_of(subject):
            return f"schema id {schema_id} is not registered under subject {subject}"
        return None

    def _decoder(self, schema_id: int) -> _Known | str:
        with self._lock:
            known = self._known.get(schema_id)
        if known is not None:
            return known
        try:
            parsed = self._registry.parsed(schema_id)
            make = (_avro_decoder if isinstance(parsed, AvroSchema) else
                    _protobuf_decoder if isinstance(parsed, ProtobufSchema) else _json_decoder)
            known = _Known(parsed, make(parsed))
        except SchemaError as e:
            if e.code == 40403:
                return f"unknown schema id {schema_id}"   # not kept: it may be registered in a moment
            return f"schema id {schema_id} cannot be used: {e}"   # e.g. a reference since deleted
        with self._lock:
            self._known[schema_id] = known
        return known

    def _ids_of(self, subject: str) -> frozenset[int]:
        now = self._clock()
        with self._lock:
            got = self._subjects.get(subject)
        if got is not None and now - got[0] < self._ttl:
            return got[1]
        try:
            ids = frozenset(self._registry.ids_of(subject))
        except SchemaError as e:
            if e.code != 40401:
                raise
            ids = frozenset()
        with self._lock:
            self._subjects[subject] = (now, ids)
        return ids
