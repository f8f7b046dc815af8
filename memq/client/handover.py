"""Handing one batch at a time to the application: what `Consumer.poll()` returns.

A batch is handed over Message by Message; a Message seen before (a producer's retry) is
dropped by its (producer id, epoch, sequence). A Message's records are built a chunk at a time
(`MessageRecords`); all but the last stream from the current chunk's shared list iterator, so
a poll iterator abandoned half way is resumed by the next poll; the last is yielded only after
its Message was accounted for (audited, and the batch finished when it was its last), so a
commit never covers a record not yet handed over.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from itertools import islice
from operator import length_hint
from typing import Protocol

from memq.client.consumer_record import ConsumerRecord, DecodedBatch
from memq.client.metrics import ConsumerMetrics
from memq.client.positions import SequenceTracker
from memq.client.prefetch import Fetch
from memq.clock import Clock
from memq.format import MessageHeader


class ConsumedSink(Protocol):
    """The consumer half of docs/ARCHITECTURE.md's AuditSink."""

    def consumed(self, *, topic: str, group: str, producer_id: int, epoch: int, sequence: int,
                 count: int, digest: int, created_ms: int, consumed_ms: int) -> None: ...


class Handover:
    """The batch being handed over. `on_finished(fetch)` is called once a batch was handed
    over to its last record (not for one dropped, nor for one `start` did not take)."""

    def __init__(self, topic: str, group_id: str, *, dedup: SequenceTracker | None, audit: ConsumedSink | None,
                 metrics: ConsumerMetrics, clock: Clock, on_finished: Callable[[Fetch], None]) -> None:
        self._topic, self._group_id = topic, group_id
        self._dedup, self._audit, self._metrics, self._clock = dedup, audit, metrics, clock
        self._on_finished = on_finished
        self._fetch: Fetch | None = None
        self._messages: DecodedBatch = []
        self._next_msg = 0
        self._cur: Iterator[ConsumerRecord] = iter(())
        self._chunks: Iterator[list[ConsumerRecord]] = iter(())   # the current Message's chunks after _cur's
        self._cur_header: MessageHeader | None = None

    @property
    def current(self) -> Fetch | None:
        return self._fetch

    def start(self, fetch: Fetch, messages: DecodedBatch) -> bool:
        """Take `fetch`'s records as the current batch; False (and nothing taken) if all of
        its Messages are duplicates."""
        assert self._fetch is None, "start() while a batch is being handed over"
        self._messages, self._next_msg = messages, 0
        if not self._next_message():
            return False
        self._fetch = fetch
        return True

    def clear_dedup(self) -> None:
        """Forget the Messages seen (the reader was moved: what it reads again is wanted again)."""
        if self._dedup is not None:
            self._dedup.clear()

    def deliver(self) -> Iterator[ConsumerRecord]:
        """The current batch's records from where the previous iterator stopped. The iterator
        is bound to this batch: it ends once the batch is finished or dropped."""
        if self._fetch is None:
            return iter(())
        return self._deliver(self._fetch)

    def _deliver(self, fetch: Fetch) -> Iterator[ConsumerRecord]:
        while self._fetch is fetch:
            left = length_hint(self._cur)
            if left > 1:
                yield from islice(self._cur, left - 1)
                continue
            chunk = next(self._chunks, None)
            if chunk is not None:              # not the Message's last record: on to its next chunk
                one = next(self._cur, None)
                self._cur = iter(chunk)
                if one is not None:
                    yield one
                continue
            last = next(self._cur, None)
            self._message_done(fetch)
            if last is not None:
                yield last

    def drop(self, partitions: set[int]) -> Fetch | None:
        """Abandon the current batch if it is of `partitions` (seek, revocation); it is returned.
        A live poll iterator over it stops."""
        fetch = self._fetch
        if fetch is None or fetch.rec.partition not in partitions:
            return None
        deque(self._cur, maxlen=0)                # exhaust it: a live poll iterator stops too
        self._chunks = iter(())
        self._messages, self._next_msg, self._cur_header = [], 0, None
        self._fetch = None
        return fetch

    def _next_message(self) -> bool:
        """Move to the next not-duplicate Message; False when the batch is exhausted."""
        while self._next_msg < len(self._messages):
            header, records = self._messages[self._next_msg]
            self._next_msg += 1
            if self._dedup is not None and self._dedup.seen(header.producer_id, header.epoch, header.sequence):
                self._metrics.duplicate_messages += 1
                self._metrics.duplicates_dropped += len(records)
                continue
            self._chunks = records.chunks()
            self._cur_header, self._cur = header, iter(next(self._chunks, []))
            self._metrics.records += len(records)
            return True
        self._cur_header, self._cur, self._chunks = None, iter(()), iter(())
        self._messages, self._next_msg = [], 0      # the batch's memory is the application's now
        return False

    def _message_done(self, fetch: Fetch) -> None:
        header = self._cur_header
        if header is not None and self._audit is not None:
            self._audit.consumed(topic=self._topic, group=self._group_id, producer_id=header.producer_id,
                                 epoch=header.epoch, sequence=header.sequence, count=header.count,
                                 digest=header.body_crc32c, created_ms=header.created_ms,
                                 consumed_ms=int(self._clock.time() * 1000))
        if not self._next_message():
            self._fetch = None
            self._on_finished(fetch)
