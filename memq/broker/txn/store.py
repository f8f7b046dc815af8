"""Where transaction state is kept between brokers and restarts: a Protocol and its two stores.

Per transactional id: its record (`TxnRecord`), written compare-and-set on a version (a write
against a stale version raises TxnConflictError: read again, decide again), and its *pending*
entries, the notifications its produces stored but did not publish. A pending entry is added
only while the record is still at the version the producing broker checked (atomic), so none
can join a transaction after its decision.

`ZooKeeperTxnStore`: znode `<root>/<cluster>/txn/<quoted id>` (JSON record), its pending entries
children `.../<quoted id>/pending/n-<seq>` (sequential: each broker creates its own, no contention;
a kazoo transaction checks the record's version with the create). Blocking: callers run it in a
thread. `MemoryTxnStore`: the same in this process (a broker without ZooKeeper).

A pending entry may also name its Messages as the audit's produced records do (`Audited`): the
Kafka door's, whose producers have no audit emitter; the coordinator reports them at the commit.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, unquote

from kazoo.exceptions import (BadVersionError, NodeExistsError, NoNodeError, NotEmptyError,
                              RolledBackError)

from memq.errors import CoordinationError, CorruptDataError, TxnConflictError, UnsupportedVersionError
from memq.format.notification import Notification
from memq.governor.registry import Registry

from .state import GroupOffsets, TxnRecord, TxnState

Pending = tuple[str, Notification]   # (notification Kafka topic, notification)
VERSION = 1


@dataclass(frozen=True, slots=True)
class Audited:
    """One pending Message as the audit's produced record names it (memq topic, ids, LogMessage
    count, body CRC32C, seal time), reported when its transaction commits."""

    topic: str
    producer_id: int
    epoch: int
    sequence: int
    count: int
    digest: int
    created_ms: int


@dataclass(frozen=True, slots=True)
class PendingEntry:
    """One pending entry: the notifications a produce stored, and its Messages for the audit
    (empty when their producer reports them itself: memq's Producer)."""

    notes: list[Pending]
    audited: list[Audited]
    partition: int = -1   # the notification partition its notes go to (a compacted topic's placed records)


class TxnStore(Protocol):
    def read(self, txn_id: str) -> tuple[TxnRecord | None, int]:
        """The stored record (None: never written) and its version (-1 then)."""

    def write(self, txn_id: str, rec: TxnRecord, version: int) -> int:
        """Store `rec` if the stored version is still `version` (-1: create); the new version,
        or TxnConflictError."""

    def add_pending(self, txn_id: str, version: int, notes: Sequence[Pending], audited: Sequence[Audited] = (),
                    partition: int = -1) -> None:
        """Add one pending entry holding `notes` (and `audited`, to be published to `partition`
        if >= 0) if the record is still at `version`, else TxnConflictError."""

    def entries(self, txn_id: str) -> list[PendingEntry]:
        """Every pending entry, in the order they were added."""

    def pending(self, txn_id: str) -> list[Pending]:
        """Every pending entry's notifications, in the order they were added."""

    def drop_pending(self, txn_id: str) -> int:
        """Delete every pending entry; how many there were."""

    def delete(self, txn_id: str, version: int) -> None:
        """Forget `txn_id` (an expired id, no pending entries) if still at `version`, else TxnConflictError."""

    def ids(self) -> list[str]:
        """Every transactional id with a record, sorted."""

    def pending_objects(self) -> set[str]:
        """The object keys every pending entry names (the janitor keeps them)."""


# --- the JSON of a record and of a pending entry ---------------------------------------------


def encode(rec: TxnRecord) -> bytes:
    offsets = {g: {"generation": o.generation, "member_id": o.member_id, "instance_id": o.instance_id, "native": o.native,
                   "offsets": [[t, p, off, meta] for (t, p), (off, meta) in sorted(o.offsets.items())]}
               for g, o in sorted(rec.offsets.items())}
    return json.dumps({"v": VERSION, "producer_id": rec.producer_id, "epoch": rec.epoch, "last_epoch": rec.last_epoch,
                       "state": rec.state.value, "timeout_ms": rec.timeout_ms, "started_ms": rec.started_ms,
                       "updated_ms": rec.updated_ms,
                       "partitions": sorted([t, p] for t, p in rec.partitions), "groups": sorted(rec.groups),
                       "offsets": offsets}, separators=(",", ":")).encode()


def decode(raw: bytes, where: str) -> TxnRecord:
    try:
        d = json.loads(raw)
        if d.get("v") != VERSION:
            raise UnsupportedVersionError(f"{where}: transaction state version {d.get('v')!r}: written by a newer memq")
        offsets = {g: GroupOffsets(int(o["generation"]), str(o["member_id"]), o["instance_id"],
                                   {(str(t), int(p)): (int(off), str(meta)) for t, p, off, meta in o["offsets"]},
                                   bool(o["native"]))
                   for g, o in d["offsets"].items()}
        return TxnRecord(int(d["producer_id"]), int(d["epoch"]), TxnState(d["state"]), int(d["timeout_ms"]),
                         int(d["started_ms"]), int(d["last_epoch"]), int(d["updated_ms"]),
                         frozenset((str(t), int(p)) for t, p in d["partitions"]), frozenset(map(str, d["groups"])),
                         offsets)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptDataError(f"{where}: transaction state does not parse: {e}") from None


def encode_pending(notes: Sequence[Pending], audited: Sequence[Audited] = (), partition: int = -1) -> bytes:
    """`audited` and `partition` are optional (absent when empty, -1): entries written before them
    read as none and as Kafka's pick."""
    d: dict[str, Any] = {"v": VERSION, "notes": [[t, json.loads(n.to_bytes())] for t, n in notes]}
    if partition >= 0:
        d["partition"] = partition
    if audited:
        d["audited"] = [[a.topic, a.producer_id, a.epoch, a.sequence, a.count, a.digest, a.created_ms] for a in audited]
    return json.dumps(d, separators=(",", ":")).encode()


def decode_pending(raw: bytes, where: str) -> PendingEntry:
    try:
        d = json.loads(raw)
        if d.get("v") != VERSION:
            raise UnsupportedVersionError(f"{where}: pending entry version {d.get('v')!r}: written by a newer memq")
        return PendingEntry([(str(t), Notification.from_bytes(json.dumps(n).encode())) for t, n in d["notes"]],
                            [Audited(str(t), *(int(x) for x in rest)) for t, *rest in d.get("audited", ())],
                            int(d.get("partition", -1)))
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptDataError(f"{where}: pending entry does not parse: {e}") from None


# --- the stores -----------------------------------------------------------------------------


class MemoryTxnStore:
    """Versioned records and pending entries in this process: the same checks, no durability."""

    def __init__(self) -> None:
        self._records: dict[str, tuple[bytes, int]] = {}
        self._pending: dict[str, list[bytes]] = {}
        self._lock = threading.Lock()

    def read(self, txn_id: str) -> tuple[TxnRecord | None, int]:
        with self._lock:
            raw, version = self._records.get(txn_id, (b"", -1))
        return (decode(raw, txn_id) if raw else None), version

    def write(self, txn_id: str, rec: TxnRecord, version: int) -> int:
        with self._lock:
            if self._records.get(txn_id, (b"", -1))[1] != version:
                raise TxnConflictError(f"transaction {txn_id!r}: state changed since version {version}")
            self._records[txn_id] = (encode(rec), version + 1)
            return version + 1

    def add_pending(self, txn_id: str, version: int, notes: Sequence[Pending], audited: Sequence[Audited] = (),
                    partition: int = -1) -> None:
        with self._lock:
            if self._records.get(txn_id, (b"", -1))[1] != version:
                raise TxnConflictError(f"transaction {txn_id!r}: state changed since version {version}")
            self._pending.setdefault(txn_id, []).append(encode_pending(notes, audited, partition))

    def entries(self, txn_id: str) -> list[PendingEntry]:
        with self._lock:
            raws = list(self._pending.get(txn_id, ()))
        return [decode_pending(raw, txn_id) for raw in raws]

    def pending(self, txn_id: str) -> list[Pending]:
        return [n for e in self.entries(txn_id) for n in e.notes]

    def drop_pending(self, txn_id: str) -> int:
        with self._lock:
            return len(self._pending.pop(txn_id, ()))

    def delete(self, txn_id: str, version: int) -> None:
        with self._lock:
            if self._records.get(txn_id, (b"", -1))[1] != version or self._pending.get(txn_id):
                raise TxnConflictError(f"transaction {txn_id!r}: state changed since version {version}")
            del self._records[txn_id]

    def ids(self) -> list[str]:
        with self._lock:
            return sorted(self._records)

    def pending_objects(self) -> set[str]:
        with self._lock:
            entries = [(t, raw) for t, raws in self._pending.items() for raw in raws]
        return {n.key for t, raw in entries for _, n in decode_pending(raw, t).notes}


class ZooKeeperTxnStore:
    """One znode per transactional id, its pending entries as sequential children (module doc).
    Every call waits at most `zookeeper.connect_timeout_s`; kazoo failures are CoordinationErrors."""

    def __init__(self, registry: Registry) -> None:
        self._zk = registry.client
        self._wait = registry._wait   # kazoo calls bounded by the session's timeout, errors as CoordinationError
        self.base = f"{registry.base}/txn"

    def _path(self, txn_id: str) -> str:
        return f"{self.base}/{quote(txn_id, safe='')}"

    def read(self, txn_id: str) -> tuple[TxnRecord | None, int]:
        path = self._path(txn_id)
        try:
            raw, stat = self._wait(self._zk.get_async(path), path)
        except NoNodeError:
            return None, -1
        return decode(bytes(raw), path), int(stat.version)

    def write(self, txn_id: str, rec: TxnRecord, version: int) -> int:
        path = self._path(txn_id)
        if version < 0:   # the record and its pending folder at once
            self._wait(self._zk.ensure_path_async(self.base), self.base)
            t = self._zk.transaction()
            t.create(path, encode(rec))
            t.create(f"{path}/pending", b"")
            results = self._wait(t.commit_async(), path)
            if any(isinstance(r, NodeExistsError) for r in results):
                raise TxnConflictError(f"transaction {txn_id!r}: created meanwhile by another broker")
            _raise_first(results, path)
            return 0
        try:
            stat = self._wait(self._zk.set_async(path, encode(rec), version=version), path)
        except (BadVersionError, NoNodeError):
            raise TxnConflictError(f"transaction {txn_id!r}: state changed since version {version}") from None
        return int(stat.version)

    def add_pending(self, txn_id: str, version: int, notes: Sequence[Pending], audited: Sequence[Audited] = (),
                    partition: int = -1) -> None:
        path = self._path(txn_id)
        t = self._zk.transaction()
        t.check(path, version)
        t.create(f"{path}/pending/n-", encode_pending(notes, audited, partition), sequence=True)
        results = self._wait(t.commit_async(), path)
        if any(isinstance(r, (BadVersionError, NoNodeError)) for r in results):
            raise TxnConflictError(f"transaction {txn_id!r}: state changed since version {version}")
        _raise_first(results, path)

    def _entry_paths(self, txn_id: str) -> list[str]:
        folder = f"{self._path(txn_id)}/pending"
        try:
            return [f"{folder}/{c}" for c in sorted(self._wait(self._zk.get_children_async(folder), folder))]
        except NoNodeError:
            return []

    def entries(self, txn_id: str) -> list[PendingEntry]:
        paths = self._entry_paths(txn_id)
        calls = [(p, self._zk.get_async(p)) for p in paths]   # all in flight at once
        out: list[PendingEntry] = []
        for p, call in calls:
            try:
                raw, _ = self._wait(call, p)
            except NoNodeError:   # dropped meanwhile by a broker finishing the transaction
                continue
            out.append(decode_pending(bytes(raw), p))
        return out

    def pending(self, txn_id: str) -> list[Pending]:
        return [n for e in self.entries(txn_id) for n in e.notes]

    def drop_pending(self, txn_id: str) -> int:
        calls = [(p, self._zk.delete_async(p)) for p in self._entry_paths(txn_id)]
        for p, call in calls:
            try:
                self._wait(call, p)
            except NoNodeError:
                pass
        return len(calls)

    def delete(self, txn_id: str, version: int) -> None:
        path = self._path(txn_id)
        t = self._zk.transaction()
        t.check(path, version)
        t.delete(f"{path}/pending")   # refused while it holds an entry
        t.delete(path)
        results = self._wait(t.commit_async(), path)
        if any(isinstance(r, (BadVersionError, NoNodeError, NotEmptyError)) for r in results):
            raise TxnConflictError(f"transaction {txn_id!r}: state changed since version {version}")
        _raise_first(results, path)

    def ids(self) -> list[str]:
        try:
            return sorted(unquote(c) for c in self._wait(self._zk.get_children_async(self.base), self.base))
        except NoNodeError:
            return []

    def pending_objects(self) -> set[str]:
        return {n.key for txn_id in self.ids() for _, n in self.pending(txn_id)}


def _raise_first(results: list[Any], where: str) -> None:
    """A kazoo transaction's first failure as a CoordinationError (RolledBackError only marks the others)."""
    for r in results:
        if isinstance(r, Exception) and not isinstance(r, RolledBackError):
            raise CoordinationError(f"ZooKeeper {where}: {type(r).__name__} {r}")
