"""Which Messages a TopicProcessor holds or has recently stored, by (producer id, epoch, sequence).

A producer whose ack did not come in time resends the very same Message. When storage is
slow, the broker still holds the original (in the filling batch or an uploading one), so
storing the resend too multiplies the data exactly when storage is the bottleneck. The
processor asks `seen()` first: a Message still held gets the original's outcome when that
batch finishes; one already stored gets the original's ack at once. A failed batch forgets
its Messages, so the producer's retry is stored afresh. Memory: held Messages are bounded
by the ring; stored ones by `capacity` and by `window_s` (oldest forgotten first): a producer
resends within its delivery timeout, and a count alone let a broker hosting a thousand quiet
topics keep every id for hours (up to `capacity` per topic). Each is kept as a tuple of plain
values, not an Ack object, which the garbage collector stops tracking.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable

from memq.format import MessageHeader
from memq.format.wire import Ack, AckCode

MessageId = tuple[int, int, int]
Reply = Callable[[Ack], None]
Stored = tuple[str, str, int, int, int]   # the stored original's bucket, key, index, partition, offset


def _ack_of(where: Stored) -> Ack:
    """The success ack (id 0) of a Message stored at `where`."""
    return Ack(0, True, AckCode.OK, "", *where)


def message_id(h: MessageHeader) -> MessageId:
    return h.producer_id, h.epoch, h.sequence


@dataclasses.dataclass(slots=True)
class Held:
    """A Message in an open or uploading batch, and the duplicates waiting for its outcome."""

    waiters: list[tuple[int, Reply]] = dataclasses.field(default_factory=list)   # (request id, reply)


@dataclasses.dataclass(slots=True)
class _StoredBatch:
    at: float   # monotonic time it was stored
    ids: int    # of its Messages' ids still remembered (the oldest go first over capacity)


class RecentMessages:
    def __init__(self, capacity: int, window_s: float) -> None:
        self._capacity = capacity
        self._window_s = window_s
        self._held: dict[MessageId, Held] = {}
        self._stored: OrderedDict[MessageId, Stored] = OrderedDict()
        self._batches: deque[_StoredBatch] = deque()   # oldest first

    def __len__(self) -> int:
        return len(self._held) + len(self._stored)

    def seen(self, mid: MessageId) -> Held | Ack | None:
        """The held entry, the stored original's ack (id 0), or None for a new Message."""
        held = self._held.get(mid)
        if held is not None:
            return held
        where = self._stored.get(mid)
        return None if where is None else _ack_of(where)

    def hold(self, mid: MessageId) -> None:
        self._held[mid] = Held()

    def stored(self, mids: Iterable[MessageId], bucket: str, key: str, partition: int, offset: int,
               now: float) -> None:
        """The batch holding these Messages (in batch order) is stored in `key` and announced at
        (`partition`, `offset`) at monotonic time `now`: remember them, answer their duplicates,
        forget what is past the window or the capacity. A Message reaches a batch only when
        `seen()` knew nothing of it, so each is new here."""
        stored, held = self._stored, self._held
        before = len(stored)
        for index, mid in enumerate(mids):
            where = (bucket, key, index, partition, offset)
            waiting = held.pop(mid, None)
            if waiting is not None and waiting.waiters:
                self._reply_all(waiting, _ack_of(where))
            stored[mid] = where
        if len(stored) > before:
            self._batches.append(_StoredBatch(now, len(stored) - before))
        self._forget(now - self._window_s)

    def _forget(self, cutoff: float) -> None:
        """Drop the oldest ids: whole batches stored before `cutoff`, then single ids over capacity."""
        stored, batches = self._stored, self._batches
        while batches and batches[0].at < cutoff:
            for _ in range(batches.popleft().ids):
                stored.popitem(last=False)
        while len(stored) > self._capacity:
            stored.popitem(last=False)
            batches[0].ids -= 1
            if not batches[0].ids:
                batches.popleft()

    def failed(self, mids: Iterable[MessageId], ack: Ack) -> None:
        """The batch failed: its duplicates get the same error; a later resend is stored afresh."""
        for mid in mids:
            held = self._held.pop(mid, None)
            if held is not None:
                self._reply_all(held, ack)

    @staticmethod
    def _reply_all(held: Held, ack: Ack) -> None:
        for request_id, reply in held.waiters:
            reply(dataclasses.replace(ack, id=request_id))
