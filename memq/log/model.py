"""The read model of one partition's log (pure, no I/O): where it starts, where it ends, and
what to read from an offset. Every reader asks it; each side feeds it from its own reads
(`memq.log` names them).

A partition of a memq topic is, in order:
- its **compacted prefix** (compacted topics, after a first compaction): notifications
  [0, `end`) rewritten as the parts the current manifest lists (`memq.compaction.manifest`),
  each holding its survivors at their original offsets, gaps between them;
- its **plain tail**: the notifications from `end` (from 0 without a prefix), each naming a part
  whose records are numbered by (notification offset, index).

Two things cut its start: retention (the first retained notification, `low`) and DeleteRecords
(a record offset per partition in the cluster metadata, only ever forward: `moved`, possibly
inside a part). Readers see the later of the two, except that a compacted prefix, which holds
what came before the first retained notification, starts at its first survivor. The end (high
watermark) is just after the last record a reader gets: the last notification's end when it is
known, else where the next notification's records will start; a compacted partition whose plain
tail is empty ends after its prefix's last survivor (a prefix ending in dropped records leaves
no record to carry a reader's position past them). Transactions publish their notifications at
commit, so the last stable offset is the high watermark.

The offset scheme (a record's offset <-> its notification offset and index) is used here through
one seam, `OffsetScheme` (`SPARSE`: `memq.kafka_api.offsets`, or a partition's dense
`memq.kafka_api.dense.DenseScheme`); every answer below goes through `PartitionLog.scheme`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from memq.compaction.manifest import Manifest
from memq.compaction.parts import PartRef
from memq.errors import OffsetUnknownError
from memq.kafka_api import offsets as sparse

#: DeleteRecords' offset meaning "up to the high watermark".
HIGH_WATERMARK = -1


class OffsetScheme(Protocol):
    """How a record's offset relates to where it is: the one seam the model uses for it.
    `SPARSE` (`notification offset << 24 | index`, gaps between parts) or a partition's
    `memq.kafka_api.dense.DenseScheme` (consecutive record numbers)."""

    def offset_of(self, note: int, index: int) -> int:
        """The offset of record `index` of the part announced at notification `note`."""
        ...

    def position_of(self, offset: int) -> tuple[int, int]:
        """(notification offset, index) of a record offset >= 0: the inverse of `offset_of`."""
        ...

    def start_of(self, note: int) -> int:
        """The offset where the part at notification `note` starts (a notification watermark's image)."""
        ...

    def end_of(self, note: int, count: int) -> int:
        """The offset just after the last of the `count` records of the part at `note`."""
        ...


class SparseScheme:
    """The scheme of topics written before dense offsets: a pure function (`memq.kafka_api.offsets`)."""

    def offset_of(self, note: int, index: int) -> int:
        return sparse.kafka_offset(note, index)

    def position_of(self, offset: int) -> tuple[int, int]:
        return sparse.split_offset(offset)

    def start_of(self, note: int) -> int:
        return sparse.first_offset(note)

    def end_of(self, note: int, count: int) -> int:
        return sparse.end_offset(note, count)


SPARSE: OffsetScheme = SparseScheme()


def moved_start(log_start: Iterable[tuple[int, int]], partition: int, scheme: OffsetScheme = SPARSE) -> int:
    """Where DeleteRecords moved `partition`'s start (0: never moved), in `scheme`'s offsets, from a
    topic's (partition, position) pairs as the cluster metadata carries them (`TopicMetadata.log_start`).

    The metadata carries a position (notification, index) in the sparse form whatever the topic's
    scheme (`stored_start` writes it), so readers that count in notifications (memq's Consumer)
    read it without a topic's bases. A position before the notifications `scheme` counted lies
    before retention's start, which is later: 0."""
    stored = next((o for p, o in log_start if p == partition), 0)
    if not stored or scheme is SPARSE:
        return stored
    try:
        return scheme.offset_of(*SPARSE.position_of(stored))
    except OffsetUnknownError:
        return 0


def stored_start(scheme: OffsetScheme, offset: int) -> int:
    """The form a DeleteRecords start at `offset` (in `scheme`'s offsets) is stored in: its
    position, sparse (`moved_start` reads it back)."""
    return offset if scheme is SPARSE else SPARSE.offset_of(*scheme.position_of(offset))


@dataclass(frozen=True, slots=True)
class PartSegment:
    """A compacted part to read: its survivors of offsets [start, stop)."""

    part: PartRef
    start: int
    stop: int
    first_note: int     # the notification the first survivor read was announced in
    last_note: int      # the position a reader hands it over as: its last survivor's notification
                        # (the prefix's last part: end - 1, so a commit after it is `end`)


@dataclass(frozen=True, slots=True)
class Tail:
    """The plain notifications to read: from `note` (its part's records from `index`), before `stop` (None: open)."""

    note: int
    index: int = 0
    stop: int | None = None


@dataclass(frozen=True, slots=True)
class Segments:
    """What a reader reads from an offset, in order: compacted parts, then the plain tail (None
    when the range ends inside the prefix). `in_prefix`: the offset lies in the compacted prefix
    (its parts may still be none: past every survivor), so the reader moves to the tail after."""

    parts: tuple[PartSegment, ...]
    tail: Tail | None
    in_prefix: bool = False


@dataclass(frozen=True, slots=True)
class PartitionLog:
    """One partition's log as readers see it, from what its side read (`memq.log`).

    `manifest`: the compacted prefix (None: none, or not compacted). `moved`: where DeleteRecords
    moved the start (0: never). `low`, `high`: the first retained and the next notification offset
    (-1: not known). `last_end`: the offset just after the last record a reader gets from the
    notification at `high - 1` (None: not known; the records' count or, on the broker, its parts
    without the copies a reader does not get)."""

    manifest: Manifest | None = None
    moved: int = 0
    low: int = -1
    high: int = -1
    last_end: int | None = None
    scheme: OffsetScheme = SPARSE

    # --- where it starts ---------------------------------------------------------------------

    @property
    def first_survivor(self) -> int | None:
        """The offset of the compacted prefix's first record (its tail's start when nothing
        survived); None without a prefix."""
        m = self.manifest
        if m is None:
            return None
        return m.parts[0].first_offset if m.parts else m.tail_offset

    @property
    def log_start(self) -> int:
        """The first offset a reader may read: the later of retention and DeleteRecords, or the
        compacted prefix's first survivor when the prefix starts before the first retained
        notification (never before DeleteRecords' start); -1 while nothing says where it is."""
        if self.low < 0 and not self.moved and self.manifest is None:
            return -1
        plain = max(self.scheme.start_of(self.low) if self.low >= 0 else 0, self.moved)
        first = self.first_survivor
        return plain if first is None else max(min(plain, first), self.moved)

    def first_offset_at(self, note: int) -> int:
        """Where a reader starting at notification `note` starts (ListOffsets by time): its first
        record, or DeleteRecords' start when that is later."""
        return max(self.scheme.start_of(note), self.moved)

    def before_start(self, offset: int) -> bool:
        """Whether `offset` is out of range whatever the notifications say: negative, or before
        DeleteRecords' start. (An offset behind retention is learnt from the notification Kafka.)"""
        return offset < 0 or offset < self.moved

    # --- the same, by notification (memq's Consumer and Spark count positions in notifications) --

    @property
    def first_note(self) -> int:
        """The first notification with records at or after the start (retention's `low` or the
        one DeleteRecords' start lies in, whichever is later)."""
        return max(self.low, self.scheme.position_of(self.moved)[0] if self.moved else 0)

    @property
    def start_note(self) -> int:
        """Where a reader from earliest begins, in notifications: 0 with a compacted prefix (it
        holds what came before the first retained notification), else `first_note`."""
        return 0 if self.manifest is not None else self.first_note

    @property
    def tail_note(self) -> int:
        """The first plain notification a reader of the whole log reads: the compacted prefix's
        end (0 without one), never before `first_note`."""
        return max(self.first_note, self.manifest.end if self.manifest is not None else 0)

    def deleted(self, note: int) -> bool:
        """Whether the plain notification at `note` lies wholly before DeleteRecords' start."""
        return self.moved > 0 and note < self.scheme.position_of(self.moved)[0]

    def skip(self, note: int) -> int:
        """How many leading records of the plain part at `note` lie before DeleteRecords' start."""
        if not self.moved:
            return 0
        at, index = self.scheme.position_of(self.moved)
        return index if note == at else 0

    # --- where it ends -----------------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        """Just after the last record a reader gets: the last notification's end when known, else
        where the next notification's records will start; a compacted partition with an empty
        plain tail ends after its prefix's last survivor (its tail's start when none survived)."""
        m = self.manifest
        if m is not None and self.high <= m.end:
            return m.parts[-1].last_offset + 1 if m.parts else m.tail_offset
        return self.last_end if self.last_end is not None else self.scheme.start_of(max(self.high, 0))

    @property
    def last_stable_offset(self) -> int:
        """The high watermark: a transaction's notifications are published at its commit."""
        return self.high_watermark

    def deletion_point(self, asked: int) -> int | None:
        """Where a DeleteRecords to `asked` (-1: the high watermark) moves the start: never
        backwards (Kafka keeps the later start and answers it); None when `asked` is out of range
        (negative other than -1, or past the high watermark)."""
        high = self.high_watermark
        target = high if asked == HIGH_WATERMARK else asked
        if not 0 <= target <= high:
            return None
        return max(self.log_start, target)

    # --- what to read --------------------------------------------------------------------------

    def in_prefix(self, offset: int) -> bool:
        """Whether `offset` lies in the compacted prefix (a reader there reads its parts): before
        the offset where its plain tail starts, which the manifest gives without the prefix's
        notifications (a dense topic's may be gone with retention, uncounted)."""
        return self.manifest is not None and offset < self.manifest.tail_offset

    def segments(self, offset: int, stop_note: int | None = None) -> Segments:
        """What a reader at `offset` reads, in order, up to notification `stop_note` (None: on):
        below the compacted prefix's end, its parts from the one holding the first survivor at or
        after `offset` (never before DeleteRecords' start), then the plain notifications from the
        prefix's end; past it (or without a prefix), the plain notifications from `offset`'s.

        A segment's notifications are its survivors' (`scheme.position_of`); a dense survivor whose
        notification's count is gone (retention took it) hands over as the one before the first
        retained (at most the prefix's last), as a sparse one there does once Kafka resets a
        position before it."""
        m = self.manifest
        if m is None or not self.in_prefix(offset):
            at, index = self.scheme.position_of(offset)
            return Segments((), Tail(at, index, stop_note))
        hi = m.tail_offset if stop_note is None or stop_note >= m.end else self.scheme.start_of(stop_note)
        lo = max(offset, self.moved)
        chosen = [p for p in m.parts_from(lo) if p.first_offset < hi]

        def note(o: int) -> int:
            try:
                return self.scheme.position_of(o)[0]
            except OffsetUnknownError:
                return min(max(self.low - 1, 0), m.end - 1)
        parts = tuple(PartSegment(p, max(lo, p.first_offset), hi, note(max(lo, p.first_offset)),
                                  m.end - 1 if i == len(chosen) - 1 else note(p.last_offset))
                      for i, p in enumerate(chosen))
        tail = None if stop_note is not None and stop_note <= m.end else Tail(m.end, 0, stop_note)
        return Segments(parts, tail, in_prefix=True)

    def segments_from_note(self, note: int, stop_note: int | None = None) -> Segments:
        """`segments` from the first record of notification `note` (memq's Consumer, Spark)."""
        return self.segments(self.scheme.start_of(note), stop_note)


class TopicLogs:
    """A topic's partition logs as the cluster metadata gives them to a reader that follows the
    notifications itself (memq's Consumer): each partition's DeleteRecords start, from the
    metadata's (partition, offset) pairs; a partition not named starts where its notifications do."""

    def __init__(self, log_start: Iterable[tuple[int, int]] = (), scheme: OffsetScheme = SPARSE) -> None:
        self._moved = dict(log_start)
        self._scheme = scheme
        self._logs: dict[int, PartitionLog] = {}

    def partition(self, partition: int) -> PartitionLog:
        plog = self._logs.get(partition)
        if plog is None:
            plog = self._logs[partition] = PartitionLog(moved=self._moved.get(partition, 0), scheme=self._scheme)
        return plog

    def in_scheme(self, partition: int, scheme: OffsetScheme) -> PartitionLog:
        """The partition's log in `scheme`'s offsets (a dense topic's, as its reader counts them),
        its DeleteRecords start placed there (`moved_start`)."""
        return PartitionLog(moved=moved_start(self._moved.items(), partition, scheme), scheme=scheme)
