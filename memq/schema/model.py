"""The registry's data, pure: a schema as registered, a subject's versions, and Confluent's codes.

A `Schema` is what a client registers: its type (AVRO, JSON, PROTOBUF), its text, its references
(other subjects' versions it names), and `metadata` and `ruleSet` kept exactly as given. Its
`fingerprint` covers all five, so the same schema registered under two subjects is one id, and a
schema whose metadata changed is another. A `SubjectRecord` is a subject's versions in order:
each a number, the id it names and whether it is soft-deleted.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from memq.errors import SchemaError

TYPES = ("JSON", "PROTOBUF", "AVRO")   # GET /schemas/types answers in this order, as Confluent's
MODES = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE")
REGISTRY_MODES = ("READWRITE", "READONLY", "READONLY_OVERRIDE", "IMPORT")
DEFAULT_COMPATIBILITY = "BACKWARD"
DEFAULT_MODE = "READWRITE"
MAX_SCHEMA_CHARS = 512 * 1024   # a znode holds at most ~1 MiB (DECISIONS.md: texts in ZooKeeper)

def guid_of(cluster: str, schema_id: int) -> str:
    """The GUID of id `schema_id` in `cluster`'s registry (what newer serializers write in a
    header and ask `/schemas/guids/{guid}` for): a UUIDv8 of 8 bytes of the cluster name's hash
    and the id, so it is unique across clusters and maps back to its id with no stored index."""
    head = bytearray(hashlib.sha256(cluster.encode()).digest()[:8])
    head[6] = 0x80 | (head[6] & 0x0F)                      # version 8
    tail = (0x8000_0000_0000_0000 | schema_id).to_bytes(8, "big")   # variant 10; ids < 2^62
    return str(uuid.UUID(bytes=bytes(head) + tail))


def id_of_guid(cluster: str, guid: str) -> int | None:
    """The id `guid` names in `cluster`'s registry; None when it is not one of its GUIDs."""
    try:
        raw = uuid.UUID(guid).bytes
    except ValueError:
        return None
    schema_id = int.from_bytes(raw[8:], "big") & ((1 << 62) - 1)
    return schema_id if guid_of(cluster, schema_id) == str(uuid.UUID(bytes=raw)) else None


# Confluent's error codes (the HTTP status is the first three digits)
SUBJECT_NOT_FOUND = 40401
VERSION_NOT_FOUND = 40402
SCHEMA_NOT_FOUND = 40403
SUBJECT_SOFT_DELETED = 40404
SUBJECT_NOT_SOFT_DELETED = 40405
VERSION_SOFT_DELETED = 40406
VERSION_NOT_SOFT_DELETED = 40407
SUBJECT_COMPATIBILITY_NOT_CONFIGURED = 40408
SUBJECT_MODE_NOT_CONFIGURED = 40409
INCOMPATIBLE = 409
INVALID_SCHEMA = 42201
INVALID_VERSION = 42202
INVALID_COMPATIBILITY = 42203
INVALID_MODE = 42204
OPERATION_NOT_PERMITTED = 42205
REFERENCE_EXISTS = 42206
ID_IN_USE = 42207
UNPROCESSABLE = 422
STORE_ERROR = 50001
TIMEOUT = 50002


@dataclass(frozen=True, slots=True)
class SchemaReference:
    """A named reference: `name` as the schema's text uses it (an Avro full name, a Protobuf
    import path, a JSON `$ref` URL) and the subject version that defines it."""

    name: str
    subject: str
    version: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "subject": self.subject, "version": self.version}


@dataclass(frozen=True)
class Schema:
    schema_type: str
    text: str
    references: tuple[SchemaReference, ...] = ()
    metadata: Any = None    # stored and returned as given
    rule_set: Any = None    # stored and returned as given

    @property
    def fingerprint(self) -> str:
        """sha256 over type, text, references, metadata and ruleSet: one id per distinct schema."""
        blob = json.dumps([self.schema_type, self.text, [r.to_json() for r in self.references],
                           self.metadata, self.rule_set], sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        """As Confluent answers it: schemaType left out for AVRO, empty parts left out."""
        d: dict[str, Any] = {}
        if self.schema_type != "AVRO":
            d["schemaType"] = self.schema_type
        d["schema"] = self.text
        if self.references:
            d["references"] = [r.to_json() for r in self.references]
        if self.metadata is not None:
            d["metadata"] = self.metadata
        if self.rule_set is not None:
            d["ruleSet"] = self.rule_set
        return d

    def stored(self) -> dict[str, Any]:
        """The JSON kept in the store (every field, type included)."""
        return {**self.to_json(), "schemaType": self.schema_type}

    def with_text(self, text: str) -> Schema:
        return replace(self, text=text)


def schema_from_json(body: Any, where: str = "request") -> Schema:
    """A Schema from a register/lookup/compatibility request body (or a stored one): 42201 or
    422 with Confluent's wording when it is not one."""
    if not isinstance(body, Mapping):
        raise SchemaError(UNPROCESSABLE, f"{where}: the body must be a JSON object")
    text = body.get("schema")
    if not isinstance(text, str) or not text.strip():
        raise SchemaError(INVALID_SCHEMA, f"{where}: Empty schema")
    if len(text) > MAX_SCHEMA_CHARS:
        raise SchemaError(INVALID_SCHEMA, f"{where}: schema of {len(text)} characters, over {MAX_SCHEMA_CHARS}")
    schema_type = body.get("schemaType") or "AVRO"
    if not isinstance(schema_type, str) or schema_type.upper() not in TYPES:
        raise SchemaError(UNPROCESSABLE, f"{where}: unknown schemaType {schema_type!r}: one of {', '.join(TYPES)}")
    refs = body.get("references") or []
    if not isinstance(refs, list):
        raise SchemaError(UNPROCESSABLE, f"{where}: references must be a list")
    out = []
    for r in refs:
        try:
            out.append(SchemaReference(str(r["name"]), str(r["subject"]), int(r["version"])))
        except (KeyError, TypeError, ValueError):
            raise SchemaError(UNPROCESSABLE, f"{where}: a reference needs name, subject and version: {r!r}") from None
    return Schema(schema_type.upper(), text, tuple(out), body.get("metadata"), body.get("ruleSet"))


@dataclass(frozen=True, slots=True)
class SubjectVersion:
    version: int
    id: int
    deleted: bool = False


@dataclass(frozen=True)
class SubjectRecord:
    """A subject's versions, in registration order (numbers only grow, even past a permanent delete)."""

    versions: tuple[SubjectVersion, ...] = ()
    next_version: int = 1   # a permanently deleted subject registered again goes on from 1 (as Confluent)

    def live(self) -> list[SubjectVersion]:
        return [v for v in self.versions if not v.deleted]

    def visible(self, deleted: bool) -> list[SubjectVersion]:
        return list(self.versions) if deleted else self.live()

    def find(self, version: int, *, deleted: bool = False) -> SubjectVersion | None:
        """Version `version` (-1: the latest live one, or the latest of all when `deleted`)."""
        pool = self.visible(deleted)
        if version == -1:
            return pool[-1] if pool else None
        return next((v for v in pool if v.version == version), None)

    def added(self, schema_id: int, version: int | None = None) -> SubjectRecord:
        """A version naming `schema_id` appended: the next number, or `version` (IMPORT mode keeps
        a given one; it must be above every number used)."""
        number = self.next_version if version is None else version
        if number < self.next_version:
            raise SchemaError(INVALID_VERSION, f"version {number} is not above the subject's versions")
        return SubjectRecord(self.versions + (SubjectVersion(number, schema_id),), number + 1)

    def soft_deleted(self, version: int | None) -> SubjectRecord:
        """Version `version` (None: every one) soft-deleted."""
        return replace(self, versions=tuple(replace(v, deleted=True) if version in (None, v.version) else v
                                            for v in self.versions))

    def without(self, version: int) -> SubjectRecord:
        """Version `version` permanently deleted."""
        return replace(self, versions=tuple(v for v in self.versions if v.version != version))

    def to_json(self) -> dict[str, Any]:
        return {"v": 1, "next": self.next_version, "versions": [[v.version, v.id, v.deleted] for v in self.versions]}


def subject_from_json(d: Mapping[str, Any]) -> SubjectRecord:
    return SubjectRecord(tuple(SubjectVersion(int(n), int(i), bool(x)) for n, i, x in d["versions"]), int(d["next"]))


def parse_version(raw: str) -> int:
    """A version as a path gives it: a positive number, `latest` or -1 (the latest), else 42202."""
    if raw == "latest":
        return -1
    try:
        v = int(raw)
    except ValueError:
        v = 0
    if v == -1 or 1 <= v <= 2**31 - 1:
        return v
    raise SchemaError(INVALID_VERSION, f"The specified version '{raw}' is not a valid version id. Allowed values "
                                       "are between [1, 2^31-1] and the string \"latest\"")

