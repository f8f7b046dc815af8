"""Dense offsets (pure, no I/O): a partition's records numbered 0, 1, 2, ... in notification order.

A notification carries its part's record count (`Notification.logmessage_count`), so the base of
notification n (the offset of its first record) is the sum of the counts before it: a running
count over the partition's notification log that every broker, consumer and Spark driver computes
alike, after any restart, with no coordination per record. A record's offset is
`base(note) + index`. Gaps stay only where Kafka has them: compaction, aborted data (an aborted
transaction publishes no notification, so it leaves none), and a retried duplicate notification
(its records are counted, a reader gets one copy).

A reader starting cold does not scan from notification 0: `Checkpoint`s (note, base) stored beside
the notification log give a known base; from one, `PartitionBases` counts forward (`add`) and back
(`add_before`: a base minus the counts of the retained notifications before it), so any checkpoint
inside the retained notifications suffices, whatever retention removed.
"""

from __future__ import annotations

import json
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from memq.errors import CorruptDataError, InvalidInputError, OffsetUnknownError

#: A checkpoint is written when a partition's notifications pass a multiple of this: a cold
#: reader counts at most this many notifications past the newest one (measured: `bench offsets`).
CHECKPOINT_EVERY = 4096
#: Checkpoints kept per partition: the newest at or before retention's low, and every later one.
CHECKPOINTS_KEPT = 64


@dataclass(frozen=True, slots=True, order=True)
class Checkpoint:
    """Notification `note` of a partition starts at offset `base`."""

    note: int
    base: int


def encode_checkpoints(points: Sequence[Checkpoint]) -> bytes:
    """The stored form of a partition's checkpoints (a small JSON list of [note, base])."""
    return json.dumps([[p.note, p.base] for p in points], separators=(",", ":")).encode()


def decode_checkpoints(data: bytes) -> tuple[Checkpoint, ...]:
    """The checkpoints `encode_checkpoints` wrote, sorted; CorruptDataError on anything else."""
    try:
        raw = json.loads(data) if data else []
        points = tuple(sorted(Checkpoint(int(n), int(b)) for n, b in raw))
    except (ValueError, TypeError) as e:
        raise CorruptDataError(f"offset checkpoints: {e}") from e
    if any(p.note < 0 or p.base < 0 for p in points):
        raise CorruptDataError(f"offset checkpoints: negative note or base in {points[:3]}")
    return points


def kept(points: Iterable[Checkpoint], new: Checkpoint, low: int) -> tuple[Checkpoint, ...]:
    """`points` with `new`, without those retention made useless: the newest at or before `low`
    (the first retained notification) stays, so the retained ones keep a base; at most
    `CHECKPOINTS_KEPT`. A conflicting base for a note already stored is a bug: InvalidInputError."""
    by_note = {p.note: p for p in points}
    old = by_note.setdefault(new.note, new)
    if old.base != new.base:
        raise InvalidInputError(f"offset checkpoint of notification {new.note}: base {new.base}, stored {old.base}")
    ordered = sorted(by_note.values())
    before = [p for p in ordered if p.note <= low]
    after = [p for p in ordered if p.note > low]
    return tuple((before[-1:] + after)[-CHECKPOINTS_KEPT:])


def nearest(points: Sequence[Checkpoint], note: int) -> Checkpoint | None:
    """The checkpoint a reader counts from to reach `note`: the newest at or before it, else the
    oldest after it (counting back); None without any."""
    if not points:
        return None
    i = bisect_right(points, Checkpoint(note, 1 << 63))
    return points[i - 1] if i else points[0]


class PartitionBases:
    """The bases of a run of a partition's consecutive notifications [first, next): one i64 each
    (8 MB per million retained notifications), plus the base of `next` (where its records will start)."""

    __slots__ = ("first", "_bases")

    def __init__(self, at: Checkpoint) -> None:
        self.first = at.note
        self._bases = array("q", (at.base,))

    @property
    def next(self) -> int:
        """The first notification whose count is not known yet."""
        return self.first + len(self._bases) - 1

    def checkpoint(self) -> Checkpoint:
        """Where the next notification starts: a checkpoint to store."""
        return Checkpoint(self.next, self._bases[-1])

    def add(self, counted: Iterable[tuple[int, int]]) -> None:
        """Count notifications given as (notification offset, record count) in order: those already
        counted are skipped (a re-read); offsets the notification topic skipped count 0 (Kafka's
        offsets may skip, e.g. control records). A reader passes every retained one from `next` on."""
        bases = self._bases
        nxt = self.next
        for note, count in counted:
            if note < nxt:
                continue
            base = bases[-1]
            bases.extend(base for _ in range(note - nxt))
            bases.append(base + count)
            nxt = note + 1

    def add_before(self, counted: Sequence[tuple[int, int]]) -> None:
        """Count back: (notification offset, record count) of notifications before `first`, in
        order, the last just before it (skipped offsets count 0)."""
        if not counted:
            return
        start = counted[0][0]
        counts = [0] * (self.first - start)
        for note, count in counted:
            counts[note - start] = count
        firsts = array("q", bytes(8 * len(counts)))
        base = self._bases[0]
        for i in range(len(counts) - 1, -1, -1):
            base -= counts[i]
            firsts[i] = base
        if base < 0:
            raise InvalidInputError(f"counting back from notification {self.first}: base {base} < 0")
        firsts.extend(self._bases)
        self._bases = firsts
        self.first = start

    def forget_before(self, note: int) -> None:
        """Drop the bases of notifications before `note` (retention removed them)."""
        drop = min(max(note - self.first, 0), len(self._bases) - 1)
        if drop:
            del self._bases[:drop]
            self.first += drop

    def base(self, note: int) -> int:
        """Where notification `note`'s records start (`note` in [first, next])."""
        i = note - self.first
        if not 0 <= i < len(self._bases):
            raise OffsetUnknownError(f"base of notification {note}: known for [{self.first}, {self.next}]")
        return self._bases[i]

    def position(self, offset: int) -> tuple[int, int]:
        """(notification, index) of `offset`; past the last counted notification, (next, offset - its base)."""
        if offset < self._bases[0]:
            raise OffsetUnknownError(f"offset {offset} lies before notification {self.first} (base {self._bases[0]})")
        i = bisect_right(self._bases, offset) - 1   # among equal bases (empty parts), the last: the one with records
        return self.first + i, offset - self._bases[i]


class DenseScheme:
    """A partition's dense offsets (`memq.log.model.OffsetScheme`) over the bases it knows."""

    __slots__ = ("bases",)

    def __init__(self, bases: PartitionBases) -> None:
        self.bases = bases

    def offset_of(self, note: int, index: int) -> int:
        return self.bases.base(note) + index

    def position_of(self, offset: int) -> tuple[int, int]:
        if offset < 0:
            raise InvalidInputError(f"offset {offset} is negative")
        return self.bases.position(offset)

    def start_of(self, note: int) -> int:
        return self.bases.base(note)

    def end_of(self, note: int, count: int) -> int:
        return self.bases.base(note) + max(count, 0)
