"""Retry budget and full-jitter exponential backoff (AWS's recommended schedule for S3).

The budget is time, not only a count: an outage of several seconds (a restarting endpoint,
refused connections) must not fail a batch whose producer would still wait for its ack.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from memq.errors import ConfigError


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """At most `max_attempts` tries, none starting later than `budget_s` after the first;
    before retry n (1-based) sleep U(0, min(cap, base * 2**(n-1)))."""

    max_attempts: int
    base_backoff_s: float
    max_backoff_s: float
    budget_s: float = math.inf

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"s3.max_attempts {self.max_attempts} must be >= 1")
        if self.base_backoff_s < 0 or self.max_backoff_s < self.base_backoff_s:
            raise ConfigError(f"s3.base_backoff_s {self.base_backoff_s} / s3.max_backoff_s "
                              f"{self.max_backoff_s}: need 0 <= base <= max")
        if not self.budget_s > 0:
            raise ConfigError(f"s3.retry_budget_s {self.budget_s} must be > 0")

    def delay_s(self, retry: int, rng: random.Random) -> float:
        """Sleep before retry number `retry` (1 = first retry)."""
        return rng.uniform(0.0, min(self.max_backoff_s, self.base_backoff_s * 2 ** (retry - 1)))

    def next_delay(self, retry: int, elapsed_s: float, rng: random.Random) -> float | None:
        """The sleep before retry number `retry`, or None when the attempts or the time are spent."""
        if retry >= self.max_attempts:
            return None
        delay = self.delay_s(retry, rng)
        return delay if elapsed_s + delay < self.budget_s else None
