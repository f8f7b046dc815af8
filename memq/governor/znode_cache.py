"""Decoded znodes and children lists, each kept until its ZooKeeper watch says it changed.

Why: the governor and every broker re-read the registry on every cycle and on every watch
event; with a thousand topics that was thousands of ZooKeeper reads (and JSON parses) per
cycle per process, most of a quiet broker's CPU. ZooKeeper's watches name exactly the znode
that changed, so each entry is read once per change instead.

Thread-safe and free of I/O: the registry passes the read to `get` and calls `invalidate`
from its watch callback. A read that an invalidation overtook is returned to its caller but
not kept (the next `get` reads again), and `clear` (the session is not connected: watches
may be lost with it) drops everything, including what reads in flight would store.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class ZnodeCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[Hashable, Any] = {}
        self._loading: dict[Hashable, int] = {}     # key -> reads in flight
        self._overtaken: set[Hashable] = set()      # keys invalidated while a read was in flight
        self.loads = 0                              # reads that went to ZooKeeper (for tests, metrics)

    def get(self, key: Hashable, load: Callable[[], T]) -> T:
        """The cached value of `key`, or `load()`'s (kept unless invalidated meanwhile)."""
        with self._lock:
            if key in self._values:
                return self._values[key]  # type: ignore[no-any-return]
            self._loading[key] = self._loading.get(key, 0) + 1
            self.loads += 1
        try:
            value = load()
        except BaseException:
            self._done(key, None, keep=False)
            raise
        self._done(key, value, keep=True)
        return value

    def _done(self, key: Hashable, value: object, *, keep: bool) -> None:
        with self._lock:
            if keep and key not in self._overtaken:
                self._values[key] = value
            left = self._loading[key] - 1
            if left:
                self._loading[key] = left
            else:
                del self._loading[key]
                self._overtaken.discard(key)

    def invalidate(self, key: Hashable) -> None:
        with self._lock:
            self._values.pop(key, None)
            if key in self._loading:
                self._overtaken.add(key)

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
            self._overtaken.update(self._loading)

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)
