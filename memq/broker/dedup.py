"""Which Messages a TopicProcessor holds or has recently stored, by (producer id, epoch, sequence).

A producer whose ack did not come in time resends the very same Message. When storage is
slow, the broker still holds the original (in the filling batch or an uploading one), so
storing the resend too multiplies the data exactly when storage is the bottleneck. The
processor asks `seen()` first: a Message still held gets the original's outcome when that
batch finishes; one already stored gets the original's ack at once. A failed batch forgets
its Messages, so the producer's retry is stored afresh. Memory: held Messages are bounded
by the ring; stored ones by `capacity` (oldest forgotten first), each kept as a tuple of
plain values rather than its Ack: the garbage collector stops tracking such tuples, and a
broker hosting many topics keeps millions of entries (an Ack object each made the collector's
passes ~30% of the produce path's CPU).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Iterable

from memq.format import MessageHeader
from memq.format.wire import Ack, AckCode

MessageId = tuple[int, int, int]
Reply = Callable[[Ack], None]
Stored = tuple[str, str, int, int, int]   # the stored original's bucket, key, index, partition, offset


def message_id(h: MessageHeader) -> MessageId:
    return h.producer_id, h.epoch, h.sequence


@dataclasses.dataclass(slots=True)
class Held:
    """A Message in an open or uploading batch, and the duplicates waiting for its outcome."""

    waiters: list[tuple[int, Reply]] = dataclasses.field(default_factory=list)   # (request id, reply)


class RecentMessages:
    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._held: dict[MessageId, Held] = {}
        self._stored: OrderedDict[MessageId, Stored] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held) + len(self._stored)

    def seen(self, mid: MessageId) -> Held | Ack | None:
        """The held entry, the stored original's ack (id 0), or None for a new Message."""
        held = self._held.get(mid)
        if held is not None:
            return held
        where = self._stored.get(mid)
        return None if where is None else Ack(0, True, AckCode.OK, "", *where)

    def hold(self, mid: MessageId) -> None:
        self._held[mid] = Held()

    def stored(self, mids: Iterable[MessageId], bucket: str, key: str, partition: int, offset: int) -> None:
        """The batch holding these Messages (in batch order) is stored in `key` and announced at
        (`partition`, `offset`): remember them, and answer their duplicates. A Message reaches a
        batch only when `seen()` knew nothing of it, so each is new here."""
        stored, held = self._stored, self._held
        for index, mid in enumerate(mids):
            where = (bucket, key, index, partition, offset)
            waiting = held.pop(mid, None)
            if waiting is not None and waiting.waiters:
                self._reply_all(waiting, Ack(0, True, AckCode.OK, "", *where))
            stored[mid] = where
        while len(stored) > self._capacity:
            stored.popitem(last=False)

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
