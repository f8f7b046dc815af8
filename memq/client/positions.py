"""The Consumer's bookkeeping, with no I/O: what may be committed, where each partition
stands, and which Messages were seen already (duplicates by producer id, epoch, sequence)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping


class Offsets:
    """Per read partition: the next notification offset fetched, fully handed over (so
    committable: at-least-once), and last committed."""

    def __init__(self) -> None:
        self.handed: dict[int, int] = {}
        self.committed: dict[int, int] = {}
        self.fetched_to: dict[int, int] = {}

    def fetched(self, partition: int, offset: int) -> None:
        self.fetched_to[partition] = offset + 1

    def finished(self, partition: int, offset: int) -> None:
        """The batch at `offset` is fully handed over (or skipped)."""
        self.handed[partition] = offset + 1

    def sought(self, partition: int, offset: int) -> None:
        self.fetched_to[partition] = offset

    def to_commit(self, partitions: Iterable[int] | None = None) -> dict[int, int]:
        """What is handed over but not yet committed (of `partitions`, or all)."""
        mine = None if partitions is None else set(partitions)
        return {p: o for p, o in self.handed.items()
                if (mine is None or p in mine) and self.committed.get(p) != o}

    def did_commit(self, offsets: Mapping[int, int]) -> None:
        self.committed.update(offsets)

    def forget(self, partitions: Iterable[int]) -> None:
        """The partitions left this consumer (revoked)."""
        for p in partitions:
            self.handed.pop(p, None)
            self.committed.pop(p, None)
            self.fetched_to.pop(p, None)

    def position(self, kafka: Mapping[int, int | None], assignment: Iterable[int],
                 pending: Iterable[tuple[int, int]]) -> dict[int, int]:
        """The next batch to hand over per partition: Kafka's position, overridden by what was
        fetched ahead, overridden by the oldest batch still pending (in `pending` order)."""
        assigned = set(assignment)
        pos = {p: o for p, o in kafka.items() if o is not None}
        pos.update((p, o) for p, o in self.fetched_to.items() if p in pos or p in assigned)
        for p, o in reversed(list(pending)):
            pos[p] = o
        return pos


class Dedup:
    """Remembers the last `window` Message ids (producer id, epoch, sequence); 0 disables it."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._seen: OrderedDict[tuple[int, int, int], None] = OrderedDict()

    def is_duplicate(self, producer_id: int, epoch: int, sequence: int) -> bool:
        if not self.window:
            return False
        key = (producer_id, epoch, sequence)
        if key in self._seen:
            return True
        self._seen[key] = None
        if len(self._seen) > self.window:
            self._seen.popitem(last=False)
        return False
