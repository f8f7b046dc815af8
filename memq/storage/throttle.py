"""Per-prefix admission for S3: a prefix that answered 503 SlowDown gets fewer requests, not more.

S3 limits request rates per key prefix and says `SlowDown` when one is exceeded. Retrying
each request on its own keeps the offered load (or raises it: a recovery storm). Here each
prefix (memq's first key component, 256 of them) has an AIMD concurrency limit: halved on a
throttle answer (at most once per `base_backoff_s`, so one burst of 503s counts once), one
more per success; and after a throttle, a pause with full jitter growing with consecutive
throttles. Other prefixes never wait for a throttled one. Requests that wait here hold their
caller (a broker's upload slot), which is how produce backpressure reaches the producers.

No asyncio object lives across calls (waiters are futures of their own loop, woken thread-
safely), so one throttle serves every event loop a handler is used from.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from memq.clock import Clock, SystemClock
from memq.errors import ConfigError
from memq.storage.pressure import ThrottleShare

T = TypeVar("T")


@dataclass
class _Prefix:
    limit: float
    in_flight: int = 0
    strikes: int = 0                 # throttle answers since the last success
    not_before: float = 0.0          # no request starts before this (monotonic s)
    last_cut: float = float("-inf")  # when the limit was last halved
    waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = field(default_factory=list)


class PrefixThrottle:
    """Admission per prefix: `await run(prefix, request)`, then report how it went via its result."""

    def __init__(self, max_concurrency: int, base_backoff_s: float, max_backoff_s: float, *,
                 clock: Clock | None = None, rng: random.Random | None = None) -> None:
        if max_concurrency < 1 or base_backoff_s < 0 or max_backoff_s < base_backoff_s:
            raise ConfigError(f"prefix throttle: max_concurrency {max_concurrency} >= 1, "
                              f"0 <= base_backoff_s {base_backoff_s} <= max_backoff_s {max_backoff_s}")
        self.max_concurrency = max_concurrency
        self._base = base_backoff_s
        self._cap = max_backoff_s
        self._clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._prefixes: dict[str, _Prefix] = {}
        self._share = ThrottleShare(clock=self._clock)

    def pressure(self) -> float:
        """The share of recent answers over every prefix that were throttles (`ThrottleShare`)."""
        return self._share.share()

    def limit(self, prefix: str) -> float:
        """The prefix's current concurrency limit (`max_concurrency` when healthy)."""
        with self._lock:
            state = self._prefixes.get(prefix)
            return state.limit if state is not None else float(self.max_concurrency)

    def throttled(self, prefix: str) -> bool:
        """Whether the prefix is below its full limit (then no extra requests, e.g. hedges)."""
        return self.limit(prefix) < self.max_concurrency

    async def acquire(self, prefix: str) -> None:
        """Wait for the prefix's pause to end and for one of its slots."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                state = self._prefixes.setdefault(prefix, _Prefix(float(self.max_concurrency)))
                wait_s = state.not_before - self._clock.monotonic()
                if wait_s <= 0 and state.in_flight < max(1, int(state.limit)):
                    state.in_flight += 1
                    return
                waiter: asyncio.Future[None] | None = None
                if wait_s <= 0:
                    waiter = loop.create_future()
                    state.waiters.append((loop, waiter))
            if waiter is None:
                await asyncio.sleep(wait_s)
                continue
            try:
                await waiter
            finally:
                with self._lock:
                    if (loop, waiter) in state.waiters:
                        state.waiters.remove((loop, waiter))

    def release(self, prefix: str, *, throttled: bool | None) -> None:
        """One request of the prefix ended: `throttled` True if S3 asked to slow down, False if it
        succeeded, None if neither says anything about the prefix's rate (other failures, a
        cancelled hedge loser)."""
        if throttled is not None:
            self._share.add(throttled)
        with self._lock:
            state = self._prefixes[prefix]
            state.in_flight -= 1
            now = self._clock.monotonic()
            if throttled:
                if now - state.last_cut >= self._base:
                    state.limit = max(1.0, state.limit / 2)
                    state.last_cut = now
                state.strikes += 1
                pause = self._rng.uniform(0.0, min(self._cap, self._base * 2 ** state.strikes))
                state.not_before = max(state.not_before, now + pause)
            elif throttled is False:
                state.strikes = 0
                state.limit = min(float(self.max_concurrency), state.limit + 1)
            waiters, state.waiters = state.waiters, []
            if state.limit >= self.max_concurrency and state.in_flight == 0 and not waiters:
                del self._prefixes[prefix]   # healthy and idle: nothing to remember
        for loop, waiter in waiters:   # each re-checks; few wait on one prefix
            loop.call_soon_threadsafe(_wake, waiter)

    async def run(self, prefix: str, request: Callable[[], Awaitable[T]],
                  is_throttle: Callable[[BaseException], bool]) -> T:
        """`request()` once admitted on `prefix`; its failure counts as a throttle if `is_throttle`."""
        await self.acquire(prefix)
        throttled: bool | None = None
        try:
            value = await request()
            throttled = False
            return value
        except Exception as exc:
            throttled = True if is_throttle(exc) else None
            raise
        finally:
            self.release(prefix, throttled=throttled)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
