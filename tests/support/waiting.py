"""Poll a condition until it holds or a deadline passes: the one wait helper the tests share."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(cond: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.05) -> T:
    """The first truthy value of `cond()`; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


async def async_wait_for(cond: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.05) -> T:
    """`wait_for` for a test on the event loop: sleeps with asyncio so the loop keeps running."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)
