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


def out_of_range(committed: int | None, low: int, high: int) -> bool:
    """Kafka's OffsetOutOfRange: a committed next offset outside the retained log [low, high]
    (`high`, the end, is a valid position: nothing new yet)."""
    return committed is not None and not low <= committed <= high


def is_expired(missing: bool, published_ms: int, now_ms: int, retention_ms: int | None) -> bool:
    """A missing object whose notification is older than the topic's retention was deleted
    by retention: expired, not lost. A corrupt object, or one within retention, is lost."""
    return missing and retention_ms is not None and published_ms > 0 and now_ms - published_ms > retention_ms


class _Seen:
    """One producer instance's sequences seen: all below `floor`; a bitmap from `base`
    (bit i of `bits` is sequence base + i); between them forgotten."""

    __slots__ = ("floor", "base", "bits")

    def __init__(self, base: int) -> None:
        self.floor = 0
        self.base = base
        self.bits = bytearray()


class SequenceTracker:
    """Which Messages of one memq topic were handed over already, by (producer id, epoch,
    sequence), in bounded memory: per producer instance a bitmap over the last `window`
    sequences, plus a floor below which every sequence was seen.

    A producer numbers its Messages of a topic 0, 1, 2, ... per epoch, so what one consumer
    sees is mostly a growing prefix (the floor), and a retried Message is a sequence inside
    it. Order is not guaranteed: a producer's Messages go to several brokers, land in
    different batches and read partitions, and a consumer reads its partitions at different
    paces (a backlog of one partition can be hours behind another). Hence no rule of the
    form "drop everything below the high-water": a Message first seen late would be dropped,
    which is data loss. A gap (a sequence still to come, given up by the producer, or read
    by another group member) stays a 0 bit; a sequence more than `window` below the highest
    seen is *forgotten*, never claimed seen: forgetting can only let a very late resend
    through (a duplicate), while claiming could drop a first delivery.

    A bitmap, not a list of seen ranges: its memory follows the sequences spanned (at most
    `window` / 8 bytes per producer), not the number of gaps. After a stall a consumer reads
    each partition's backlog in long runs, so a producer's sequences (spread over brokers
    and partitions) come in thousands of one-Message ranges: a bound on ranges forgot the
    originals before their resends came (a 10 s Kafka freeze: 220 duplicates delivered).
    Producers beyond `max_producers` are forgotten least recently used first.
    """

    def __init__(self, max_producers: int, window: int) -> None:
        self.max_producers = max_producers
        self.window = max(64, window - window % 8)
        self._producers: OrderedDict[tuple[int, int], _Seen] = OrderedDict()

    def __len__(self) -> int:
        """Producer instances remembered."""
        return len(self._producers)

    def clear(self) -> None:
        """Forget everything (the reader was moved: what it reads again is wanted again)."""
        self._producers.clear()

    def ranges(self, producer_id: int, epoch: int) -> list[tuple[int, int]]:
        """The seen ranges [start, end) of one producer instance, lowest first."""
        state = self._producers.get((producer_id, epoch))
        if state is None:
            return []
        out = [(0, state.floor)] if state.floor else []
        for i in range(len(state.bits) * 8):
            if state.bits[i >> 3] >> (i & 7) & 1:
                s = state.base + i
                if out and out[-1][1] == s:
                    out[-1] = (out[-1][0], s + 1)
                else:
                    out.append((s, s + 1))
        return out

    def footprint(self, producer_id: int, epoch: int) -> int:
        """Bytes of bitmap held for one producer instance (at most `window` / 8)."""
        state = self._producers.get((producer_id, epoch))
        return 0 if state is None else len(state.bits)

    def seen(self, producer_id: int, epoch: int, sequence: int) -> bool:
        """True if this Message was seen before (a duplicate); else remember it, False."""
        key = (producer_id, epoch)
        state = self._producers.get(key)
        if state is None:
            # a reader may start mid-stream or see a later sequence first: room below for reordering
            state = self._producers[key] = _Seen(max(0, sequence - self.window // 2) & ~7)
            if len(self._producers) > self.max_producers:
                self._producers.popitem(last=False)
        else:
            self._producers.move_to_end(key)
        if sequence < state.base:
            return sequence < state.floor       # below the floor: seen; else forgotten: delivered
        i = sequence - state.base
        bits = state.bits
        if i >= self.window:
            self._slide(state, i - self.window + 1)
            i = sequence - state.base
        byte, mask = i >> 3, 1 << (i & 7)
        if byte >= len(bits):
            bits.extend(bytes(byte + 1 - len(bits)))
        elif bits[byte] & mask:
            return True
        bits[byte] |= mask
        if byte == 0 and bits[0] == 0xFF and state.floor == state.base:
            self._compact(state)
        return False

    def _slide(self, state: _Seen, nbits: int) -> None:
        """Forget at least `nbits` of the lowest sequences (a quarter window at once: amortized)."""
        nbytes = -(-max(nbits, self.window // 4) // 8)
        dropped = state.bits[:nbytes]
        if state.floor == state.base and len(dropped) == nbytes and dropped.count(0xFF) == nbytes:
            state.floor += nbytes * 8            # all seen: the floor rises with the window
        del state.bits[:nbytes]
        state.base += nbytes * 8

    @staticmethod
    def _compact(state: _Seen) -> None:
        """The lowest bytes are all seen and contiguous with the floor: raise both past them."""
        full = len(state.bits) - len(state.bits.lstrip(b"\xff"))
        del state.bits[:full]
        state.base += full * 8
        state.floor = state.base
