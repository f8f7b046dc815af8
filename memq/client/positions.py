"""The Consumer's bookkeeping, with no I/O: what may be committed, where each partition
stands, and which Messages were seen already (duplicates by producer id, epoch, sequence)."""

from __future__ import annotations

from bisect import bisect_right
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


def out_of_range(committed: int | None, low: int, high: int) -> bool:
    """Kafka's OffsetOutOfRange: a committed next offset outside the retained log [low, high]
    (`high`, the end, is a valid position: nothing new yet)."""
    return committed is not None and not low <= committed <= high


def is_expired(missing: bool, published_ms: int, now_ms: int, retention_ms: int | None) -> bool:
    """A missing object whose notification is older than the topic's retention was deleted
    by retention: expired, not lost. A corrupt object, or one within retention, is lost."""
    return missing and retention_ms is not None and published_ms > 0 and now_ms - published_ms > retention_ms


class SequenceTracker:
    """Which Messages of one memq topic were handed over already, by (producer id, epoch,
    sequence), in bounded memory: per producer instance (id, epoch) the sequences seen, as
    sorted disjoint ranges [start, end).

    A producer numbers its Messages of a topic 0, 1, 2, ... per epoch, so what one consumer
    sees is mostly one growing range (a high-water mark), and a retried Message is a sequence
    inside a range. Order is not guaranteed: a producer's Messages go to several brokers,
    land in different batches and read partitions, and a consumer reads its partitions at
    different paces (a backlog of one partition can be hours behind another). Hence no rule
    of the form "drop everything below the high-water": a Message first seen late would be
    dropped, which is data loss. Instead, gaps (sequences still to come, or given up by the
    producer, or read by another group member) stay open as separate ranges, and when a
    producer has more than `max_ranges` ranges, the lowest one is *forgotten*, never merged
    across its gap: forgetting can only let a very late resend through (a duplicate), while
    merging could drop a first delivery. Producers beyond `max_producers` are forgotten least
    recently used first, likewise. A new epoch is a new producer instance, tracked apart.
    """

    def __init__(self, max_producers: int, max_ranges: int) -> None:
        self.max_producers = max_producers
        self.max_ranges = max_ranges
        self._producers: OrderedDict[tuple[int, int], tuple[list[int], list[int]]] = OrderedDict()

    def __len__(self) -> int:
        """Producer instances remembered."""
        return len(self._producers)

    def clear(self) -> None:
        """Forget everything (the reader was moved: what it reads again is wanted again)."""
        self._producers.clear()

    def ranges(self, producer_id: int, epoch: int) -> list[tuple[int, int]]:
        """The seen ranges [start, end) of one producer instance, lowest first."""
        starts, ends = self._producers.get((producer_id, epoch), ((), ()))
        return list(zip(starts, ends))

    def seen(self, producer_id: int, epoch: int, sequence: int) -> bool:
        """True if this Message was seen before (a duplicate); else remember it, False."""
        key = (producer_id, epoch)
        state = self._producers.get(key)
        if state is None:
            self._producers[key] = ([sequence], [sequence + 1])
            if len(self._producers) > self.max_producers:
                self._producers.popitem(last=False)
            return False
        self._producers.move_to_end(key)
        starts, ends = state
        if sequence == ends[-1]:            # the common case: the next one in order
            ends[-1] = sequence + 1
            return False
        i = bisect_right(starts, sequence) - 1
        if i >= 0 and sequence < ends[i]:
            return True
        joins_left = i >= 0 and ends[i] == sequence
        joins_right = i + 1 < len(starts) and starts[i + 1] == sequence + 1
        if joins_left and joins_right:
            ends[i] = ends.pop(i + 1)
            del starts[i + 1]
        elif joins_left:
            ends[i] = sequence + 1
        elif joins_right:
            starts[i + 1] = sequence
        else:
            starts.insert(i + 1, sequence)
            ends.insert(i + 1, sequence + 1)
            if len(starts) > self.max_ranges:
                del starts[0], ends[0]
        return False
