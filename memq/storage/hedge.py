"""Hedged requests: after the usual latency of a kind of request, send a second; first answer wins.

S3 answers most requests in tens of ms and a few in seconds, and a batch's ack or a reader's
fetch waits for its slowest request. A second attempt sent once the first has taken longer
than the pNN of recent requests of the same kind (op and size class) cuts that tail for a
few % more requests. The loser is cancelled (obstore drops its connection). A hedged PUT goes
under its own attempt key, like a retry, so it never overwrites what another attempt wrote.

No asyncio objects live across calls, so a `Hedger` serves any event loop.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from memq.clock import Clock, SystemClock
from memq.errors import ConfigError

T = TypeVar("T")

HEDGE_MIN_SAMPLES = 50
"""Latencies of a kind seen before its requests are hedged: a percentile of fewer is noise."""
WINDOW = 500
"""Recent latencies kept per kind."""
BURST = 10.0
"""Hedges that may be sent back to back when the share allows (the token bucket's size)."""
_RECOMPUTE_EVERY = 16


def size_class(nbytes: int) -> int:
    """Requests within 8x of each other's size share a latency distribution."""
    return max(nbytes, 1).bit_length() // 3


class LatencyWindow:
    """The last `WINDOW` latencies of one kind of request and a percentile of them."""

    def __init__(self) -> None:
        self._seen: deque[float] = deque(maxlen=WINDOW)
        self._adds = 0
        self._cached: dict[float, float] = {}

    def add(self, seconds: float) -> None:
        self._seen.append(seconds)
        self._adds += 1
        if self._adds % _RECOMPUTE_EVERY == 0:
            self._cached.clear()

    def percentile(self, pct: float) -> float | None:
        """The `pct` percentile (nearest rank), None until `HEDGE_MIN_SAMPLES` are known."""
        if len(self._seen) < HEDGE_MIN_SAMPLES:
            return None
        value = self._cached.get(pct)
        if value is None:
            ordered = sorted(self._seen)
            value = self._cached[pct] = ordered[min(len(ordered) - 1, math.ceil(pct / 100 * len(ordered)) - 1)]
        return value


class Hedger:
    """When to hedge a request of a kind, and whether the share of hedged requests allows it.

    Each request adds `max_share` of a token (up to `BURST`), each hedge spends one: over
    time at most `max_share` of requests are hedged. `max_share` 0 turns hedging off.
    """

    def __init__(self, percentile: float, max_share: float, min_delay_s: float,
                 clock: Clock | None = None) -> None:
        if not 0 < percentile < 100 or not 0 <= max_share <= 1 or min_delay_s < 0:
            raise ConfigError(f"hedging: percentile {percentile} (0-100), max_share {max_share} (0-1), "
                              f"min_delay_s {min_delay_s} (>= 0)")
        self.percentile = percentile
        self.max_share = max_share
        self.min_delay_s = min_delay_s
        self._clock = clock or SystemClock()
        self._windows: dict[str, LatencyWindow] = {}
        self._tokens = 0.0

    def delay(self, kind: str) -> float | None:
        """Seconds after which to hedge a request of `kind` now starting; None: do not hedge it."""
        if self.max_share <= 0:
            return None
        self._tokens = min(BURST, self._tokens + self.max_share)
        window = self._windows.get(kind)
        p = window.percentile(self.percentile) if window is not None else None
        return None if p is None else max(p, self.min_delay_s)

    def admit(self) -> bool:
        """Spend a hedge if the share allows one now."""
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def observe(self, kind: str, seconds: float) -> None:
        window = self._windows.get(kind)
        if window is None:
            window = self._windows[kind] = LatencyWindow()
        window.add(seconds)

    async def timed(self, kind: str, request: Callable[[], Awaitable[T]]) -> T:
        """`request()`, its latency observed when it answers, and when it is cancelled as a loser
        (then as a lower bound: a slow request must not drop out of the percentile)."""
        started = self._clock.monotonic()
        try:
            value = await request()
        except asyncio.CancelledError:
            self.observe(kind, self._clock.monotonic() - started)
            raise
        self.observe(kind, self._clock.monotonic() - started)
        return value


async def first_of(primary: Awaitable[T], delay_s: float | None,
                   hedge: Callable[[], Awaitable[T] | None], *, settle: bool = False) -> tuple[T, int]:
    """(value, 0) of `primary`, or (value, 1) of the hedge started after `delay_s` if it answers first.

    `hedge()` starts the second request, or returns None (not allowed now). The loser is
    cancelled. If every request started fails, the one that failed last is raised (a retry
    then starts from the freshest failure); cancelling the caller cancels both.

    `settle` (PUTs): when the primary answers first, the hedge is not cancelled but awaited and,
    if it succeeds, returned: its attempt key is the higher one, which a listing names, so the
    caller must name it too (a cancelled hedge could still land).
    """
    if delay_s is None:
        return await primary, 0
    tasks: list[asyncio.Future[T]] = [asyncio.ensure_future(primary)]
    try:
        await asyncio.wait(tasks, timeout=delay_s)
        if not tasks[0].done():
            second = hedge()
            if second is not None:
                tasks.append(asyncio.ensure_future(second))
        pending: set[asyncio.Future[T]] = set(tasks)
        error: BaseException | None = None
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                error = t.exception() or error
            ok = [i for i, t in enumerate(tasks) if t.done() and t.exception() is None]
            if ok and (not settle or not pending or ok[-1] == len(tasks) - 1):
                chosen = ok[-1] if settle else ok[0]
                return tasks[chosen].result(), chosen
        assert error is not None
        raise error
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
