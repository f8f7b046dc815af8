"""Storage I/O for the Consumer on a private asyncio loop in one daemon thread.

The storage handlers are async, while the Consumer is a polling (blocking) API like
Kafka's. The loop owns the storage handler; the consumer thread submits coroutines and gets
`concurrent.futures.Future`s back, so several batches are downloaded, verified and decoded
while the application works on the current one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from memq.config import MemqConfig
from memq.storage import ObjectLocation, StorageHandler, make_storage

T = TypeVar("T")


class FetchLoop:
    """An event loop thread with one StorageHandler and at most `concurrency` GETs at a time,
    plus one worker thread for CPU work (checksums, decompression, decoding): one is enough
    under the GIL, and it lets the caller keep non-thread-safe codec state in it."""

    def __init__(self, config: MemqConfig, concurrency: int) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="memq-consumer-fetch",
                                        daemon=True)
        self._thread.start()
        self._concurrency = concurrency
        self._sem: asyncio.Semaphore | None = None
        self._storage: StorageHandler | None = None
        self._cpu = ThreadPoolExecutor(1, thread_name_prefix="memq-consumer-decode")
        self.run(self._open(config), timeout_s=30)

    async def _open(self, config: MemqConfig) -> None:
        # Created on the loop: aiohttp-style clients bind to the loop that creates them.
        self._sem = asyncio.Semaphore(self._concurrency)
        self._storage = make_storage(config)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run `coro` on the loop and wait for its result from the calling thread."""
        fut = self.submit(coro)
        try:
            return fut.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise

    async def get(self, loc: ObjectLocation) -> bytes:
        assert self._sem is not None and self._storage is not None
        async with self._sem:
            return await self._storage.get(loc)

    async def get_range(self, loc: ObjectLocation, start: int, length: int) -> bytes:
        assert self._sem is not None and self._storage is not None
        async with self._sem:
            return await self._storage.get_range(loc, start, length)

    async def cpu(self, fn: Callable[..., T], *args: object) -> T:
        """Run `fn(*args)` in the CPU worker, keeping the loop free for I/O meanwhile."""
        return await self._loop.run_in_executor(self._cpu, fn, *args)

    def close(self, timeout_s: float = 10) -> None:
        if not self._thread.is_alive():
            return
        try:
            if self._storage is not None:
                self.run(self._storage.close(), timeout_s=timeout_s)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
            if not self._thread.is_alive():
                self._loop.close()
            self._cpu.shutdown(wait=False, cancel_futures=True)
