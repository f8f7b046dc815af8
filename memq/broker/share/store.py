"""Where share-partition state is kept between brokers and restarts: a Protocol and its stores.

`claim` reads a share-partition's state and marks this broker its owner (a versioned write),
so a broker that owned it before is fenced: its next `write`, checked against the version it
holds, fails with StateFencedError. `ZooKeeperStateStore` keeps one znode per share-partition
(`<root>/<cluster>/share/<group>/<topic>/<partition>`, JSON); `MemoryStateStore` is for a broker
without ZooKeeper (state lives as long as the process).
"""

from __future__ import annotations

import json
import threading
from typing import Protocol
from urllib.parse import quote

from kazoo.exceptions import BadVersionError, NoNodeError

from memq.errors import CoordinationError, StateFencedError
from memq.governor.registry import Registry, claim_node

from .partition import Snapshot

StateKey = tuple[str, str, int]   # (group, topic, partition)


class ShareStateStore(Protocol):
    def claim(self, key: StateKey, owner: str) -> tuple[Snapshot | None, int]:
        """The stored state (None: never written) and the version this owner writes against."""

    def write(self, key: StateKey, owner: str, state: Snapshot, version: int) -> int:
        """Store `state` if the stored version is still `version`; the new version, or StateFencedError."""

    def read(self, key: StateKey) -> Snapshot | None:
        """The stored state, owner unchanged (for describing it; None: never written)."""

    def keys(self, group: str) -> list[StateKey]:
        """The share-partitions `group` has state for, sorted."""


def encode(owner: str, s: Snapshot) -> bytes:
    return json.dumps({"v": 1, "owner": owner, "start": s.start, "end": s.end, "runs": s.runs},
                      separators=(",", ":")).encode()


def decode(raw: bytes) -> Snapshot | None:
    if not raw:
        return None
    try:
        d = json.loads(raw)
        if d.get("v") != 1:
            raise CoordinationError(f"share state version {d.get('v')!r} is not 1: written by a newer memq")
        runs = tuple((int(a), int(n), int(st), int(c)) for a, n, st, c in d["runs"])
        return Snapshot(int(d["start"]), int(d["end"]), runs)
    except (ValueError, KeyError, TypeError) as e:
        raise CoordinationError(f"share state does not parse: {e}") from e


class MemoryStateStore:
    """Versioned state in this process: the same fencing, no durability."""

    def __init__(self) -> None:
        self._data: dict[StateKey, tuple[bytes, int]] = {}
        self._lock = threading.Lock()
        self.writes = 0

    def claim(self, key: StateKey, owner: str) -> tuple[Snapshot | None, int]:
        with self._lock:
            raw, version = self._data.get(key, (b"", -1))
            self._data[key] = (raw, version + 1)
            return decode(raw), version + 1

    def write(self, key: StateKey, owner: str, state: Snapshot, version: int) -> int:
        with self._lock:
            if self._data.get(key, (b"", -1))[1] != version:
                raise StateFencedError(f"share state {key}: another owner since version {version}")
            self._data[key] = (encode(owner, state), version + 1)
            self.writes += 1
            return version + 1

    def read(self, key: StateKey) -> Snapshot | None:
        with self._lock:
            return decode(self._data.get(key, (b"", -1))[0])

    def keys(self, group: str) -> list[StateKey]:
        with self._lock:
            return sorted(k for k, (raw, _) in self._data.items() if k[0] == group and raw)


class ZooKeeperStateStore:
    """One znode per share-partition; blocking (the caller runs it in a thread)."""

    def __init__(self, registry: Registry) -> None:
        self._zk = registry.client
        self._base = f"{registry.base}/share"
        self.writes = 0

    def _path(self, key: StateKey) -> str:
        group, topic, partition = key
        return f"{self._base}/{quote(group, safe='')}/{topic}/{partition}"

    def claim(self, key: StateKey, owner: str) -> tuple[Snapshot | None, int]:
        raw, version = claim_node(self._zk, self._path(key),
                                  lambda raw: encode(owner, state) if (state := decode(raw)) else b"")
        return decode(raw), version

    def write(self, key: StateKey, owner: str, state: Snapshot, version: int) -> int:
        try:
            stat = self._zk.set(self._path(key), encode(owner, state), version=version)
        except (BadVersionError, NoNodeError):
            raise StateFencedError(f"share state {key}: another broker owns it now") from None
        self.writes += 1
        return int(stat.version)

    def read(self, key: StateKey) -> Snapshot | None:
        try:
            raw, _ = self._zk.get(self._path(key))
        except NoNodeError:
            return None
        return decode(raw)

    def keys(self, group: str) -> list[StateKey]:
        base = f"{self._base}/{quote(group, safe='')}"
        out: list[StateKey] = []
        try:
            for topic in self._zk.get_children(base):
                out += [(group, topic, int(p)) for p in self._zk.get_children(f"{base}/{topic}")]
        except NoNodeError:   # no state, or a topic's went meanwhile
            pass
        return sorted(out)
