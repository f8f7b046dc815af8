"""The manifest of a compacted partition, and the ZooKeeper pointer naming the current one.

A manifest is an immutable JSON object in S3 (a new key per version, stored with the parts under
the topic's compaction home, `compaction_group`): the compacted parts covering notification
offsets [0, `end`) of one partition, in offset order. The current manifest of (topic, partition)
is named by the znode `<zookeeper.root>/<cluster>/compaction/<topic>/<partition>` holding
`ManifestPointer` JSON ({bucket, key, end, version}); a compaction commits by swapping it with a
compare-and-set on the znode's version (`ManifestPointers.swap`). Before the swap readers see
the old manifest (the new objects are orphans the janitor collects), after it the new one:
never a mix.

Readers: `ManifestPointers.get` (cached, ZooKeeper watches refresh it) gives the pointer, and
`ManifestCache.load` the manifest (immutable, so cached by key); `Manifest.parts_from(offset)`
then the parts to read from a Kafka offset, `Manifest.tail_offset` where the plain tail starts
(stored on a dense topic, `dense_tail`: readers then need no count of the prefix's notifications,
which retention may have taken).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar

from kazoo.client import KazooClient

from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.protocol.states import EventType, KazooState, WatchedEvent

from memq.errors import CorruptDataError, CoordinationError
from memq.kafka_api.offsets import first_offset
from memq.storage.base import ObjectLocation

from .parts import PartRef

T = TypeVar("T")
MANIFEST_VERSION = 1
#: The storage group name prefix under which a topic's compacted parts and manifests are stored
#: (`<pp>/<cluster>/groups/compacted.<topic>/...`); storage groups may not use it.
COMPACTION_GROUP_PREFIX = "compacted."


def compaction_group(topic: str) -> str:
    """The storage group (object home) holding `topic`'s compacted parts and manifests."""
    return f"{COMPACTION_GROUP_PREFIX}{topic}"


@dataclass(frozen=True, slots=True)
class ManifestPointer:
    """What the znode holds: the current manifest's object, its `end` and version (1, 2, ...)."""

    bucket: str
    key: str
    end: int              # notification offset where the plain tail starts
    version: int

    @property
    def location(self) -> ObjectLocation:
        return ObjectLocation(self.bucket, self.key)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> ManifestPointer:
        try:
            d = json.loads(data)
            ptr = cls(str(d["bucket"]), str(d["key"]), int(d["end"]), int(d["version"]))
        except (ValueError, KeyError, TypeError) as e:
            raise CoordinationError(f"{where}: manifest pointer is not valid JSON: {e}") from None
        if ptr.end < 0 or ptr.version < 1:
            raise CoordinationError(f"{where}: manifest pointer end {ptr.end} / version {ptr.version} out of range")
        return ptr


@dataclass(frozen=True)
class Manifest:
    """The compacted prefix of one partition: `parts` (offset order, disjoint) cover notifications [0, end)."""

    topic: str
    partition: int
    end: int                                  # notification offset: the plain tail starts here
    version: int
    created_ms: int                           # when it was written (its swap follows at once)
    parts: tuple[PartRef, ...]
    previous: str | None = None               # key of the manifest it replaced (the janitor walks back)
    floor_ms: int = 0                         # oldest object time a notification at or after `end` may name
    stats: dict[str, int] = field(default_factory=dict)   # records, tombstones, bytes, dirty bytes read...
    dense_tail: int | None = None             # a dense topic's: the offset where the plain tail starts (the
                                              # counted base of notification `end`); None: sparse offsets

    @property
    def dense(self) -> bool:
        """Whether its parts hold dense offsets (record numbers, `memq.kafka_api.dense`)."""
        return self.dense_tail is not None

    @property
    def tail_offset(self) -> int:
        """The Kafka offset where the plain tail starts (the first record of notification `end`):
        stored on a dense topic, so no reader needs the prefix's notifications counted to know it."""
        return first_offset(self.end) if self.dense_tail is None else self.dense_tail

    @property
    def records(self) -> int:
        return sum(p.records for p in self.parts)

    @property
    def size(self) -> int:
        """Bytes of its parts' objects."""
        return sum(p.object_size for p in self.parts)

    def parts_from(self, offset: int) -> tuple[PartRef, ...]:
        """The parts a reader at Kafka `offset` reads, in order: from the one holding the first
        survivor at or after `offset` (none when `offset` >= `tail_offset` or past every survivor)."""
        return tuple(p for p in self.parts if p.last_offset >= offset)

    def to_json(self) -> bytes:
        d = asdict(self)
        d["v"] = MANIFEST_VERSION
        if d["dense_tail"] is None:   # a sparse topic's manifest reads as before the field
            del d["dense_tail"]
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | bytearray | memoryview, where: str) -> Manifest:
        """Parse and check (CorruptDataError names `where`)."""
        try:
            d = json.loads(bytes(data))
            if d.pop("v") != MANIFEST_VERSION:
                raise CorruptDataError(f"{where}: manifest version {d.get('v')}, this reader knows {MANIFEST_VERSION}")
            parts = tuple(PartRef(**p) for p in d.pop("parts"))
            m = cls(parts=parts, **d)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptDataError(f"{where}: manifest is not valid: {e}") from None
        prev = -1
        for p in m.parts:
            if p.first_offset <= prev or p.last_offset < p.first_offset or p.last_offset >= m.tail_offset:
                raise CorruptDataError(f"{where}: part {p.key} [{p.first_offset}, {p.last_offset}] out of order "
                                       f"or past the tail at {m.tail_offset}")
            prev = p.last_offset
        return m


class ZnodeCacheLike(Protocol):
    """The registry's `ZnodeCache`: decoded znodes kept until a watch says they changed."""

    def get(self, key: Hashable, load: Callable[[], T]) -> T: ...

    def invalidate(self, key: Hashable) -> None: ...

    def clear(self) -> None: ...


class ObjectReader(Protocol):
    """What loading a manifest needs of storage (any `StorageHandler`)."""

    async def get(self, loc: ObjectLocation) -> bytes: ...


class ManifestCache:
    """Manifests by key (immutable: a key is read once while cached), at most `size` kept."""

    def __init__(self, storage: ObjectReader, size: int = 1024) -> None:
        self.storage = storage
        self.size = size
        self._cache: OrderedDict[str, Manifest] = OrderedDict()

    async def load(self, pointer: ManifestPointer) -> Manifest:
        """The manifest `pointer` names (ObjectNotFoundError if the janitor collected it: read the pointer again)."""
        got = self._cache.get(pointer.key)
        if got is not None:
            self._cache.move_to_end(pointer.key)
            return got
        m = Manifest.from_json(await self.storage.get(pointer.location), str(pointer.location))
        self._cache[pointer.key] = m
        while len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return m


class ZooKeeperSession(Protocol):
    """What the pointers need of a started `memq.governor.registry.Registry`: its kazoo client,
    cluster subtree, timeout and znode cache (so compaction does not import the governor)."""

    @property
    def client(self) -> KazooClient: ...

    @property
    def base(self) -> str: ...

    @property
    def timeout_s(self) -> float: ...

    @property
    def cache(self) -> ZnodeCacheLike: ...


class ManifestPointers:
    """The znodes naming each (topic, partition)'s current manifest, on a started `Registry`'s
    client. Reads are cached until a ZooKeeper watch reports a change (the registry's cache);
    `swap` is the compaction's commit point."""

    def __init__(self, registry: ZooKeeperSession) -> None:
        self.registry = registry
        self.client = registry.client
        self.path = f"{registry.base}/compaction"
        self.cache = registry.cache
        self._lock = threading.Lock()
        self._listening = False

    def _wait(self, result: Any, what: str) -> Any:
        try:
            return result.get(timeout=self.registry.timeout_s)
        except self.client.handler.timeout_exception:
            raise CoordinationError(f"ZooKeeper {what}: no answer within {self.registry.timeout_s:g}s") from None
        except (NoNodeError, NodeExistsError, BadVersionError):
            raise
        except KazooException as e:
            raise CoordinationError(f"ZooKeeper {what}: {type(e).__name__} {e}") from None

    def _listen(self) -> None:
        with self._lock:
            if not self._listening:
                self._listening = True
                self.client.add_listener(self._on_state)

    def _on_state(self, state: KazooState) -> None:
        if state != KazooState.CONNECTED:
            self.cache.clear()

    def _on_event(self, event: WatchedEvent) -> None:
        if event.type in (EventType.CHILD, EventType.DELETED):
            self.cache.invalidate(("compaction-children", event.path))
        if event.type != EventType.CHILD:
            self.cache.invalidate(("compaction", event.path))

    def node(self, topic: str, partition: int) -> str:
        return f"{self.path}/{topic}/{partition}"

    def get(self, topic: str, partition: int) -> ManifestPointer | None:
        """The current pointer of (topic, partition), None before its first compaction. Cached."""
        self._listen()
        path = self.node(topic, partition)

        def load() -> ManifestPointer | None:
            try:
                data, _ = self._wait(self.client.get_async(path, watch=self._on_event), path)
            except NoNodeError:
                # watch its creation: exists() leaves a watch on a missing znode
                if self._wait(self.client.exists_async(path, watch=self._on_event), path) is not None:
                    return load()
                return None
            return ManifestPointer.from_json(bytes(data or b""), path)
        got: ManifestPointer | None = self.cache.get(("compaction", path), load)
        return got

    def of_topic(self, topic: str) -> dict[int, ManifestPointer]:
        """Every compacted partition's pointer of `topic` (uncached children list: for the janitor and tools)."""
        try:
            children = self._wait(self.client.get_children_async(f"{self.path}/{topic}"), topic)
        except NoNodeError:
            return {}
        out = {}
        for c in children:
            if c.isdigit() and (p := self.get(topic, int(c))) is not None:
                out[int(c)] = p
        return out

    def read(self, topic: str, partition: int) -> ManifestPointer | None:
        """The pointer as ZooKeeper holds it now (uncached: before a swap)."""
        path = self.node(topic, partition)
        try:
            data, _ = self._wait(self.client.get_async(path), path)
        except NoNodeError:
            return None
        return ManifestPointer.from_json(bytes(data or b""), path)

    def swap(self, topic: str, partition: int, expected: ManifestPointer | None, new: ManifestPointer) -> bool:
        """Point (topic, partition) at `new` if it still points at `expected` (None: no pointer yet):
        the commit point of a compaction. False, changing nothing, if another compaction won."""
        path = self.node(topic, partition)
        try:
            if expected is None:
                self._wait(self.client.ensure_path_async(f"{self.path}/{topic}"), path)
                self._wait(self.client.create_async(path, new.to_json()), path)
            else:
                data, stat = self._wait(self.client.get_async(path), path)
                if ManifestPointer.from_json(bytes(data or b""), path) != expected:
                    return False
                self._wait(self.client.set_async(path, new.to_json(), version=stat.version), path)
        except (NodeExistsError, BadVersionError, NoNodeError):
            return False
        finally:
            self.cache.invalidate(("compaction", path))
        return True

    def delete_topic(self, topic: str) -> None:
        """Forget `topic`'s pointers (the topic was deleted)."""
        try:
            self.client.delete(f"{self.path}/{topic}", recursive=True)
        except NoNodeError:
            pass
        except KazooException as e:
            raise CoordinationError(f"ZooKeeper {self.path}/{topic}: {type(e).__name__} {e}") from None
