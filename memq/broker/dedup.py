"""Which Messages a TopicProcessor holds or has recently stored, by (producer id, epoch, sequence).

A producer whose ack did not come in time resends the very same Message. When storage is
slow, the broker still holds the original (in the filling batch or an uploading one), so
storing the resend too multiplies the data exactly when storage is the bottleneck. The
processor asks `seen()` first: a Message still held gets the original's outcome when that
batch finishes; one already stored gets the original's ack at once. A failed batch forgets
its Messages, so the producer's retry is stored afresh. Memory: held Messages are bounded
by the ring; stored ones by `capacity` and by `window_s` (oldest forgotten first): a producer
resends within its delivery timeout, and a count alone let a broker hosting a thousand quiet
topics keep every id for hours (up to `capacity` per topic). A stored batch's location is kept
once, with its ids mapped to their places in it, not an Ack per Message.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterable
from itertools import accumulate, islice, repeat
from operator import attrgetter

from memq.format.wire import Ack, AckCode

MessageId = tuple[int, int, int]
Reply = Callable[[Ack], None]

#: A Message header's (producer id, epoch, sequence), by attrgetter: no Python frame per Message.
message_id: Callable[..., MessageId] = attrgetter("producer_id", "epoch", "sequence")


@dataclasses.dataclass(slots=True)
class Held:
    """A Message in an open or uploading batch, and the duplicates waiting for its outcome."""

    waiters: list[tuple[int, Reply]] = dataclasses.field(default_factory=list)   # (request id, reply)


@dataclasses.dataclass(slots=True)
class _StoredBatch:
    """Where a stored batch's Messages are; `index` maps each remembered id to its place."""

    at: float   # monotonic time it was stored
    bucket: str
    key: str
    partition: int
    offset: int
    index: dict[MessageId, int]
    firsts: list[int]   # per Message, the index of its first LogMessage in the part ([] if not known)

    def ack(self, mid: MessageId) -> Ack:
        """The success ack (id 0) of a Message of this batch."""
        i = self.index[mid]
        return Ack(0, True, AckCode.OK, "", self.bucket, self.key, i, self.partition, self.offset,
                   record=self.firsts[i] if i < len(self.firsts) else -1)


class RecentMessages:
    """Per Message, dict operations run in C (`map`, `dict.fromkeys`, `zip`): with 100 topics of
    one-value Messages the Python loop per Message here was ~13% of the broker."""

    def __init__(self, capacity: int, window_s: float) -> None:
        self._capacity = capacity
        self._window_s = window_s
        self._held: dict[MessageId, Held | None] = {}     # None: held, no duplicate waiting yet
        self._stored: dict[MessageId, _StoredBatch] = {}
        self._batches: deque[_StoredBatch] = deque()      # oldest first

    def __len__(self) -> int:
        return len(self._held) + len(self._stored)

    def seen(self, mid: MessageId) -> Held | Ack | None:
        """The held entry, the stored original's ack (id 0), or None for a new Message."""
        held = self._held
        if mid in held:
            entry = held[mid]
            if entry is None:
                entry = held[mid] = Held()
            return entry
        batch = self._stored.get(mid)
        return None if batch is None else batch.ack(mid)

    def hold(self, mid: MessageId) -> None:
        self._held[mid] = None

    def stored(self, mids: Iterable[MessageId], bucket: str, key: str, partition: int, offset: int,
               now: float, counts: Iterable[int] = ()) -> None:
        """The batch holding these Messages (in batch order, `counts` LogMessages each) is stored
        in `key` and announced at (`partition`, `offset`) at monotonic time `now`: remember them,
        answer their duplicates, forget what is past the window or the capacity. A Message
        reaches a batch only when `seen()` knew nothing of it, so each is new here."""
        ids = list(mids)
        firsts = list(accumulate(counts, initial=0))   # in C: no Python frame per Message
        batch = _StoredBatch(now, bucket, key, partition, offset, dict(zip(ids, range(len(ids)))), firsts)
        waiting = list(map(self._held.pop, ids, repeat(None)))
        if any(waiting):
            for mid, held in zip(ids, waiting):
                if held is not None and held.waiters:
                    self._reply_all(held, batch.ack(mid))
        if ids:
            self._stored.update(dict.fromkeys(ids, batch))
            self._batches.append(batch)
        self._forget(now - self._window_s)

    def _forget(self, cutoff: float) -> None:
        """Drop the oldest ids: whole batches stored before `cutoff`, then ids over capacity."""
        stored, batches = self._stored, self._batches
        while batches and batches[0].at < cutoff:
            deque(map(stored.pop, batches.popleft().index, repeat(None)), maxlen=0)
        while len(stored) > self._capacity:
            oldest, excess = batches[0], len(stored) - self._capacity
            if excess >= len(oldest.index):
                deque(map(stored.pop, batches.popleft().index, repeat(None)), maxlen=0)
            else:
                for mid in list(islice(oldest.index, excess)):
                    del oldest.index[mid]
                    stored.pop(mid, None)

    def failed(self, mids: Iterable[MessageId], ack: Ack) -> None:
        """The batch failed: its duplicates get the same error; a later resend is stored afresh."""
        for held in map(self._held.pop, mids, repeat(None)):
            if held is not None:
                self._reply_all(held, ack)

    @staticmethod
    def _reply_all(held: Held, ack: Ack) -> None:
        for request_id, reply in held.waiters:
            reply(dataclasses.replace(ack, id=request_id))
