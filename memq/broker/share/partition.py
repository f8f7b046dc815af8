"""One share-partition's delivery state (KIP-932), pure: no I/O, time from an injected Clock.

The in-flight window runs from `start` (every record before it is finished) to `end` (the next
offset never yet acquired). Each record in it is AVAILABLE, ACQUIRED by one member until its
lock expires, ACKNOWLEDGED, or ARCHIVED (rejected, or delivered `delivery_limit` times). memq's
offsets are sparse (`notification << 24 | index`), so the window keeps the offsets of real
records only; an acknowledgement range applies to the records inside it and skips the gaps.
`start` moves past finished records as they finish, so the window holds only what is in flight.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from enum import IntEnum

from memq.clock import Clock


class RecordState(IntEnum):
    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4


class AckOutcome(IntEnum):
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3


@dataclass(slots=True)
class _Record:
    state: RecordState
    deliveries: int
    member: str = ""
    deadline: float = 0.0


@dataclass(frozen=True, slots=True)
class Archived:
    """A record set aside: `reason` "rejected" or "delivery_limit"."""

    offset: int
    reason: str
    deliveries: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What is persisted: the window and its records as runs of equal state and delivery count
    (`runs`: (first offset, count of consecutive offsets, state, deliveries))."""

    start: int
    end: int
    runs: tuple[tuple[int, int, int, int], ...]


@dataclass(slots=True)
class Counters:
    acquired: int = 0
    lock_timeouts: int = 0
    redeliveries: int = 0
    acknowledged: int = 0
    archived: int = 0


class SharePartition:
    def __init__(self, clock: Clock, *, lock_s: float = 30.0, delivery_limit: int = 5, max_in_flight: int = 2000,
                 snapshot: Snapshot | None = None) -> None:
        self._clock = clock
        self.lock_s = lock_s
        self.delivery_limit = delivery_limit
        self.max_in_flight = max_in_flight
        self.start = -1   # -1: not started (the first fetch sets it)
        self.end = -1
        self._offsets: list[int] = []            # in-flight record offsets, ascending
        self._records: dict[int, _Record] = {}
        self.counters = Counters()
        self._available = 0            # AVAILABLE records in the window: no scan for redeliveries without any
        self._earliest = math.inf      # no lock expires before this: no scan for timeouts until then
        self.changed = False   # since the last `snapshot()`: the store has something to write
        if snapshot is not None:
            self._restore(snapshot)

    # --- reading ---------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self.start >= 0

    def begin(self, offset: int) -> None:
        """Start the window at `offset` (the log start, or the latest, by the group's policy)."""
        self.start = self.end = offset
        self.changed = True

    def in_flight(self) -> int:
        return len(self._offsets)

    def acquired(self) -> int:
        return sum(1 for r in self._records.values() if r.state is RecordState.ACQUIRED)

    def room(self) -> int:
        """New records the window may still take."""
        return max(self.max_in_flight - len(self._offsets), 0)

    def state_of(self, offset: int) -> tuple[RecordState, int] | None:
        r = self._records.get(offset)
        return None if r is None else (r.state, r.deliveries)

    # --- transitions -----------------------------------------------------------------------

    def expire(self) -> list[Archived]:
        """Locks past their deadline: the record is available again, or archived at the limit."""
        now = self._clock.monotonic()
        if now < self._earliest:
            return []
        out: list[Archived] = []
        earliest = math.inf
        for off in self._offsets:
            r = self._records[off]
            if r.state is RecordState.ACQUIRED:
                if r.deadline <= now:
                    self.counters.lock_timeouts += 1
                    out += self._free(off, r, "delivery_limit")
                else:
                    earliest = min(earliest, r.deadline)
        self._earliest = earliest
        self._advance()
        return out

    def redeliverable(self, limit: int) -> list[int]:
        """Up to `limit` available records of the window, oldest first."""
        out: list[int] = []
        if not self._available:
            return out
        for off in self._offsets:
            if len(out) >= limit:
                break
            if self._records[off].state is RecordState.AVAILABLE:
                out.append(off)
        return out

    def acquire(self, member: str, offsets: list[int]) -> list[tuple[int, int, int]]:
        """Lock `offsets` (available ones of the window, or new ones at or after `end`, ascending,
        while the window has room) for `member`; the acquired ranges as (first, last, delivery
        count), consecutive offsets with one count merged. Offsets not available are skipped."""
        deadline = self._clock.monotonic() + self.lock_s
        got: list[int] = []
        for off in offsets:
            r = self._records.get(off)
            if r is None:
                if off < self.end or len(self._offsets) >= self.max_in_flight:
                    continue   # finished or never a record; or the window is full
                r = self._records[off] = _Record(RecordState.AVAILABLE, 0)
                self._offsets.append(off)
                self.end = off + 1
            elif r.state is not RecordState.AVAILABLE:
                continue
            else:
                self._available -= 1
            if r.deliveries:
                self.counters.redeliveries += 1
            r.state, r.member, r.deadline = RecordState.ACQUIRED, member, deadline
            r.deliveries += 1
            self.counters.acquired += 1
            got.append(off)
        if got:
            self.changed = True
            self._earliest = min(self._earliest, deadline)
        return _ranges([(o, self._records[o].deliveries) for o in got])

    def reset(self, offset: int) -> None:
        """An admin moved the start (AlterShareGroupOffsets) or forgot it (-1: DeleteShareGroupOffsets,
        the next fetch starts by the group's reset policy): nothing is in flight any more."""
        self.start = self.end = offset
        self._offsets.clear()
        self._records.clear()
        self._available, self._earliest = 0, math.inf
        self.changed = True

    def skip_to(self, offset: int) -> None:
        """No records before `offset` beyond the window (the log's gap or its start moved): `end`
        moves there, and `start` too when nothing is in flight."""
        if offset > self.end:
            self.end = offset
            if not self._offsets:
                self.start = offset
            self.changed = True

    def acknowledge(self, member: str, first: int, last: int, outcome: AckOutcome) -> tuple[bool, list[Archived]]:
        """Apply `outcome` to `member`'s acquired records in first..last. False when a record of
        the range is not acquired by `member` (INVALID_RECORD_STATE); the others still apply."""
        lo = bisect.bisect_left(self._offsets, first)
        hi = bisect.bisect_right(self._offsets, last)
        ok = True
        out: list[Archived] = []
        for off in self._offsets[lo:hi]:
            r = self._records[off]
            if r.state is not RecordState.ACQUIRED or r.member != member:
                ok = False
                continue
            if outcome is AckOutcome.ACCEPT:
                r.state = RecordState.ACKNOWLEDGED
                self.counters.acknowledged += 1
            elif outcome is AckOutcome.REJECT:
                out.append(self._archive(off, r, "rejected"))
            else:
                out += self._free(off, r, "delivery_limit")
        if hi > lo:
            self.changed = True
        self._advance()
        return ok, out

    def release_member(self, member: str) -> list[Archived]:
        """`member` is gone (its share session closed): its records are available again."""
        out: list[Archived] = []
        for off in self._offsets:
            r = self._records[off]
            if r.state is RecordState.ACQUIRED and r.member == member:
                out += self._free(off, r, "delivery_limit")
        self._advance()
        return out

    def _free(self, off: int, r: _Record, reason: str) -> list[Archived]:
        self.changed = True
        if r.deliveries >= self.delivery_limit:
            return [self._archive(off, r, reason)]
        r.state, r.member = RecordState.AVAILABLE, ""
        self._available += 1
        return []

    def _archive(self, off: int, r: _Record, reason: str) -> Archived:
        r.state, r.member = RecordState.ARCHIVED, ""
        self.counters.archived += 1
        self.changed = True
        return Archived(off, reason, r.deliveries)

    def _advance(self) -> None:
        """Drop the finished records at the window's head; `start` is the first one in flight."""
        done = 0
        for off in self._offsets:
            if self._records[off].state not in (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED):
                break
            del self._records[off]
            done += 1
        if done:
            del self._offsets[:done]
            self.start = self._offsets[0] if self._offsets else self.end
            self.changed = True

    # --- persistence -----------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The state to persist; an acquired record is saved available (its lock dies with us)."""
        runs: list[tuple[int, int, int, int]] = []
        for off in self._offsets:
            r = self._records[off]
            state = RecordState.AVAILABLE if r.state is RecordState.ACQUIRED else r.state
            if runs:
                first, n, s, d = runs[-1]
                if first + n == off and s == state and d == r.deliveries:
                    runs[-1] = (first, n + 1, s, d)
                    continue
            runs.append((off, 1, int(state), r.deliveries))
        self.changed = False
        return Snapshot(self.start, self.end, tuple(runs))

    def _restore(self, s: Snapshot) -> None:
        self.start, self.end = s.start, s.end
        for first, n, state, deliveries in s.runs:
            for off in range(first, first + n):
                self._records[off] = _Record(RecordState(state), deliveries)
                self._offsets.append(off)
            if state == RecordState.AVAILABLE:
                self._available += n
        self._offsets.sort()


def _ranges(items: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(first, last, count) runs of consecutive offsets with equal delivery counts."""
    out: list[tuple[int, int, int]] = []
    for off, count in items:
        if out and out[-1][1] + 1 == off and out[-1][2] == count:
            out[-1] = (out[-1][0], off, count)
        else:
            out.append((off, off, count))
    return out
