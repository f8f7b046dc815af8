"""The clock seam: code whose behaviour depends on time takes a `Clock`, so tests can step it.

Production code passes `SystemClock()`; tests pass a fake that they advance by hand instead
of patching the stdlib's `time` for the whole process.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Seconds: `monotonic()` for intervals and deadlines, `time()` for wall-clock stamps."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...


class SystemClock:
    """The real clocks (`time.monotonic`, `time.time`)."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()
