"""Where consumer groups' state and committed offsets are kept between brokers and restarts.

`claim` reads a group (its kind, its state snapshot, its committed offsets) and marks this
broker its coordinator with a versioned write, so a coordinator that held it before is fenced:
its next write or commit, checked against the version it holds, fails with StateFencedError.
State writes bump the version; commits check it without bumping it (many commits, one owner).

`ZooKeeperGroupStore` keeps `<root>/<cluster>/groups/<group>` (JSON: owner, kind, state) with a
child per committed topic, `offsets/<topic>` (JSON: partition -> offset, metadata), so a commit
is one ZooKeeper multi (check the group's version, set one node per topic) whatever the
number of partitions; `MemoryGroupStore` is for a broker without ZooKeeper.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote, unquote

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError

from memq.errors import CoordinationError, StateFencedError
from memq.governor.registry import Registry

TP = tuple[str, int]
Offsets = dict[TP, tuple[int, str]]   # (topic, partition) -> (offset, metadata)


@dataclass(slots=True)
class Loaded:
    """A group as stored: `kind` "consumer" or "classic" (None: nothing stored yet)."""

    kind: str | None = None
    state: dict[str, Any] | None = None
    offsets: Offsets = field(default_factory=dict)
    version: int = 0


class GroupStore(Protocol):
    def claim(self, group: str, owner: str) -> Loaded:
        """The stored group, and the version this owner writes against from now on."""

    def write(self, group: str, owner: str, kind: str, state: dict[str, Any], version: int) -> int:
        """Store the state if the version is still `version`: the new one, or StateFencedError."""

    def commit(self, group: str, version: int, offsets: Offsets) -> None:
        """Store the offsets of each topic named (all its partitions' as given: the caller merges),
        if the version is still `version`, else StateFencedError."""

    def delete(self, group: str, version: int) -> None:
        """Remove the group and its offsets (StateFencedError if another owner holds it)."""

    def groups(self) -> dict[str, str]:
        """Every stored group -> its kind ("" before its first state write)."""


def _encode(owner: str, kind: str | None, state: dict[str, Any] | None) -> bytes:
    return json.dumps({"v": 1, "owner": owner, "kind": kind, "state": state}, separators=(",", ":")).encode()


def _decode(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        d = json.loads(raw)
    except ValueError as e:
        raise CoordinationError(f"group state does not parse: {e}") from e
    if d.get("v") != 1:
        raise CoordinationError(f"group state version {d.get('v')!r} is not 1: written by a newer memq")
    return dict(d)


def _encode_offsets(parts: dict[int, tuple[int, str]]) -> bytes:
    return json.dumps([[p, o, m] for p, (o, m) in sorted(parts.items())], separators=(",", ":")).encode()


def _decode_offsets(topic: str, raw: bytes) -> Offsets:
    try:
        return {(topic, int(p)): (int(o), str(m)) for p, o, m in json.loads(raw)}
    except (ValueError, TypeError) as e:
        raise CoordinationError(f"committed offsets of {topic!r} do not parse: {e}") from e


def by_topic(offsets: Offsets) -> dict[str, dict[int, tuple[int, str]]]:
    out: dict[str, dict[int, tuple[int, str]]] = {}
    for (t, p), v in offsets.items():
        out.setdefault(t, {})[p] = v
    return out


class MemoryGroupStore:
    """Versioned groups in this process: the same fencing, no durability."""

    def __init__(self) -> None:
        self._data: dict[str, tuple[Loaded, str]] = {}
        self._lock = threading.Lock()

    def claim(self, group: str, owner: str) -> Loaded:
        with self._lock:
            old, _ = self._data.get(group, (Loaded(version=-1), ""))
            new = Loaded(old.kind, old.state, dict(old.offsets), old.version + 1)
            self._data[group] = (new, owner)
            return Loaded(new.kind, new.state, dict(new.offsets), new.version)

    def _held(self, group: str, version: int) -> Loaded:
        loaded = self._data.get(group, (None, ""))[0]
        if loaded is None or loaded.version != version:
            raise StateFencedError(f"group {group!r}: another coordinator since version {version}")
        return loaded

    def write(self, group: str, owner: str, kind: str, state: dict[str, Any], version: int) -> int:
        with self._lock:
            loaded = self._held(group, version)
            loaded.kind, loaded.state, loaded.version = kind, state, version + 1
            return version + 1

    def commit(self, group: str, version: int, offsets: Offsets) -> None:
        with self._lock:
            self._held(group, version).offsets.update(offsets)

    def delete(self, group: str, version: int) -> None:
        with self._lock:
            self._held(group, version)
            del self._data[group]

    def groups(self) -> dict[str, str]:
        with self._lock:
            return {g: loaded.kind or "" for g, (loaded, _) in self._data.items()}


class ZooKeeperGroupStore:
    """A znode per group, one child per committed topic; blocking (the caller runs it in a thread)."""

    def __init__(self, registry: Registry) -> None:
        self._zk = registry.client
        self._base = f"{registry.base}/groups"
        self.writes = 0

    def _path(self, group: str) -> str:
        return f"{self._base}/{quote(group, safe='')}"

    def claim(self, group: str, owner: str) -> Loaded:
        path = self._path(group)
        while True:
            try:
                raw, stat = self._zk.get(path)
            except NoNodeError:
                try:
                    self._zk.create(path, b"", makepath=True)
                except NodeExistsError:
                    pass
                continue
            d = _decode(raw)
            try:   # the owner's mark bumps the version: the previous owner's next write fails
                stat = self._zk.set(path, _encode(owner, d.get("kind"), d.get("state")), version=stat.version)
            except BadVersionError:
                continue
            offsets: Offsets = {}
            try:
                for topic in self._zk.get_children(f"{path}/offsets"):
                    name = unquote(topic)
                    offsets.update(_decode_offsets(name, self._zk.get(f"{path}/offsets/{topic}")[0]))
            except NoNodeError:
                pass
            return Loaded(d.get("kind"), d.get("state"), offsets, int(stat.version))

    def write(self, group: str, owner: str, kind: str, state: dict[str, Any], version: int) -> int:
        try:
            stat = self._zk.set(self._path(group), _encode(owner, kind, state), version=version)
        except (BadVersionError, NoNodeError):
            raise StateFencedError(f"group {group!r}: another coordinator holds it now") from None
        self.writes += 1
        return int(stat.version)

    def commit(self, group: str, version: int, offsets: Offsets) -> None:
        path = self._path(group)
        topics = by_topic(offsets)
        existing = set(self._children(f"{path}/offsets"))
        if not existing and topics:
            try:
                self._zk.create(f"{path}/offsets", b"")
            except NodeExistsError:
                pass
            except NoNodeError:
                raise StateFencedError(f"group {group!r} was deleted") from None
        t = self._zk.transaction()
        t.check(path, version)
        for topic, parts in topics.items():
            node = f"{path}/offsets/{quote(topic, safe='')}"
            if quote(topic, safe="") in existing:
                t.set_data(node, _encode_offsets(parts))
            else:
                t.create(node, _encode_offsets(parts))
        results = t.commit()
        if isinstance(results[0], Exception):
            raise StateFencedError(f"group {group!r}: another coordinator holds it now")
        failed = [r for r in results[1:] if isinstance(r, Exception)]
        if failed:   # a topic's node made meanwhile: only by a coordinator that fenced us
            raise StateFencedError(f"group {group!r}: commit refused by ZooKeeper: {failed[0]!r}")
        self.writes += 1

    def delete(self, group: str, version: int) -> None:
        path = self._path(group)
        try:
            if self._zk.get(path)[1].version != version:
                raise StateFencedError(f"group {group!r}: another coordinator holds it now")
            self._zk.delete(path, recursive=True)
        except NoNodeError:
            pass
        except NotEmptyError:   # a commit landed meanwhile (only by a coordinator that fenced us)
            raise StateFencedError(f"group {group!r}: changed while being deleted") from None

    def groups(self) -> dict[str, str]:
        out = {}
        for name in self._children(self._base):
            try:
                out[unquote(name)] = _decode(self._zk.get(f"{self._base}/{name}")[0]).get("kind") or ""
            except NoNodeError:   # deleted meanwhile
                continue
        return out

    def _children(self, path: str) -> list[str]:
        try:
            return list(self._zk.get_children(path))
        except NoNodeError:
            return []
