"""The read path's notification tails (memq.broker.reads.PartitionTail) over a fake consumer."""

from __future__ import annotations

import asyncio
from typing import Any

from memq.broker.reads import TAIL_FETCH_WAIT_MS, PartitionTail
from memq.notify.consumer import NotificationRecord
from tests.support.kafka_read import ListedNotes, note



def notes(n: int) -> list[NotificationRecord]:
    return [note(i, 1) for i in range(n)]


async def run(fn: Any, *args: Any) -> Any:
    return fn(*args)


async def test_readers_at_the_tail_share_one_kafka_read() -> None:
    consumer = ListedNotes(notes(5))
    tail = PartitionTail(consumer, 0, run)  # type: ignore[arg-type]
    assert [r.offset for r in await tail.read(0, 0.0)] == [0, 1, 2, 3, 4]
    for offset in (0, 2, 4):   # other readers, other groups: from memory
        assert [r.offset for r in await tail.read(offset, 0.0)] == list(range(offset, 5))
    assert consumer.polls == 1 and tail.watermarks() == (0, 5)


async def test_a_bad_notification_is_skipped_for_every_reader() -> None:
    consumer = ListedNotes(notes(5), bad=frozenset({2}))
    tail = PartitionTail(consumer, 0, run)  # type: ignore[arg-type]
    assert [r.offset for r in await tail.read(0, 0.0)] == [0, 1]
    assert await tail.read(2, 0.0) == []                          # the bad one: skipped, logged
    assert [r.offset for r in await tail.read(2, 0.0)] == [3, 4]   # a reader at it goes on after it
    tail2 = PartitionTail(ListedNotes(notes(5), bad=frozenset({2})), 0, run)  # type: ignore[arg-type]
    assert await tail2.read(2, 0.0) == [] and [r.offset for r in await tail2.read(2, 0.0)] == [3, 4]


async def test_a_read_that_may_not_wait_does_not_wait_behind_a_long_poll() -> None:
    consumer = ListedNotes(notes(0))
    gate = asyncio.Event()

    async def slow(fn: Any, *args: Any) -> Any:
        if fn == consumer.poll:
            await gate.wait()   # a long poll on Kafka, still waiting
        return fn(*args)

    tail = PartitionTail(consumer, 0, slow)  # type: ignore[arg-type]
    waiting = asyncio.ensure_future(tail.read(0, 5.0))
    await asyncio.sleep(0)
    assert await asyncio.wait_for(tail.read(0, 0.0), 1) == []
    gate.set()
    assert await waiting == []


async def test_what_this_broker_publishes_wakes_a_reader_waiting_at_the_tail() -> None:
    """A reader long-polling at the tail gets a notification the broker itself just published at
    once, while the tail's Kafka poll still waits; the poll bringing it again adds no second copy."""
    consumer = ListedNotes(notes(2))
    gate = asyncio.Event()

    async def slow(fn: Any, *args: Any) -> Any:
        if fn == consumer.poll and consumer.position >= 2:
            await gate.wait()   # Kafka has not returned the new notification yet
        return fn(*args)

    tail = PartitionTail(consumer, 0, slow)  # type: ignore[arg-type]
    assert [r.offset for r in await tail.read(0, 0.0)] == [0, 1]
    waiting = asyncio.ensure_future(tail.read(2, 30.0))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    tail.offer(note(5, 1))                          # not the next offset: left to the Kafka poll
    await asyncio.sleep(0.01)
    assert not waiting.done()
    consumer.records.append(note(2, 1))
    tail.offer(note(2, 1))
    assert [r.offset for r in await asyncio.wait_for(waiting, 1)] == [2]
    consumer.records.append(note(3, 1))
    gate.set()
    assert [r.offset for r in await asyncio.wait_for(tail.read(3, 1.0), 1)] == [3]
    assert [r.offset for r in await tail.read(0, 0.0)] == [0, 1, 2, 3]
    assert tail.watermarks() == (0, 4)


async def test_a_kafka_poll_ending_early_with_nothing_does_not_end_a_long_poll() -> None:
    """librdkafka's end-of-partition event ends a tail's Kafka poll at once with nothing: a
    reader at the tail still gets what this broker publishes within its wait (else that waits
    for the client's next Fetch), and the tail polls Kafka at most once a fetch wait meanwhile."""
    consumer = ListedNotes(notes(2))
    tail = PartitionTail(consumer, 0, run)  # type: ignore[arg-type]
    assert [r.offset for r in await tail.read(0, 0.0)] == [0, 1]
    waiting = asyncio.ensure_future(tail.read(2, 30.0))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    tail.offer(note(2, 1))
    assert [r.offset for r in await asyncio.wait_for(waiting, 1)] == [2]
    assert consumer.polls <= 1 + 0.1 / (TAIL_FETCH_WAIT_MS / 1000) + 2   # never a busy loop
