"""A broker's share groups: the groups it coordinates, the share-partitions it leads, and their writes.

A share-partition's state lives on the broker that leads its partition in Metadata: it is
claimed from the store on first use (fencing the previous owner) and written back in batches:
every `flush_ms` all the partitions changed since the last flush are written, one write each,
and the requests that changed them are answered after that write (`committed`), so an answered
acknowledgement survives a broker restart. A fenced write drops the partition here; its next
fetch here claims it again, and the client re-reads Metadata meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import uuid
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from memq.clock import Clock
from memq.config import ShareConfig
from memq.errors import CoordinationError, MemqError, StateFencedError
from memq.kafka_api.metadata_flex import topic_id

from .group import ShareGroups
from .partition import SharePartition, Snapshot
from .store import ShareStateStore, StateKey

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(slots=True)
class Session:
    """A member's share session on this broker: the partitions it fetches, its epoch."""

    epoch: int
    seen: float
    keys: set[tuple[uuid.UUID, int]] = field(default_factory=set)


class Shares:
    def __init__(self, config: ShareConfig, store: ShareStateStore, clock: Clock, owner: str) -> None:
        self.config = config
        self.store = store
        self._clock = clock
        self._owner = owner
        self.groups = ShareGroups(clock, session_s=config.session_timeout_ms / 1000)
        self.partitions: dict[StateKey, SharePartition] = {}
        self._versions: dict[StateKey, int] = {}
        self._loading: dict[StateKey, asyncio.Task[SharePartition]] = {}
        self._flushed: asyncio.Future[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self.locks: dict[StateKey, asyncio.Lock] = {}
        self.writes = 0
        self.sessions: dict[tuple[str, str], Session] = {}   # (group, member id)
        self.producer_id = secrets.randbits(63)   # of the dead letters this broker appends
        self.sequence = itertools.count()
        self.dead_letters: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._ids: dict[str, uuid.UUID] = {}   # per group: records appended to its dead-letter topic

    def expired_sessions(self) -> list[tuple[tuple[str, str], Session]]:
        """Sessions unused for `session_timeout_ms` (their member died without closing them),
        removed: the caller releases what their members held."""
        limit = self._clock.monotonic() - self.config.session_timeout_ms / 1000
        gone = [(k, s) for k, s in self.sessions.items() if s.seen < limit]
        for k, _ in gone:
            del self.sessions[k]
        return gone

    def topic_names(self, cluster: str, names: Iterable[str]) -> dict[uuid.UUID, str]:
        """Kafka topic id -> name of `names` (ids are a hash: computed once per name here)."""
        ids = self._ids
        for n in names:
            if n not in ids:
                ids[n] = topic_id(cluster, n)
        return {ids[n]: n for n in names}

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in the background, held here until it ends (the loop keeps tasks weakly)."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def now(self) -> float:
        return self._clock.monotonic()

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    async def partition(self, key: StateKey) -> SharePartition:
        """The share-partition's state, claimed from the store on first use here."""
        sp = self.partitions.get(key)
        if sp is not None:
            return sp
        task = self._loading.get(key)
        if task is None:
            task = self._loading[key] = asyncio.get_running_loop().create_task(self._claim(key))
        return await asyncio.shield(task)

    async def _claim(self, key: StateKey) -> SharePartition:
        try:
            snapshot, version = await self._run(self.store.claim, key, self._owner)
            c = self.config
            sp = SharePartition(self._clock, lock_s=c.record_lock_ms / 1000, delivery_limit=c.delivery_count_limit,
                                max_in_flight=c.max_in_flight, snapshot=snapshot)
            self.partitions[key], self._versions[key] = sp, version
            self.locks.setdefault(key, asyncio.Lock())
            return sp
        finally:
            del self._loading[key]

    def lock(self, key: StateKey) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    def drop(self, key: StateKey) -> None:
        """Forget a partition this broker no longer owns (fenced, or its leadership moved)."""
        self.partitions.pop(key, None)
        self._versions.pop(key, None)

    async def committed(self) -> None:
        """Return once every change made so far is written (the next batched flush)."""
        if not any(sp.changed for sp in self.partitions.values()):
            return
        if self._flushed is None:
            self._flushed = asyncio.get_running_loop().create_future()
        done = self._flushed
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_soon())
        await asyncio.shield(done)

    async def _flush_soon(self) -> None:
        await asyncio.sleep(self.config.flush_ms / 1000)
        await self.flush()

    async def flush(self) -> None:
        """Write every changed partition once; wake the requests waiting on it."""
        waiting, self._flushed = self._flushed, None
        dirty = [(k, self._versions[k], sp.snapshot()) for k, sp in self.partitions.items()
                 if sp.changed and k in self._versions]
        try:
            if dirty:
                results = await self._run(self._write_all, dirty)
                for key, result in results:
                    self._written(key, result)
        finally:
            if waiting is not None and not waiting.done():
                waiting.set_result(None)

    def _write_all(self, dirty: list[tuple[StateKey, int, Snapshot]]) -> list[tuple[StateKey, int | MemqError]]:
        out: list[tuple[StateKey, int | MemqError]] = []
        for key, version, snap in dirty:
            try:
                out.append((key, self.store.write(key, self._owner, snap, version)))
            except MemqError as e:
                out.append((key, e))
        return out

    def _written(self, key: StateKey, result: int | MemqError) -> None:
        if isinstance(result, int):
            self._versions[key] = result
            self.writes += 1
        elif isinstance(result, StateFencedError):
            log.warning("share-partition %s: %s; dropping it here", key, result)
            self.drop(key)
        else:   # kept dirty: the next flush tries again
            log.warning("share-partition %s: state not written: %s", key, result)
            sp = self.partitions.get(key)
            if sp is not None:
                sp.changed = True

    async def reset(self, key: StateKey, offset: int) -> None:
        """Move a share-partition's start to `offset` (-1: forget it) and return once that is written:
        claimed here, so the store fences the broker that held it (it re-claims the new state at its
        next write). A copy here that was fenced meanwhile is claimed again, once. Raises MemqError
        when the write failed."""
        for attempt in (1, 2):
            sp = await self.partition(key)
            async with self.lock(key):
                sp.reset(offset)
            await self.committed()
            if self.partitions.get(key) is sp and not sp.changed:
                return
            if self.partitions.get(key) is sp or attempt == 2:
                raise CoordinationError(f"share state {key}: reset to {offset} not written")

    async def stored(self, group: str) -> list[StateKey]:
        """The share-partitions `group` has state for in the store."""
        return await self._run(self.store.keys, group)

    async def start_of(self, key: StateKey) -> int:
        """The share-partition's start offset (-1: no state): this broker's if it holds it, else the store's."""
        sp = self.partitions.get(key)
        if sp is not None:
            return sp.start
        snap = await self._run(self.store.read, key)
        return -1 if snap is None else snap.start

    async def close(self) -> None:
        """Finish the dead letters under way, write what changed (a graceful stop loses no acknowledgement)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
        if self._flusher is not None:
            self._flusher.cancel()
        await self.flush()
