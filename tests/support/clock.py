"""A `memq.clock.Clock` that moves only when the test says so."""

from __future__ import annotations


class FakeClock:
    """Both clocks stand still until `advance`; start values are arbitrary but realistic."""

    def __init__(self, wall_s: float = 1_800_000_000.0, monotonic_s: float = 1_000.0) -> None:
        self._wall_s = wall_s
        self._monotonic_s = monotonic_s

    def monotonic(self) -> float:
        return self._monotonic_s

    def time(self) -> float:
        return self._wall_s

    def advance(self, seconds: float) -> None:
        """Step both clocks forward by `seconds`."""
        self._wall_s += seconds
        self._monotonic_s += seconds
