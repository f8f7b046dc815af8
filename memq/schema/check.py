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
import numpy as np
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


# --- decoders, one per format: each checks many payloads in one call -------------------------
#
# `Many(data, at, skip)`: for the records `at` (indexes into `data`), whose payload starts `skip`
# bytes into each value (after the magic byte, the id, and Protobuf's indexes), the ones that do
# not decode, with why. One call per group of records of one schema: the per-record work left is
# the compiled decoder's own call and a loop in one frame.
Many = Callable[[Sequence[Any], Sequence[int], int], list[tuple[int, str]]]


def _avro_decoder(parsed: AvroSchema) -> Many:
    """The compiled walk (`avro_walk`) passes a group's payloads in one call; fastavro decodes
    only those it fails (its verdict and message stand), or all of them when the schema has no
    walk, numba is not installed (the broker role does not need it), or the group is too small
    to pay for gathering its bytes."""
    named: dict[str, Any] = {}
    for dep in parsed.deps:
        fastavro.parse_schema(dep, named_schemas=named)
    schema = fastavro.parse_schema(parsed.raw, named_schemas=named)
    walker = _avro_walker(schema, named)
    read = fastavro.schemaless_reader
    new = io.BytesIO

    def why(value: Any, skip: int) -> str | None:
        buf = new(value)   # shares the bytes: no copy
        buf.seek(skip)
        try:
            read(buf, schema, None)
        except Exception as e:   # fastavro raises what the bytes make it raise (EOFError, ValueError, ...)
            return f"does not decode as Avro: {type(e).__name__} {e}"
        return None if buf.tell() == len(value) else f"{len(value) - buf.tell()} bytes after the Avro record"

    def decode(data: Sequence[Any], at: Sequence[int], skip: int) -> list[tuple[int, str]]:
        suspects: Sequence[int] = at
        if walker is not None and len(at) >= _WALK_FROM:
            walk, code = walker
            values = [data[i] for i in at]
            bounds = np.zeros(len(values) + 1, dtype=np.int64)
            np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=len(values)), out=bounds[1:])
            ok = walk(np.frombuffer(b"".join(values), dtype=np.uint8), bounds, skip, code)
            suspects = [at[k] for k in np.flatnonzero(~ok).tolist()]
        return [(i, w) for i in suspects if (w := why(data[i], skip)) is not None]
    return decode


def _avro_walker(schema: Any, named: dict[str, Any]) -> tuple[Callable[..., np.ndarray], np.ndarray] | None:
    """`avro_walk.walk` and the schema's program; None where numba is not installed or the
    schema has no walk."""
    try:
        from memq.schema import avro_walk   # numba: imported on first use, where installed
    except ImportError:
        return None
    try:
        return avro_walk.walk, avro_walk.program(schema, named)
    except avro_walk.Unwalkable:
        return None


#: Groups smaller than this are decoded by fastavro alone (the walk's fixed cost is a few us).
_WALK_FROM = 8


def _json_decoder(parsed: JsonSchema) -> Many:
    """jsonschema-rs (compiled) decides, over all the documents at once (an array of them against
    an array of the schema); only a group that fails is gone through one by one, and a failing
    document's first error names the field."""
    registry = jsonschema_rs.Registry(list(parsed.docs.items())) if parsed.docs else None
    try:
        validator = jsonschema_rs.validator_for(parsed.raw, registry=registry)
        many = _array_validator(parsed.raw, registry)
    except (ValueError, jsonschema_rs.ReferencingError) as e:
        raise SchemaError(INVALID_SCHEMA, f"Invalid schema: {e}") from None
    loads = json.loads

    def one(doc: Any) -> str | None:
        if validator.is_valid(doc):
            return None
        error = next(iter(validator.iter_errors(doc)))
        where = "/".join(str(p) for p in error.instance_path)
        return f"field /{where}: {error.message}" if where else error.message

    def decode(data: Sequence[Any], at: Sequence[int], skip: int) -> list[tuple[int, str]]:
        try:
            docs = [loads(data[i][skip:]) for i in at]
        except ValueError:
            docs = None
        if docs is not None and (many.is_valid(docs) if many is not None else all(map(validator.is_valid, docs))):
            return []
        bad: list[tuple[int, str]] = []
        for i in at:
            try:
                doc = loads(data[i][skip:])
            except ValueError as e:
                bad.append((i, f"not JSON: {e}"))
                continue
            why = one(doc)
            if why is not None:
                bad.append((i, why))
        return bad
    return decode


def _array_validator(raw: Any, registry: Any) -> Any:
    """A validator of an array of documents each valid against `raw` (the schema's own keywords
    kept at its root, so its `$ref`s, `$id` and `$defs` resolve as they would alone), or None
    when the schema is a boolean or uses the root in a way wrapping could change (`$ref` to "#")."""
    if not isinstance(raw, dict) or not _refs_stay(raw):
        return None
    schema = dict(raw)
    keep = {k: schema.pop(k) for k in ("$schema", "$id", "id", "$defs", "definitions") if k in schema}
    if not schema:   # only definitions: every document is valid
        return None
    return jsonschema_rs.validator_for({**keep, "type": "array", "items": schema}, registry=registry)


def _refs_stay(node: Any) -> bool:
    """No `$ref` of the schema points into its root's own keywords (only into `$defs` or
    `definitions`, or out of the document), and no dynamic or recursive anchor: so the schema
    means the same as an array's `items`."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("$dynamicAnchor", "$recursiveAnchor", "$dynamicRef", "$recursiveRef"):
                return False
            if k == "$ref" and isinstance(v, str) and v.startswith("#") and \
                    not v.startswith(("#/$defs/", "#/definitions/")):
                return False
            if not _refs_stay(v):
                return False
    elif isinstance(node, list):
        return all(map(_refs_stay, node))
    return True


def _protobuf_decoder(parsed: ProtobufSchema) -> Callable[[tuple[int, ...]], Many | str]:
    """The decoder of the message some indexes name (or why they name none)."""
    fd = parsed.pool().FindFileByName(parsed.file.name)
    top = list(fd.message_types_by_name.values())
    decoders: dict[tuple[int, ...], Many | str] = {}

    def of(indexes: tuple[int, ...]) -> Many | str:
        got = decoders.get(indexes)
        if got is None:
            try:
                d = top[indexes[0]]
                for i in indexes[1:]:
                    d = d.nested_types[i]
            except IndexError:
                got = f"message indexes {list(indexes)} name no message of the schema"
            else:
                got = _protobuf_message(message_factory.GetMessageClass(d))
            decoders[indexes] = got
        return got
    return of


def _protobuf_message(cls: Any) -> Many:
    parse = cls.FromString
    name = cls.DESCRIPTOR.full_name

    def decode(data: Sequence[Any], at: Sequence[int], skip: int) -> list[tuple[int, str]]:
        bad: list[tuple[int, str]] = []
        for i in at:
            try:
                parse(data[i][skip:])
            except Exception as e:   # protobuf's DecodeError, and what a broken wire format raises
                bad.append((i, f"does not decode as {name}: {e}"))
        return bad
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
    decode: Any    # Many (Avro, JSON), or Protobuf's: indexes -> Many | why


@dataclass(frozen=True, slots=True)
class Fields:
    """What a check reads of a batch's records: their keys and values (None: null), by index."""

    keys: Sequence[bytes | None]
    values: Sequence[bytes | None]

    @staticmethod
    def of(records: Sequence[LogMessage]) -> Fields:
        return Fields([r.key for r in records], [r.value for r in records])

    def __len__(self) -> int:
        return len(self.values)


@dataclass
class _Batch:
    """What one check of one batch looked up once: decoders by id, subject verdicts by (id, indexes)."""

    topic: str
    part: str
    strategy: str
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

    def check(self, topic: str, cfg: TopicConfig, records: Sequence[LogMessage] | Fields) -> list[Failure]:
        """The records (indexes into `records`) that fail the topic's checks; a record whose key
        fails is not also checked by its value."""
        fields = records if isinstance(records, Fields) else Fields.of(records)
        failures: dict[int, Failure] = {}
        for part, on, strategy, data in (
                ("key", cfg.key_schema_validation, cfg.key_subject_name_strategy, fields.keys),
                ("value", cfg.value_schema_validation, cfg.value_subject_name_strategy, fields.values)):
            if on:
                for f in self._part(_Batch(topic, part, strategy), data):
                    failures.setdefault(f.index, f)
        return [failures[i] for i in sorted(failures)]

    def _part(self, batch: _Batch, data: Sequence[bytes | None]) -> list[Failure]:
        """One part's failures: the records grouped by their first five bytes (magic byte and
        id: usually one group), each group's framing, schema and subject looked up once, then its
        payloads decoded in one call."""
        heads = [v[:5] if v else b"" for v in data]
        groups: dict[bytes, list[int]]
        first = heads[0] if heads else b""
        if heads.count(first) == len(heads):
            groups = {first: list(range(len(heads)))} if heads else {}
        else:
            groups = {}
            for i, h in enumerate(heads):
                groups.setdefault(h, []).append(i)
        out: list[Failure] = []
        for head, at in groups.items():
            framed = frame(head)
            if isinstance(framed, str):
                out += (Failure(i, batch.part, framed, None) for i in at)   # decided by the first 5 bytes
                continue
            schema_id = framed[0]
            known = self._decoder(schema_id)
            if isinstance(known, str):
                out += (Failure(i, batch.part, known, schema_id) for i in at)
                continue
            if isinstance(known.parsed, ProtobufSchema):
                out += self._protobuf(batch, schema_id, known, data, at)
                continue
            refusal = self._refusal(batch, schema_id, known, ())
            if refusal is not None:
                out += (Failure(i, batch.part, refusal, schema_id) for i in at)
                continue
            out += (Failure(i, batch.part, why, schema_id) for i, why in known.decode(data, at, 5))
        return out

    def _protobuf(self, batch: _Batch, schema_id: int, known: _Known, data: Sequence[Any],
                  at: list[int]) -> list[Failure]:
        """A Protobuf group: records whose indexes are the single `0` (the first message, what
        nearly every serializer writes) decoded together; others grouped by their indexes."""
        groups: dict[tuple[tuple[int, ...], int], list[int]] = {}   # (indexes, payload start) -> records
        out: list[Failure] = []
        plain = [i for i in at if len(data[i]) > 5 and data[i][5] == 0]
        if plain:
            groups[(0,), 6] = plain
        if len(plain) != len(at):
            taken = set(plain)
            for i in at:
                if i not in taken:
                    try:
                        indexes, rest = message_indexes(memoryview(data[i])[5:])
                    except ValueError as e:
                        out.append(Failure(i, batch.part, f"bad Protobuf message indexes: {e}", schema_id))
                        continue
                    groups.setdefault((indexes, len(data[i]) - len(rest)), []).append(i)
        for (indexes, skip), members in groups.items():
            decode = known.decode(indexes)
            if isinstance(decode, str):
                out += (Failure(i, batch.part, decode, schema_id) for i in members)
                continue
            refusal = self._refusal(batch, schema_id, known, indexes)
            if refusal is not None:
                out += (Failure(i, batch.part, refusal, schema_id) for i in members)
                continue
            out += (Failure(i, batch.part, why, schema_id) for i, why in decode(data, sorted(members), skip))
        return out

    def _refusal(self, batch: _Batch, schema_id: int, known: _Known, indexes: tuple[int, ...]) -> str | None:
        key = (schema_id, indexes)
        if key not in batch.refusals:
            batch.refusals[key] = self._subject_refusal(batch, schema_id, known, indexes)
        return batch.refusals[key]

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
