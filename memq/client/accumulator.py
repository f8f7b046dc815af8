"""The Producer's buffering, with no I/O and no event loop (the sans-I/O half of the Producer).

Records wait per lane, (topic, read partition), in an open buffer; the buffer seals into a
Message when its records reach `seal_bytes` (estimated from their raw sizes), or when the
caller's linger timer, started as the buffer opened, runs out (time is the caller's: this module keeps no clock
but the Message creation time it stamps). Sealing assigns the topic's next sequence and the Message's creation time and encodes it,
leaving `headroom` bytes in front for the request header the sender writes per attempt.
Who waits for which records is opaque here (`W`): the Producer's waiters.

A lane's partition is -1 for records without a key (the broker puts them in its batch's partition);
on a topic of several read partitions the Producer places keyed records by key: each partition
is a lane of its own, its Messages name their partition (memq.format.wire's RequestFlag.PARTITION).
Sequences stay per topic.

Each open buffer tracks its records' timestamp range, so encoding is one msgpack call plus
compression, with no per-record pass (`encode_message(timestamps=..., shaped=True)`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from memq.errors import MemqError
from memq.format.codec import Codec, Compressors
from memq.format.message import encode_message
from memq.format.wire import request_header_size

class Waiting(Protocol):
    """Whoever waits for a run of records: told where in its Message the run starts."""

    position: int


W = TypeVar("W", bound=Waiting)

RECORD_OVERHEAD = 16            # msgpack framing of one record, for size estimates

Lane = tuple[str, int]          # (topic, read partition: -1 unless placed by key)


def now_ms() -> int:
    return int(time.time() * 1000)


def record_size(r: tuple) -> int:
    """Estimated encoded bytes of one 5-tuple record (value, key, headers, timestamp, id)."""
    return (len(r[0]) + (len(r[1]) if r[1] else 0) + sum(len(k) + len(v) for k, v in r[2])
            + RECORD_OVERHEAD)


@dataclass(slots=True)
class _Open(Generic[W]):
    """Records of one topic not yet sealed into a Message."""

    records: list[tuple] = field(default_factory=list)
    waiters: list[W] = field(default_factory=list)
    nbytes: int = 0
    lo: int = 2 ** 63 - 1                # min / max timestamp_ms of `records`
    hi: int = -2 ** 63


@dataclass(slots=True)
class Sealed(Generic[W]):
    """A sealed Message: `frame` is `message_at` bytes of headroom, then the encoded Message.
    `error` is set (and `frame` empty) when encoding failed: its waiters fail."""

    topic: str
    partition: int                       # the read partition it names (-1: the broker picks)
    sequence: int
    frame: bytearray
    message_at: int
    count: int
    nbytes: int                          # the records' estimated bytes (the in-flight budget)
    created_ms: int
    waiters: list[W]
    error: MemqError | None = None


class Accumulator(Generic[W]):
    """Open buffers per lane, sealed by size or linger into encoded, sequenced Messages."""

    def __init__(self, *, seal_bytes: int, producer_id: int, epoch: int, codec: Codec,
                 clock_ms: Callable[[], int] = now_ms, transactional_id: str = "") -> None:
        """`transactional_id`: headroom for a transactional request header (memq.format.wire)."""
        self.seal_bytes = seal_bytes
        self._transactional_id = transactional_id
        self._producer_id = producer_id
        self._epoch = epoch
        self._codec = codec
        self._clock_ms = clock_ms
        self._compressors = Compressors()
        self._open: dict[Lane, _Open[W]] = {}
        self._sequences: dict[str, int] = {}

    def restamp(self, producer_id: int, epoch: int) -> None:
        """Messages sealed from now on carry these ids (a transaction's init gave them); nothing
        may be open, so no Message mixes records of two producer instances."""
        if self._open:
            raise MemqError(f"restamp with records buffered for {sorted(self._open)}")
        self._producer_id, self._epoch = producer_id, epoch

    def knows(self, topic: str) -> bool:
        return topic in self._sequences

    def register(self, topic: str) -> None:
        """Start `topic`'s sequence at 0 (once its existence was checked)."""
        self._sequences.setdefault(topic, 0)

    def room(self, lane: Lane) -> int:
        """Bytes the lane's open buffer takes before it seals (at least 1)."""
        p = self._open.get(lane)
        return max(self.seal_bytes - (p.nbytes if p else 0), 1)

    def add(self, lane: Lane, records: list[tuple], nbytes: int, lo: int, hi: int,
            waiter: W) -> tuple[bool, bool]:
        """Append `records` (estimated `nbytes`, timestamps in [lo, hi]) to the lane's open
        buffer; `waiter` waits for them (its `position` is set to the first one's index in the
        Message). Returns (opened: a new buffer was started, so its linger starts now; full:
        it must seal now)."""
        p = self._open.get(lane)
        opened = p is None
        if p is None:
            p = self._open[lane] = _Open()
        waiter.position = len(p.records)
        p.waiters.append(waiter)
        p.records.extend(records)
        p.nbytes += nbytes
        if lo < p.lo:
            p.lo = lo
        if hi > p.hi:
            p.hi = hi
        return opened, p.nbytes >= self.seal_bytes

    def lanes(self) -> list[Lane]:
        """Lanes with an open buffer."""
        return list(self._open)

    def seal(self, lane: Lane) -> Sealed[W] | None:
        """Seal the lane's open buffer into its topic's next Message (None if nothing is open)."""
        p = self._open.pop(lane, None)
        if p is None:
            return None
        topic, partition = lane
        seq = self._sequences[topic]
        self._sequences[topic] = seq + 1
        created = self._clock_ms()
        headroom = request_header_size(topic, self._transactional_id, partition)
        try:
            frame = encode_message(p.records,   # type: ignore[arg-type]  # 5-tuples in LogMessage's field order
                                   producer_id=self._producer_id, epoch=self._epoch, sequence=seq,
                                   codec=self._codec, created_ms=created, compressors=self._compressors,
                                   timestamps=(p.lo, p.hi), shaped=True, adaptive=True, headroom=headroom)
        except MemqError as e:
            return Sealed(topic, partition, seq, bytearray(), headroom, len(p.records), p.nbytes, created, p.waiters, e)
        return Sealed(topic, partition, seq, frame, headroom, len(p.records), p.nbytes, created, p.waiters)
