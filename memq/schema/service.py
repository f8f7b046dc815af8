"""The registry's operations over a `SchemaStore`: what each of Confluent's REST calls answers.

Every method is blocking (a ZooKeeper store) and either returns the JSON body Confluent's
registry answers or raises `SchemaError` with Confluent's error code and message. Subjects,
configs and modes are read from the store on every call, so every broker answers the same; only
schemas by id are kept (bounded, least recently used first out): an id never changes meaning.
A write that lost a race with another broker (SchemaConflictError) is read and decided again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from memq.errors import SchemaConflictError, SchemaError

from . import compat
from .model import (DEFAULT_COMPATIBILITY, DEFAULT_MODE, INCOMPATIBLE, INVALID_MODE, INVALID_SCHEMA,
                    OPERATION_NOT_PERMITTED, REFERENCE_EXISTS, REGISTRY_MODES, SCHEMA_NOT_FOUND,
                    SUBJECT_COMPATIBILITY_NOT_CONFIGURED, SUBJECT_MODE_NOT_CONFIGURED, SUBJECT_NOT_FOUND,
                    SUBJECT_NOT_SOFT_DELETED, SUBJECT_SOFT_DELETED, TYPES, UNPROCESSABLE, VERSION_NOT_FOUND,
                    VERSION_NOT_SOFT_DELETED, VERSION_SOFT_DELETED, Schema, SubjectRecord, SubjectVersion, guid_of, id_of_guid,
                    schema_from_json)
from .store import SchemaStore

T = TypeVar("T")
#: kind -> (its value when nothing is set, the code of a subject without one of its own, its name in that message)
SETTING_DEFAULTS: dict[str, tuple[dict[str, Any], int, str]] = {
    "config": ({"compatibilityLevel": DEFAULT_COMPATIBILITY}, SUBJECT_COMPATIBILITY_NOT_CONFIGURED, "compatibility"),
    "mode": ({"mode": DEFAULT_MODE}, SUBJECT_MODE_NOT_CONFIGURED, "mode"),
}
RETRIES = 20   # conflicting writes by other brokers before giving up (each one made progress)


class SchemaRegistry:
    def __init__(self, store: SchemaStore, *, cluster: str = "", cache_size: int = 10_000) -> None:
        self.store = store
        self.cluster = cluster   # names its GUIDs (`model.guid_of`)
        self._cache_size = cache_size
        self._schemas: OrderedDict[int, Schema] = OrderedDict()
        self._parsed: OrderedDict[int, Any] = OrderedDict()

    # --- schemas by id ---------------------------------------------------------------------

    def types(self) -> list[str]:
        return list(TYPES)

    def schema(self, schema_id: int) -> Schema:
        """The schema `schema_id` names, from the cache or the store; 40403 if none."""
        s = self._schemas.get(schema_id)
        if s is not None:
            self._schemas.move_to_end(schema_id)
            return s
        s = self.store.schema(schema_id)
        if s is None:
            raise SchemaError(SCHEMA_NOT_FOUND, f"Schema {schema_id} not found")
        self._keep(self._schemas, schema_id, s)
        return s

    def _keep(self, cache: OrderedDict[int, T], key: int, value: T) -> None:
        cache[key] = value
        if len(cache) > self._cache_size:
            cache.popitem(last=False)

    def parsed(self, schema_id: int) -> Any:
        """The schema `schema_id` names, parsed with its references (kept like the texts)."""
        p = self._parsed.get(schema_id)
        if p is None:
            p = self._parse(self.schema(schema_id))
            self._keep(self._parsed, schema_id, p)
        return p

    def _parse(self, schema: Schema, depth: int = 0) -> Any:
        fmt = compat.format_of(schema.schema_type)
        if depth > 32:
            raise SchemaError(INVALID_SCHEMA, "Invalid schema: references nest deeper than 32")
        refs = []
        for r in schema.references:
            rec, _ = self.store.subject(r.subject)
            v = rec.find(r.version, deleted=True) if rec is not None else None
            if v is None:
                raise SchemaError(INVALID_SCHEMA, f"Invalid schema: reference {r.name!r} to subject {r.subject!r} "
                                                  f"version {r.version} not found")
            refs.append(fmt.named(self._parse(self.schema(v.id), depth + 1), r.name))
        return fmt.parse(schema.text, refs)

    def schema_by_id(self, schema_id: int, fmt: str | None = None) -> dict[str, Any]:
        return self._formatted(schema_id, fmt).to_json()

    def schema_by_guid(self, guid: str, fmt: str | None = None) -> dict[str, Any]:
        """GET /schemas/guids/{guid}: as by id, with its id and GUID; 40403 for a GUID of no schema here."""
        schema_id = id_of_guid(self.cluster, guid)
        if schema_id is None:
            raise SchemaError(SCHEMA_NOT_FOUND, f"Schema {guid} not found")
        return {"id": schema_id, "guid": guid, **self.schema_by_id(schema_id, fmt)}

    def _formatted(self, schema_id: int, fmt: str | None) -> Schema:
        """The schema as `format=` asks: `serialized` gives a Protobuf schema as a base64
        FileDescriptorProto (what confluent-kafka's Python client reads); else as stored."""
        s = self.schema(schema_id)
        if fmt == "serialized" and s.schema_type == "PROTOBUF":
            return s.with_text(self.parsed(schema_id).serialized())
        return s

    def _uses(self, schema_id: int, deleted: bool) -> list[dict[str, Any]]:
        self.schema(schema_id)   # 40403 for an unknown id
        out = []
        for name in self.store.subjects():
            rec, _ = self.store.subject(name)
            for v in rec.visible(deleted) if rec is not None else ():
                if v.id == schema_id:
                    out.append({"subject": name, "version": v.version})
        return out

    def subjects_of_id(self, schema_id: int, deleted: bool = False) -> list[str]:
        return list(dict.fromkeys(u["subject"] for u in self._uses(schema_id, deleted)))

    def versions_of_id(self, schema_id: int, deleted: bool = False) -> list[dict[str, Any]]:
        return self._uses(schema_id, deleted)

    # --- subjects ----------------------------------------------------------------------------

    def subjects(self, prefix: str = "", deleted: bool = False) -> list[str]:
        out = []
        for name in self.store.subjects():
            if name.startswith(prefix):
                rec, _ = self.store.subject(name)
                if rec is not None and rec.visible(deleted):
                    out.append(name)
        return out

    def schemas(self, prefix: str = "", deleted: bool = False, latest_only: bool = False) -> list[dict[str, Any]]:
        """GET /schemas: every version of the subjects under `prefix` (or each one's latest)."""
        out = []
        for name in self.subjects(prefix, deleted):
            rec, _ = self.store.subject(name)
            versions = rec.visible(deleted) if rec is not None else []
            out += [self._answer(name, v) for v in (versions[-1:] if latest_only else versions)]
        return out

    def _record(self, subject: str, deleted: bool = False) -> tuple[SubjectRecord, int]:
        rec, zv = self.store.subject(subject)
        if rec is None or not rec.visible(deleted):
            raise SchemaError(SUBJECT_NOT_FOUND, f"Subject '{subject}' not found.")
        return rec, zv

    def _version(self, subject: str, version: int, deleted: bool = False) -> SubjectVersion:
        rec, _ = self._record(subject, deleted)
        v = rec.find(version, deleted=deleted)
        if v is None:
            raise SchemaError(VERSION_NOT_FOUND, f"Version {version} not found.")
        return v

    def _answer(self, subject: str, v: SubjectVersion, fmt: str | None = None) -> dict[str, Any]:
        return {"subject": subject, "version": v.version, "id": v.id, **self._formatted(v.id, fmt).to_json()}

    def versions(self, subject: str, deleted: bool = False) -> list[int]:
        rec, _ = self._record(subject, deleted)
        return [v.version for v in rec.visible(deleted)]

    def ids_of(self, subject: str) -> list[int]:
        """The ids of the subject's live versions (40401 if it has none)."""
        rec, _ = self._record(subject)
        return [v.id for v in rec.live()]

    def version(self, subject: str, version: int, deleted: bool = False, fmt: str | None = None) -> dict[str, Any]:
        return self._answer(subject, self._version(subject, version, deleted), fmt)

    def referenced_by(self, subject: str, version: int) -> list[int]:
        """The ids of live versions whose schemas reference this version."""
        v = self._version(subject, version, deleted=True)
        out: set[int] = set()
        for name in self.store.subjects():
            rec, _ = self.store.subject(name)
            for other in rec.live() if rec is not None else ():
                if any(r.subject == subject and r.version in (v.version, -1) for r in self.schema(other.id).references):
                    out.add(other.id)
        return sorted(out)

    def _text(self, schema: Schema, normalize: bool) -> tuple[Schema, Any]:
        """`schema` with the text the store keeps (compact; normalised if asked), and parsed."""
        parsed = self._parse(schema)
        return schema.with_text(parsed.normalized() if normalize else parsed.canonical()), parsed

    def _normalize(self, subject: str, asked: bool) -> bool:
        return asked or bool((self._setting("config", subject) or {}).get("normalize"))

    def register(self, subject: str, body: Any, normalize: bool = False) -> dict[str, Any]:
        """POST /subjects/{subject}/versions: {"id": n, "guid": g}; 409 with the reasons, 42201, 42205."""
        schema = schema_from_json(body)
        wanted_id, wanted_version = _optional_int(body, "id"), _optional_int(body, "version")
        mode = self.mode_of(subject)
        if mode in ("READONLY", "READONLY_OVERRIDE"):
            raise SchemaError(OPERATION_NOT_PERMITTED, f"Subject {subject} is in read-only mode")
        if wanted_id is not None and mode != "IMPORT" and wanted_id >= 0:
            raise SchemaError(OPERATION_NOT_PERMITTED, f"Subject {subject} is not in import mode: an id "
                                                       "may be given only in IMPORT mode")
        schema, parsed = self._text(schema, self._normalize(subject, normalize))
        schema_id = self._retry(lambda: self._register(subject, schema, parsed, mode, wanted_id, wanted_version))
        return {"id": schema_id, "guid": guid_of(self.cluster, schema_id)}

    def _register(self, subject: str, schema: Schema, parsed: Any, mode: str, wanted_id: int | None,
                  wanted_version: int | None) -> int:
        rec, zv = self.store.subject(subject)
        rec = rec or SubjectRecord()
        known = self.store.id_of(schema.fingerprint)
        live = rec.live()
        if wanted_id is None and known is not None and any(v.id == known for v in live):
            return known   # registered already: its id, no new version
        if mode != "IMPORT":
            fmt = compat.format_of(schema.schema_type)
            earlier = [compat.Earlier(v.version, self.parsed(v.id), self.schema(v.id).text) for v in live
                       if self.schema(v.id).schema_type == schema.schema_type]
            if len(earlier) != len(live):
                reasons = [f"Incompatible schema type: {schema.schema_type} after "
                           f"{self.schema(live[-1].id).schema_type}"]
            else:
                reasons = compat.check(fmt, parsed, earlier, self.compatibility_of(subject))
            if reasons:
                raise SchemaError(INCOMPATIBLE, "Schema being registered is incompatible with an earlier schema for "
                                                f"subject \"{subject}\", details: [{', '.join(reasons)}]")
        return self.store.add_version(subject, rec, zv, schema, wanted_id, wanted_version)

    def lookup(self, subject: str, body: Any, normalize: bool = False, deleted: bool = False) -> dict[str, Any]:
        """POST /subjects/{subject}: the version holding this schema; 40401, 40403."""
        rec, _ = self._record(subject, deleted)
        schema = schema_from_json(body)
        for norm in dict.fromkeys((self._normalize(subject, normalize), False, True)):
            candidate, _ = self._text(schema, norm)
            schema_id = self.store.id_of(candidate.fingerprint)
            for v in reversed(rec.visible(deleted)):
                if v.id == schema_id:
                    return self._answer(subject, v)
        raise SchemaError(SCHEMA_NOT_FOUND, "Schema not found")

    def delete_subject(self, subject: str, permanent: bool = False) -> list[int]:
        return self._retry(lambda: self._delete_subject(subject, permanent))

    def _delete_subject(self, subject: str, permanent: bool) -> list[int]:
        rec, zv = self._record(subject, deleted=True)
        live = rec.live()
        if not permanent and not live:
            raise SchemaError(SUBJECT_SOFT_DELETED, f"Subject '{subject}' was soft deleted.Set permanent=true "
                                                    "to delete permanently")
        if permanent and live:
            raise SchemaError(SUBJECT_NOT_SOFT_DELETED, f"Subject '{subject}' was not deleted first before being "
                                                        "permanently deleted")
        for v in rec.versions:
            self._not_referenced(subject, v)
        if permanent:
            self.store.write_subject(subject, None, zv)
            return [v.version for v in rec.versions]
        self.store.write_subject(subject, rec.soft_deleted(None), zv)
        return [v.version for v in live]

    def delete_version(self, subject: str, version: int, permanent: bool = False) -> int:
        return self._retry(lambda: self._delete_version(subject, version, permanent))

    def _delete_version(self, subject: str, version: int, permanent: bool) -> int:
        rec, zv = self._record(subject, deleted=True)
        v = rec.find(version, deleted=permanent or version != -1)
        if v is None:
            raise SchemaError(VERSION_NOT_FOUND, f"Version {version} not found.")
        if not permanent and v.deleted:
            raise SchemaError(VERSION_SOFT_DELETED, f"Subject '{subject}' Version {v.version} was soft deleted.Set "
                                                    "permanent=true to delete permanently")
        if permanent and not v.deleted:
            raise SchemaError(VERSION_NOT_SOFT_DELETED, f"Subject '{subject}' Version {v.version} was not deleted "
                                                        "first before being permanently deleted")
        self._not_referenced(subject, v)
        after = rec.without(v.version) if permanent else rec.soft_deleted(v.version)
        self.store.write_subject(subject, after if after.versions else None, zv)
        return v.version

    def _not_referenced(self, subject: str, v: SubjectVersion) -> None:
        if self.referenced_by(subject, v.version):
            raise SchemaError(REFERENCE_EXISTS, f"One or more references exist to the schema "
                                                f"{{magic=1,keytype=SCHEMA,subject={subject},version={v.version}}}.")

    # --- compatibility -------------------------------------------------------------------------

    def check(self, subject: str, version: int | None, body: Any, verbose: bool = False,
              normalize: bool = False) -> dict[str, Any]:
        """POST /compatibility/subjects/{subject}/versions[/{version}]: {"is_compatible"[, "messages"]}.
        One version: checked in the direction of the subject's mode; all (None): as a
        registration would be (a subject with no versions takes anything)."""
        schema, parsed = self._text(schema_from_json(body), self._normalize(subject, normalize))
        mode = self.compatibility_of(subject)
        if version is None:
            rec, _ = self.store.subject(subject)
            chosen = rec.live() if rec is not None else []
        else:
            chosen = [self._version(subject, version)]
            mode = mode.removesuffix("_TRANSITIVE")
        fmt = compat.format_of(schema.schema_type)
        earlier = [compat.Earlier(v.version, self.parsed(v.id), self.schema(v.id).text) for v in chosen]
        if any(self.schema(v.id).schema_type != schema.schema_type for v in chosen):
            reasons = [f"Incompatible schema type: {schema.schema_type}"]
        else:
            reasons = compat.check(fmt, parsed, earlier, mode)
        out: dict[str, Any] = {"is_compatible": not reasons}
        if verbose:
            out["messages"] = reasons
        return out

    # --- config and mode -----------------------------------------------------------------------

    def _setting(self, kind: str, subject: str | None) -> dict[str, Any] | None:
        return self.store.setting(kind, subject)

    def _effective(self, kind: str, subject: str | None, default_to_global: bool = True) -> dict[str, Any]:
        """The `config` or `mode` in force for `subject`: its own, else (when `default_to_global`)
        the global one, else the default; 40408 / 40409 for a subject with none of its own."""
        default, code, what = SETTING_DEFAULTS[kind]
        got = self._setting(kind, subject)
        if got is None and subject is not None and not default_to_global:
            raise SchemaError(code, f"Subject '{subject}' does not have subject-level {what} configured")
        if got is None and subject is not None:
            got = self._setting(kind, None)
        return dict(got or default)

    def compatibility_of(self, subject: str) -> str:
        return str(self._effective("config", subject).get("compatibilityLevel", DEFAULT_COMPATIBILITY))

    def mode_of(self, subject: str) -> str:
        return str(self._effective("mode", subject).get("mode", DEFAULT_MODE))

    def get_config(self, subject: str | None, default_to_global: bool = False) -> dict[str, Any]:
        return self._effective("config", subject, default_to_global)

    def set_config(self, subject: str | None, body: Any) -> dict[str, Any]:
        """PUT /config[/{subject}] {"compatibility": MODE, ...}: kept as given (the level upper-cased)."""
        if not isinstance(body, dict):
            raise SchemaError(UNPROCESSABLE, "the body must be a JSON object")
        stored = dict(self._setting("config", subject) or {})
        update = {k: v for k, v in body.items() if k not in ("compatibility", "compatibilityLevel")}
        level = body.get("compatibility", body.get("compatibilityLevel"))
        if level is not None:
            update["compatibilityLevel"] = compat.check_mode(level)
        stored.update(update)
        self.store.set_setting("config", subject, stored)
        answer = {k: v for k, v in stored.items() if k != "compatibilityLevel"}
        if "compatibilityLevel" in stored:
            answer["compatibility"] = stored["compatibilityLevel"]
        return answer

    def delete_config(self, subject: str | None) -> dict[str, Any]:
        before = self.get_config(subject, default_to_global=subject is None)
        if subject is not None:
            self._record(subject, deleted=True)
        self.store.set_setting("config", subject, None)
        return before

    def get_mode(self, subject: str | None, default_to_global: bool = False) -> dict[str, Any]:
        return self._effective("mode", subject, default_to_global)

    def set_mode(self, subject: str | None, body: Any, force: bool = False) -> dict[str, Any]:
        """PUT /mode[/{subject}] {"mode": M}: IMPORT only where nothing is registered, unless forced."""
        mode = body.get("mode") if isinstance(body, dict) else None
        if not isinstance(mode, str) or mode.upper() not in REGISTRY_MODES:
            raise SchemaError(INVALID_MODE, f"Invalid mode. Valid values are {', '.join(REGISTRY_MODES)}")
        mode = mode.upper()
        if mode == "IMPORT" and not force:
            busy = [subject] if subject is not None and self.store.subject(subject)[0] else (
                self.subjects(deleted=True) if subject is None else [])
            if busy:
                raise SchemaError(OPERATION_NOT_PERMITTED, "Cannot import since found existing subjects")
        self.store.set_setting("mode", subject, {"mode": mode})
        return {"mode": mode}

    def delete_mode(self, subject: str | None) -> dict[str, Any]:
        before = self.get_mode(subject, default_to_global=subject is None)
        self.store.set_setting("mode", subject, None)
        return before

    # --- retries -------------------------------------------------------------------------------

    def _retry(self, attempt: Callable[[], T]) -> T:
        for _ in range(RETRIES - 1):
            try:
                return attempt()
            except SchemaConflictError:
                continue
        return attempt()


def _optional_int(body: Any, key: str) -> int | None:
    v = body.get(key) if isinstance(body, dict) else None
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise SchemaError(UNPROCESSABLE, f"{key} must be a number")
    return None if v < 0 else v
