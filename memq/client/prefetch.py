"""Fetching ahead of the application within a memory budget.

`PrefetchBudget` is the arithmetic (pure): what a batch will cost once decoded, learnt from
the batches decoded so far, and whether another one fits. `Prefetch` is the queue of polled
notifications, in order, whose fetches it starts within the budget through the `submit`
function it is given (the Consumer's: the batch reader), so it does no I/O of its own.
"""

from __future__ import annotations

import concurrent.futures
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from memq.client.compacted import PartRead
from memq.client.consumer_record import DecodedBatch
from memq.errors import DataLossError
from memq.format import MessageHeader
from memq.notify import NotificationRecord

RECORD_OVERHEAD = 200      # bytes of Python objects per record beyond its raw bytes (tuples, bytes headers)

#: What the Consumer's queue holds: a polled notification, or a compacted part of a partition's
#: log standing where the notifications it replaced were (`memq.client.compacted`).
Queued = NotificationRecord | PartRead


def object_size(rec: Queued) -> int:
    """Bytes of the part `rec` names."""
    return rec.size if isinstance(rec, PartRead) else rec.notification.size


class PrefetchBudget:
    """Bytes of memory reserved by batches fetched ahead, bounded by `limit`; one batch
    always fits when none is reserved, however large, so progress never stops."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.reserved = 0
        self.expansion = 1.0        # decoded bytes per object byte, measured
        self._measured = False

    @property
    def full(self) -> bool:
        return self.reserved >= self.limit

    def reserve(self, object_size: int) -> int | None:
        """Reserve what a batch of `object_size` bytes takes once decoded; its cost, or None if it does not fit."""
        if self.full and self.reserved > 0:
            return None
        cost = int(object_size * self.expansion)
        self.reserved += cost
        return cost

    def release(self, cost: int) -> None:
        self.reserved -= cost

    def measure(self, object_size: int, headers: Iterable[MessageHeader]) -> None:
        """Learn how much memory a batch takes once decoded (records are Python objects, the
        object is compressed), so the budget bounds memory rather than object bytes."""
        decoded = sum(h.raw_length + RECORD_OVERHEAD * h.count for h in headers)
        ratio = decoded / max(1, object_size)
        self.expansion = 0.8 * self.expansion + 0.2 * ratio if self._measured else ratio
        self._measured = True


@dataclass(slots=True, eq=False)
class Fetch:
    """One polled notification (or compacted part) and the fetch of its batch (None until started)."""

    rec: Queued
    future: concurrent.futures.Future[DecodedBatch] | None = None
    cost: int = 0                                   # bytes reserved in the budget


Submit = Callable[[Queued], concurrent.futures.Future[DecodedBatch]]


class Prefetch:
    """Polled notifications in order, their batches fetched ahead within a `PrefetchBudget`."""

    def __init__(self, budget: PrefetchBudget, submit: Submit) -> None:
        self.budget = budget
        self._submit = submit
        self._queue: deque[Fetch] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def wants_notifications(self) -> bool:
        """Whether to poll more notifications: every queued one started, and room left."""
        return not self.budget.full and all(f.future is not None for f in self._queue)

    def add(self, records: Iterable[Queued]) -> None:
        self._queue.extend(Fetch(r) for r in records)
        self.start()

    def start(self) -> None:
        """Start the queued fetches that fit in the budget, in order."""
        for f in self._queue:
            if f.future is not None:
                continue
            cost = self.budget.reserve(object_size(f.rec))
            if cost is None:
                break
            f.cost, f.future = cost, self._submit(f.rec)

    @property
    def head(self) -> Fetch:
        return self._queue[0]

    def take(self, timeout_s: float) -> tuple[Fetch, DecodedBatch] | None:
        """The head batch with its records once fetched, taken off the queue; None if it did
        not arrive within `timeout_s`. A DataLossError is raised with the batch left at the
        head (raised again on the next take) until `skip()`; any other failure with the batch
        being fetched again."""
        head = self._queue[0]
        assert head.future is not None, "take() before start()"
        try:
            messages = head.future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            return None
        except DataLossError:
            raise
        except Exception:
            head.future = self._submit(head.rec)   # transient: retry on the next take
            raise
        self._queue.popleft()
        self.budget.measure(object_size(head.rec), (h for h, _ in messages))
        return head, messages

    def skip(self) -> Fetch:
        """Take the head batch off the queue unread (it was lost)."""
        return self._queue.popleft()

    def done(self, f: Fetch) -> None:
        """`f` left the application's hands (handed over, skipped or dropped): its memory is free."""
        self.budget.release(f.cost)

    def drop(self, partitions: set[int]) -> None:
        """Forget the queued batches of `partitions` (seek, revocation), cancelling their fetches."""
        for f in [f for f in self._queue if f.rec.partition in partitions]:
            self._queue.remove(f)
            if f.future is not None:
                f.future.cancel()
                self.done(f)

    def pending(self) -> Sequence[tuple[int, int]]:
        """(partition, offset) of the queued batches, in order."""
        return [(f.rec.partition, f.rec.offset) for f in self._queue]

    def partitions(self) -> set[int]:
        return {f.rec.partition for f in self._queue}
