"""Retry budget and full-jitter exponential backoff (AWS's recommended schedule for S3)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from memq.errors import ConfigError


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """`max_attempts` tries in total; before retry n (1-based) sleep U(0, min(cap, base * 2**(n-1)))."""

    max_attempts: int
    base_backoff_s: float
    max_backoff_s: float

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"s3.max_attempts {self.max_attempts} must be >= 1")
        if self.base_backoff_s < 0 or self.max_backoff_s < self.base_backoff_s:
            raise ConfigError(f"s3.base_backoff_s {self.base_backoff_s} / s3.max_backoff_s "
                              f"{self.max_backoff_s}: need 0 <= base <= max")

    def delay_s(self, retry: int, rng: random.Random) -> float:
        """Sleep before retry number `retry` (1 = first retry)."""
        return rng.uniform(0.0, min(self.max_backoff_s, self.base_backoff_s * 2 ** (retry - 1)))
