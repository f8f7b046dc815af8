"""A partition's log start with DeleteRecords (pure): where reading may begin, and where a
DeleteRecords moves it.

Two things cut a partition's start: retention (the notification partition's first retained
notification: its part's first record) and DeleteRecords (a Kafka offset stored per
partition in ZooKeeper, only ever moved forward). Readers see the later of the two; a
DeleteRecords may land inside a part, so a log start is a notification offset and an index.
"""

from __future__ import annotations

from collections.abc import Iterable

from .offsets import first_offset

#: DeleteRecords' offset meaning "up to the high watermark".
HIGH_WATERMARK = -1


def moved_start(log_start: Iterable[tuple[int, int]], partition: int) -> int:
    """Where DeleteRecords moved `partition`'s log start (0: never moved), from a topic's
    (partition, Kafka offset) pairs as the metadata carries them."""
    return next((o for p, o in log_start if p == partition), 0)


def log_start(low_note: int, moved: int) -> int:
    """The partition's log start as readers see it: the first record of its first retained
    notification (`low_note`; < 0 while unknown) or where DeleteRecords moved it, whichever is later."""
    return max(first_offset(low_note) if low_note >= 0 else 0, moved)


def deletion_point(asked: int, start: int, high: int) -> int | None:
    """Where a DeleteRecords to `asked` (-1: the high watermark) moves a log start now at `start`,
    with the high watermark at `high`: never backwards (Kafka keeps the later start and answers
    it); None when `asked` is out of range (negative other than -1, or past the high watermark)."""
    target = high if asked == HIGH_WATERMARK else asked
    if not 0 <= target <= high:
        return None
    return max(start, target)
