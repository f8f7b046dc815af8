"""Concurrent callers asking for the same key share one in-flight call (connect, refresh)."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    """Run `call()` once per key at a time; callers arriving meanwhile await its result.

    Waiters are shielded, so one caller's cancellation does not cancel the shared call for
    the others; a failure reaches every waiter.
    """

    def __init__(self) -> None:
        self._pending: dict[K, asyncio.Future[V]] = {}

    async def run(self, key: K, call: Callable[[], Awaitable[V]]) -> V:
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._pending[key] = fut
        try:
            result = await call()
            fut.set_result(result)
            return result
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()   # mark retrieved: waiters re-raise it themselves
            raise
        finally:
            del self._pending[key]
