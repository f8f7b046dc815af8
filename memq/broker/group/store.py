"""Where consumer groups' state and committed offsets are kept between brokers and restarts.

`claim` reads a group (its kind and state snapshot) and marks this broker its coordinator with
a versioned write, so a coordinator that held it before is fenced: its next state write or
commit, checked against the version it holds, fails with StateFencedError. State writes bump
the version; commits check it without bumping it (many commits, one owner). A transaction's
offsets are committed by its transaction coordinator, which may be another broker: with no
version (the transaction's own state machine decides), so offsets are read from the store,
never from a coordinator's memory.

`ZooKeeperGroupStore` keeps `<root>/<cluster>/groups/<group>` (JSON: owner, kind, state) and a
node per committed partition, `offsets/<topic>/<partition>` (JSON: offset, metadata), so a
commit is one ZooKeeper multi (check the group's version, set each partition) whatever the
number of topics; `MemoryGroupStore` is for a broker without ZooKeeper.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar
from urllib.parse import quote, unquote

from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError, NotEmptyError

from memq.errors import CoordinationError, StateFencedError
from memq.governor.registry import Registry, claim_node

TP = tuple[str, int]
P = ParamSpec("P")
R = TypeVar("R")
Offsets = dict[TP, tuple[int, str]]   # (topic, partition) -> (offset, metadata); offset -1: deleted


@dataclass(frozen=True, slots=True)
class Loaded:
    """A group as stored: `kind` "consumer" or "classic" (None: no state stored yet)."""

    kind: str | None = None
    state: dict[str, Any] | None = None
    version: int = 0


class GroupStore(Protocol):
    def known(self, group: str) -> bool:
        """Whether `group` was ever claimed (a deleted group stays known: its offsets are not
        taken over from the relay again)."""

    def claim(self, group: str, owner: str) -> Loaded:
        """The stored group, and the version this owner writes against from now on."""

    def write(self, group: str, owner: str, kind: str, state: dict[str, Any], version: int) -> int:
        """Store the state if the version is still `version`: the new one, or StateFencedError."""

    def commit(self, group: str, version: int | None, offsets: Offsets) -> None:
        """Store the offsets (-1: forget the partition's) if the group's version is still
        `version` (None: a transaction's, unchecked), else StateFencedError."""

    def offsets(self, group: str) -> Offsets:
        """The group's committed offsets."""

    def delete(self, group: str, version: int) -> None:
        """Remove the group's state and offsets (StateFencedError if another owner holds it)."""

    def groups(self) -> dict[str, str]:
        """Every group with state or offsets -> its kind ("" while it has offsets and no state)."""


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


def _decode_offset(where: str, raw: bytes) -> tuple[int, str]:
    try:
        o, m = json.loads(raw)
        return int(o), str(m)
    except (ValueError, TypeError) as e:
        raise CoordinationError(f"committed offset {where} does not parse: {e}") from e


class MemoryGroupStore:
    """Versioned groups in this process: the same fencing, no durability."""

    def __init__(self) -> None:
        self._groups: dict[str, tuple[Loaded, str]] = {}
        self._offsets: dict[str, Offsets] = {}
        self._lock = threading.Lock()

    def known(self, group: str) -> bool:
        with self._lock:
            return group in self._groups

    def claim(self, group: str, owner: str) -> Loaded:
        with self._lock:
            old, _ = self._groups.get(group, (Loaded(version=-1), ""))
            new = Loaded(old.kind, old.state, old.version + 1)
            self._groups[group] = (new, owner)
            return new

    def _check(self, group: str, version: int | None) -> None:
        loaded = self._groups.get(group, (None, ""))[0]
        if version is not None and (loaded is None or loaded.version != version):
            raise StateFencedError(f"group {group!r}: another coordinator since version {version}")

    def write(self, group: str, owner: str, kind: str, state: dict[str, Any], version: int) -> int:
        with self._lock:
            self._check(group, version)
            self._groups[group] = (Loaded(kind, state, version + 1), owner)
            return version + 1

    def commit(self, group: str, version: int | None, offsets: Offsets) -> None:
        with self._lock:
            self._check(group, version)
            self._groups.setdefault(group, (Loaded(version=-1), ""))
            stored = self._offsets.setdefault(group, {})
            for tp, v in offsets.items():
                if v[0] < 0:
                    stored.pop(tp, None)
                else:
                    stored[tp] = v

    def offsets(self, group: str) -> Offsets:
        with self._lock:
            return dict(self._offsets.get(group, {}))

    def delete(self, group: str, version: int) -> None:
        with self._lock:
            self._check(group, version)
            self._groups[group] = (Loaded(version=version + 1), "")
            self._offsets.pop(group, None)

    def groups(self) -> dict[str, str]:
        with self._lock:
            named = {g: loaded.kind or "" for g, (loaded, _) in self._groups.items() if loaded.kind}
            return {**{g: "" for g, o in self._offsets.items() if o}, **named}


def _zk_call(f: Callable[P, R]) -> Callable[P, R]:
    """ZooKeeper failing (a lost connection, an expired session) as memq's CoordinationError."""
    @functools.wraps(f)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return f(*args, **kwargs)
        except KazooException as e:
            raise CoordinationError(f"ZooKeeper: {type(e).__name__}: {e}") from e
    return call


class ZooKeeperGroupStore:
    """A znode per group and per committed partition; blocking (the caller runs it in a thread)."""

    def __init__(self, registry: Registry) -> None:
        self._zk = registry.client
        self._base = f"{registry.base}/groups"
        self.writes = 0

    def _path(self, group: str) -> str:
        return f"{self._base}/{quote(group, safe='')}"

    def _part(self, group: str, tp: TP) -> str:
        return f"{self._path(group)}/offsets/{quote(tp[0], safe='')}/{tp[1]}"

    @_zk_call
    def known(self, group: str) -> bool:
        return self._zk.exists(self._path(group)) is not None

    @_zk_call
    def claim(self, group: str, owner: str) -> Loaded:
        def mark(raw: bytes) -> bytes:
            d = _decode(raw)
            return _encode(owner, d.get("kind"), d.get("state"))
        raw, version = claim_node(self._zk, self._path(group), mark)
        d = _decode(raw)
        return Loaded(d.get("kind"), d.get("state"), version)

    @_zk_call
    def write(self, group: str, owner: str, kind: str, state: dict[str, Any], version: int) -> int:
        try:
            stat = self._zk.set(self._path(group), _encode(owner, kind, state), version=version)
        except (BadVersionError, NoNodeError):
            raise StateFencedError(f"group {group!r}: another coordinator holds it now") from None
        self.writes += 1
        return int(stat.version)

    @_zk_call
    def commit(self, group: str, version: int | None, offsets: Offsets) -> None:
        for _ in range(2):   # a partition's first commit makes its node, then commits again
            t = self._zk.transaction()
            if version is not None:
                t.check(self._path(group), version)
            for tp, (o, m) in sorted(offsets.items()):   # a deleted offset is kept as -1
                t.set_data(self._part(group, tp), json.dumps([o, m] if o >= 0 else [-1, ""]).encode())
            results = t.commit()
            if version is not None and isinstance(results[0], BadVersionError | NoNodeError):
                raise StateFencedError(f"group {group!r}: another coordinator holds it now")
            if not any(isinstance(r, Exception) for r in results):
                self.writes += 1
                return
            if version is not None and not self._zk.exists(self._path(group)):
                raise StateFencedError(f"group {group!r} was deleted")
            for tp in offsets:
                if not self._zk.exists(self._part(group, tp)):
                    try:
                        self._zk.create(self._part(group, tp), b'[-1,""]', makepath=True)
                    except NodeExistsError:
                        pass
        raise CoordinationError(f"group {group!r}: commit not stored after creating its partitions")

    @_zk_call
    def offsets(self, group: str) -> Offsets:
        base = f"{self._path(group)}/offsets"
        out: Offsets = {}
        for topic in self._children(base):
            for p in self._children(f"{base}/{topic}"):
                try:
                    raw = self._zk.get(f"{base}/{topic}/{p}")[0]
                except NoNodeError:   # deleted meanwhile
                    continue
                o = _decode_offset(f"{topic}/{p}", raw)
                if o[0] >= 0:
                    out[(unquote(topic), int(p))] = o
        return out

    @_zk_call
    def delete(self, group: str, version: int) -> None:
        path = self._path(group)
        try:
            self._zk.set(path, _encode("", None, None), version=version)   # the node stays: known
            self._zk.delete(f"{path}/offsets", recursive=True)
        except BadVersionError:
            raise StateFencedError(f"group {group!r}: another coordinator holds it now") from None
        except NoNodeError:
            pass
        except NotEmptyError:   # a commit landed meanwhile (only a transaction's)
            raise StateFencedError(f"group {group!r}: changed while being deleted") from None

    @_zk_call
    def groups(self) -> dict[str, str]:
        out = {}
        for name in self._children(self._base):
            try:
                kind = _decode(self._zk.get(f"{self._base}/{name}")[0]).get("kind") or ""
            except NoNodeError:   # deleted meanwhile
                continue
            if kind or self._children(f"{self._base}/{name}/offsets"):
                out[unquote(name)] = kind
        return out

    def _children(self, path: str) -> list[str]:
        try:
            return list(self._zk.get_children(path))
        except NoNodeError:
            return []
