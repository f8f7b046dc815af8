"""Where the registry's truth is kept: a Protocol and its two stores.

The store holds four things: schemas by id (immutable: an id, once given, names the same schema
for good, even after every version naming it was deleted), the id of each schema's fingerprint
(the same schema under two subjects is one id), each subject's versions (`SubjectRecord`,
written compare-and-set), and the compatibility config and mode, global and per subject.
`add_version` is the one write that allocates: in one atomic step it takes the schema's id (its
fingerprint's, the one IMPORT mode gives, or the next of a global monotonic counter) and appends
the version to the subject, if the subject is still as it was read (else SchemaConflictError:
read again, decide again). So two brokers registering at once never give one id twice, and never
give one schema two ids.

`ZooKeeperSchemaStore`: under `<root>/<cluster>/schemas`: `ids/<id>` (the schema's JSON),
`fingerprints/<sha256>` (its id), `next_id` (the counter), `subjects/<quoted subject>` (JSON
versions), `config` and `mode` (the global setting as the node's data, a subject's as its child
`config/<quoted subject>`). Blocking: callers run it in a thread. `MemorySchemaStore`: the same in
one process (unit tests, a broker without ZooKeeper).
"""

from __future__ import annotations

import json
import threading
from typing import Any, Protocol
from urllib.parse import quote, unquote

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError

from memq.errors import CoordinationError, SchemaConflictError, SchemaError
from memq.governor.registry import Registry

from .model import ID_IN_USE, Schema, SubjectRecord, schema_from_json, subject_from_json

SETTINGS = ("config", "mode")


class SchemaStore(Protocol):
    def subject(self, name: str) -> tuple[SubjectRecord | None, int]:
        """The subject's versions (None: never registered, or permanently deleted) and the
        store's version of them (-1 then)."""

    def subjects(self) -> list[str]:
        """Every subject with a record (live or soft-deleted), sorted."""

    def schema(self, schema_id: int) -> Schema | None:
        """The schema `schema_id` names (None: no such id)."""

    def id_of(self, fingerprint: str) -> int | None:
        """The id of the schema with this fingerprint (None: never registered)."""

    def add_version(self, subject: str, record: SubjectRecord, version: int, schema: Schema,
                    wanted_id: int | None = None, wanted_version: int | None = None) -> int:
        """Atomically: the schema's id (`wanted_id`, else its fingerprint's, else the next one)
        and `record` plus a version naming it stored for `subject`, if the subject is still at
        `version` (-1: absent); the id. SchemaConflictError if it changed; 42207 if `wanted_id`
        names another schema."""

    def write_subject(self, subject: str, record: SubjectRecord | None, version: int) -> None:
        """Store `record` (None: forget the subject) if still at `version`, else SchemaConflictError."""

    def setting(self, kind: str, subject: str | None) -> dict[str, Any] | None:
        """The stored `config` or `mode` of `subject` (None: the global one); None if not set."""

    def set_setting(self, kind: str, subject: str | None, value: dict[str, Any] | None) -> None:
        """Store (None: remove) the `config` or `mode` of `subject` (None: the global one)."""


def _encode(d: Any) -> bytes:
    return json.dumps(d, separators=(",", ":"), sort_keys=True).encode()


def _import_clash(schema_id: int, stored: Schema | None, schema: Schema) -> None:
    if stored is not None and stored.fingerprint != schema.fingerprint:
        raise SchemaError(ID_IN_USE, f"Overwrite new schema with id {schema_id} is not permitted: "
                                     "it names another schema")


class MemorySchemaStore:
    """The same contract in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[int, Schema] = {}
        self._fingerprints: dict[str, int] = {}
        self._next_id = 1
        self._subjects: dict[str, tuple[SubjectRecord, int]] = {}
        self._settings: dict[tuple[str, str | None], dict[str, Any]] = {}

    def subject(self, name: str) -> tuple[SubjectRecord | None, int]:
        with self._lock:
            return self._subjects.get(name, (None, -1))

    def subjects(self) -> list[str]:
        with self._lock:
            return sorted(self._subjects)

    def schema(self, schema_id: int) -> Schema | None:
        with self._lock:
            return self._ids.get(schema_id)

    def id_of(self, fingerprint: str) -> int | None:
        with self._lock:
            return self._fingerprints.get(fingerprint)

    def add_version(self, subject: str, record: SubjectRecord, version: int, schema: Schema,
                    wanted_id: int | None = None, wanted_version: int | None = None) -> int:
        with self._lock:
            if self._subjects.get(subject, (None, -1))[1] != version:
                raise SchemaConflictError(f"subject {subject!r} changed since version {version}")
            fp = schema.fingerprint
            if wanted_id is not None:
                _import_clash(wanted_id, self._ids.get(wanted_id), schema)
                schema_id = wanted_id
                self._next_id = max(self._next_id, wanted_id + 1)
            else:
                schema_id = self._fingerprints.get(fp, self._next_id)
                self._next_id = max(self._next_id, schema_id + 1)
            self._ids.setdefault(schema_id, schema)
            self._fingerprints.setdefault(fp, schema_id)
            self._subjects[subject] = (record.added(schema_id, wanted_version), version + 1)
            return schema_id

    def write_subject(self, subject: str, record: SubjectRecord | None, version: int) -> None:
        with self._lock:
            if self._subjects.get(subject, (None, -1))[1] != version:
                raise SchemaConflictError(f"subject {subject!r} changed since version {version}")
            if record is None:
                del self._subjects[subject]
            else:
                self._subjects[subject] = (record, version + 1)

    def setting(self, kind: str, subject: str | None) -> dict[str, Any] | None:
        with self._lock:
            return self._settings.get((kind, subject))

    def set_setting(self, kind: str, subject: str | None, value: dict[str, Any] | None) -> None:
        with self._lock:
            if value is None:
                self._settings.pop((kind, subject), None)
            else:
                self._settings[(kind, subject)] = dict(value)


class ZooKeeperSchemaStore:
    """The contract in ZooKeeper (module doc); every call waits at most `zookeeper.connect_timeout_s`."""

    def __init__(self, registry: Registry) -> None:
        self._zk = registry.client
        self._wait = registry._wait   # kazoo calls bounded by the session's timeout, errors as CoordinationError
        self.base = f"{registry.base}/schemas"
        self._counter = f"{self.base}/next_id"
        for path in ("ids", "fingerprints", "subjects", *SETTINGS):
            self._wait(self._zk.ensure_path_async(f"{self.base}/{path}"), f"{self.base}/{path}")
        try:
            self._wait(self._zk.create_async(self._counter, b"1"), self._counter)
        except NodeExistsError:
            pass

    def _subject_path(self, name: str) -> str:
        return f"{self.base}/subjects/{quote(name, safe='')}"

    def _read(self, path: str) -> tuple[bytes, int] | None:
        try:
            raw, stat = self._wait(self._zk.get_async(path), path)
        except NoNodeError:
            return None
        return bytes(raw or b""), int(stat.version)

    def subject(self, name: str) -> tuple[SubjectRecord | None, int]:
        got = self._read(self._subject_path(name))
        if got is None:
            return None, -1
        return subject_from_json(json.loads(got[0])), got[1]

    def subjects(self) -> list[str]:
        path = f"{self.base}/subjects"
        return sorted(unquote(c) for c in self._wait(self._zk.get_children_async(path), path))

    def schema(self, schema_id: int) -> Schema | None:
        got = self._read(f"{self.base}/ids/{schema_id}")
        return None if got is None else schema_from_json(json.loads(got[0]), f"schema {schema_id}")

    def id_of(self, fingerprint: str) -> int | None:
        got = self._read(f"{self.base}/fingerprints/{fingerprint}")
        return None if got is None else int(got[0])

    def add_version(self, subject: str, record: SubjectRecord, version: int, schema: Schema,
                    wanted_id: int | None = None, wanted_version: int | None = None) -> int:
        fp = schema.fingerprint
        t = self._zk.transaction()
        known = self.id_of(fp)
        schema_id = wanted_id if wanted_id is not None else known
        if wanted_id is not None:
            _import_clash(wanted_id, self.schema(wanted_id), schema)
        if schema_id is None or self.schema(schema_id) is None:
            got = self._read(self._counter)
            if got is None:
                raise CoordinationError(f"ZooKeeper {self._counter}: the id counter is missing")
            counter = int(got[0])
            if schema_id is None:
                schema_id = counter
            t.set_data(self._counter, str(max(counter, schema_id + 1)).encode(), version=got[1])
            t.create(f"{self.base}/ids/{schema_id}", _encode(schema.stored()))
        if known is None:
            t.create(f"{self.base}/fingerprints/{fp}", str(schema_id).encode())
        data = _encode(record.added(schema_id, wanted_version).to_json())
        path = self._subject_path(subject)
        if version < 0:
            t.create(path, data)
        else:
            t.set_data(path, data, version=version)
        self._commit(t, f"subject {subject!r}")
        return schema_id

    def write_subject(self, subject: str, record: SubjectRecord | None, version: int) -> None:
        path = self._subject_path(subject)
        try:
            if record is None:
                self._wait(self._zk.delete_async(path, version=version), path)
            else:
                self._wait(self._zk.set_async(path, _encode(record.to_json()), version=version), path)
        except (BadVersionError, NoNodeError):
            raise SchemaConflictError(f"subject {subject!r} changed since version {version}") from None

    def _setting_path(self, kind: str, subject: str | None) -> str:
        return f"{self.base}/{kind}" + ("" if subject is None else f"/{quote(subject, safe='')}")

    def setting(self, kind: str, subject: str | None) -> dict[str, Any] | None:
        got = self._read(self._setting_path(kind, subject))
        return json.loads(got[0]) if got and got[0] else None

    def set_setting(self, kind: str, subject: str | None, value: dict[str, Any] | None) -> None:
        path = self._setting_path(kind, subject)
        data = b"" if value is None else _encode(value)
        if subject is None:
            self._wait(self._zk.set_async(path, data), path)
        elif value is None:
            try:
                self._wait(self._zk.delete_async(path), path)
            except NoNodeError:
                pass
        else:
            try:
                self._wait(self._zk.set_async(path, data), path)
            except NoNodeError:
                try:
                    self._wait(self._zk.create_async(path, data), path)
                except NodeExistsError:
                    self._wait(self._zk.set_async(path, data), path)

    def _commit(self, t: Any, what: str) -> None:
        results = self._wait(t.commit_async(), what)
        if any(isinstance(r, (BadVersionError, NodeExistsError, NoNodeError)) for r in results):
            raise SchemaConflictError(f"{what}: the store changed meanwhile")
        for r in results:
            if isinstance(r, Exception) and not isinstance(r, RolledBackError):
                raise CoordinationError(f"ZooKeeper {what}: {type(r).__name__} {r}")
