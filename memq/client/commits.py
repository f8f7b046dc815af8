"""Committing what a Consumer fully handed over: when asked, on the auto-commit interval, and
for partitions being revoked (at-least-once: `Offsets` says what was handed over)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from memq.client.metrics import ConsumerMetrics
from memq.client.positions import Offsets
from memq.clock import Clock


class CommitLog(Protocol):
    """Where offsets are committed (a NotificationConsumer fits)."""

    def commit(self, offsets: Mapping[int, int], asynchronous: bool = False) -> None: ...


class Committer:
    """Commits `offsets`' handed-over positions to `log`. `interval_s` None: no auto-commit."""

    def __init__(self, log: CommitLog, offsets: Offsets, metrics: ConsumerMetrics, *,
                 interval_s: float | None, clock: Clock, logger: logging.Logger) -> None:
        self._log, self._offsets, self._metrics = log, offsets, metrics
        self._interval_s, self._clock, self._logger = interval_s, clock, logger
        self._last = clock.monotonic()

    @property
    def auto(self) -> bool:
        return self._interval_s is not None

    def commit(self, asynchronous: bool = False) -> dict[int, int]:
        """Commit every fully handed batch; the committed {partition: next offset}."""
        offsets = self._offsets.to_commit()
        if offsets:
            self._log.commit(offsets, asynchronous=asynchronous)
            self._offsets.did_commit(offsets)
            self._metrics.commits += 1
        return offsets

    def tick(self) -> None:
        """Commit (asynchronously) if auto-commit is on and its interval has passed."""
        if self._interval_s is None:
            return
        now = self._clock.monotonic()
        if now - self._last >= self._interval_s:
            self._last = now
            self.commit(asynchronous=True)

    def revoked(self, partitions: set[int]) -> None:
        """Commit what was handed over of `partitions` before they leave; a failure is logged
        (the group already moved on; at-least-once covers it)."""
        offsets = self._offsets.to_commit(partitions)
        if not offsets:
            return
        try:
            self._log.commit(offsets, asynchronous=False)
            self._offsets.did_commit(offsets)
        except Exception as e:
            self._logger.warning("commit on revoke failed for %s: %s", sorted(offsets), e)
