"""How hard the store pushes back: the share of recent answers that were throttles (503 SlowDown).

The per-prefix throttle (`memq.storage.throttle`) spaces out a refused request's retries, but
it cannot lower the rate of requests a broker offers: one PUT per sealed batch, one GET per
batch a reader fetches. Only the writer can do that, by sealing fewer, larger batches while the
store throttles (`memq.broker.storage_group.GroupWriter.batch_age_s`). This is the figure it reads.

Throttles are counted with half the half-life of all answers, and the share scaled back by
that factor: while a storm lasts the figure is the share of throttles, and once it stops it
halves every `half_life_s` even when few requests come (a ratio of two counts that decay alike
would stay where it was until enough successes outweighed the storm). `PRIOR` successes damp a
lone throttle after a quiet spell.
"""

from __future__ import annotations

import math
import threading

from memq.clock import Clock, SystemClock
from memq.errors import ConfigError

PRIOR = 1.0
"""Successes assumed on top of the counted answers: one throttle alone is not a storm."""


class ThrottleShare:
    """Time-decayed share of throttle answers among a store's answers; thread-safe."""

    def __init__(self, half_life_s: float = 1.0, *, clock: Clock | None = None) -> None:
        if half_life_s <= 0:
            raise ConfigError(f"throttle share: half_life_s {half_life_s} must be > 0")
        self._answers_rate = math.log(2) / half_life_s
        self._throttles_rate = 2 * self._answers_rate
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._at = self._clock.monotonic()
        self._throttled = 0.0
        self._answers = 0.0

    def add(self, throttled: bool) -> None:
        """One answer of the store: a throttle, or a success."""
        with self._lock:
            self._decay()
            self._answers += 1.0
            if throttled:
                self._throttled += 1.0

    def share(self) -> float:
        """0.0 (no recent throttle) to 1.0 (every recent answer a throttle)."""
        with self._lock:
            self._decay()
            return min(1.0, 2 * self._throttled / (self._answers + PRIOR))

    def _decay(self) -> None:
        now = self._clock.monotonic()
        if now > self._at:
            self._throttled *= math.exp(-self._throttles_rate * (now - self._at))
            self._answers *= math.exp(-self._answers_rate * (now - self._at))
            self._at = now
