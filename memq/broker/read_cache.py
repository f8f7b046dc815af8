"""The broker's hot-object cache: parts it just wrote or read, bounded in bytes, one load per miss.

A broker serving Kafka readers keeps what it just stored (filled on write) and what readers
asked for, least recently used out first, within `broker.read_cache_bytes`. A miss is loaded
once however many readers ask meanwhile (single flight: N readers of one part, one GET), in a
task of its own, so a reader that gives up cancels nothing the others wait for, and other keys
are served while it loads. Loads in flight are outside the budget: a reader waits for a load
it needs and the door bounds what one Fetch asks for.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from .metrics import BrokerMetrics

Loader = Callable[[], Awaitable[tuple[Any, int]]]   # the value and its size in bytes


class ReadCache:
    def __init__(self, capacity_bytes: int, metrics: BrokerMetrics) -> None:
        self.capacity = capacity_bytes
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._loading: dict[Hashable, asyncio.Task[Any]] = {}
        self._bytes = 0
        self._m = metrics

    @property
    def nbytes(self) -> int:
        return self._bytes

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        """Keep `value` (replacing one under `key`), evicting the least recently used beyond the
        budget; a value larger than the whole budget is not kept."""
        self.discard(key)
        if nbytes > self.capacity:
            return
        self._entries[key] = (value, nbytes)
        self._bytes += nbytes
        while self._bytes > self.capacity:
            _, (_, n) = self._entries.popitem(last=False)
            self._bytes -= n
            self._m.read_cache_evictions.inc()
        self._m.read_cache_bytes.set(self._bytes)

    def discard(self, key: Hashable) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
            self._m.read_cache_bytes.set(self._bytes)

    def peek(self, key: Hashable) -> Any | None:
        """The value under `key` if cached (no load, counted as nothing)."""
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    async def get(self, key: Hashable, load: Loader) -> Any:
        """The value under `key`, loading it (once, whoever else asks meanwhile) on a miss."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self._m.read_cache_hits.inc()
            return entry[0]
        task = self._loading.get(key)
        if task is None:
            self._m.read_cache_misses.inc()
            task = self._loading[key] = asyncio.get_running_loop().create_task(self._load(key, load))
        else:
            self._m.read_cache_hits.inc()   # joined a load in flight: no second GET
        return await asyncio.shield(task)

    async def _load(self, key: Hashable, load: Loader) -> Any:
        try:
            value, nbytes = await load()
            self.put(key, value, nbytes)
            return value
        finally:
            del self._loading[key]
