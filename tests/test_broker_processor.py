"""TopicProcessor on its own: sealing, ring backpressure, failures, close.

Storage is the real file handler in a temp dir (wrapped so a test can hold or fail PUTs);
the publisher records notifications in memory. The Kafka/S3 path is in test_broker_*.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest
from tests.support.processor import Harness, message

from tests.support.appending import append
from memq.broker.dedup import RecentMessages
from memq.format import decode_batch
from memq.format.wire import Ack, AckCode, AckLevel
from tests.support.waiting import async_wait_for


async def test_seals_on_bytes_and_acks_all_with_location(tmp_path: Path) -> None:
    h = Harness(tmp_path, batch_bytes=4 * 400, max_message_bytes=1000)
    for seq in range(8):
        assert await h.append(seq) is None
    await h.wait_acks(8)
    assert all(a.ok for a in h.acks) and sorted(a.id for a in h.acks) == list(range(8))
    assert len(h.storage.puts) == 2 and len(h.publisher.sent) == 2
    for loc in h.storage.puts:
        header, msgs = decode_batch(await h.storage.get(loc))
        acked = sorted((a.index, a.id) for a in h.acks if a.key == loc.key)
        assert [i for i, _ in acked] == list(range(header.message_count))
        assert [mh.sequence for mh, _ in msgs] == [seq for _, seq in acked]
    assert {topic for topic, _ in h.publisher.sent} == {"memq.test.t1"}
    note = min((n for _, n in h.publisher.sent), key=lambda n: n.min_timestamp_ms)   # uploads race
    assert (note.message_count, note.logmessage_count, note.broker_id) == (4, 12, "b1")
    assert note.key in {loc.key for loc in h.storage.puts} and note.min_timestamp_ms == 1000


async def test_acks_all_say_where_each_messages_first_record_is_in_its_part(tmp_path: Path) -> None:
    """So a Kafka door answers a Produce with its first record's Kafka offset, counted from the
    Message headers (no record decoded); a stored duplicate's ack says the original's place."""
    h = Harness(tmp_path, batch_messages=9)
    for seq, n in enumerate((2, 4, 3)):          # 9 LogMessages: sealed with the third
        await h.append(seq, n=n)
    await h.wait_acks(3)
    assert sorted((a.index, a.record) for a in h.acks) == [(0, 0), (1, 2), (2, 6)]
    again = await append(h.proc, message(1, n=4), 101, AckLevel.ALL, h.acks.append)   # answered at once
    assert again is not None and (again.id, again.index, again.record) == (101, 1, 2)


async def test_seals_on_age_and_on_logmessage_count(tmp_path: Path) -> None:
    h = Harness(tmp_path, batch_ms=50)
    t0 = time.monotonic()
    await h.append(1)
    await h.wait_acks(1)
    assert 0.04 <= time.monotonic() - t0 < 2.0
    h2 = Harness(tmp_path / "2", batch_messages=6)
    await h2.append(1)
    await h2.append(2)   # 6 LogMessages: sealed at once, long before batch_ms
    await h2.wait_acks(2, timeout=1.0)
    assert len(h2.storage.puts) == 1


async def test_flagged_message_seals_at_once_without_waiting_batch_ms(tmp_path: Path) -> None:
    h = Harness(tmp_path)                       # batch_ms 10 s, batch_bytes 1 MiB: neither is reached
    await h.append(1)
    t0 = time.monotonic()
    await h.append(2, seal=True)                # the producer's flush: send now
    await h.wait_acks(2, timeout=2.0)
    assert time.monotonic() - t0 < 2.0 and [a.ok for a in h.acks] == [True, True]
    assert len(h.storage.puts) == 1 and {a.key for a in h.acks} == {h.storage.puts[0].key}
    # the slot is free again, no timer left behind (freed once every part's announce returned:
    # a step after the acks went out, which a loaded machine lets this test see)
    await async_wait_for(lambda: h.proc.busy_slots == 0, 2.0, "the batch's slot freed")
    await h.append(3)                           # the next Message opens a fresh batch ...
    await h.append(4, seal=True)                # ... which only the next flush seals, 3 with 4
    await h.wait_acks(4, timeout=2.0)
    assert len(h.storage.puts) == 2 and h.acks[2].key == h.acks[3].key == h.storage.puts[1].key
    assert h.metrics.registry.get_sample_value("memq_broker_flush_seals_total", {"topic": "t1"}) == 2


async def test_ack_one_is_immediate_and_ack_zero_silent(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    ack = await h.append(1, AckLevel.LEADER)
    assert ack is not None and ack.ok and ack.id == 1
    assert await h.append(2, AckLevel.NONE) is None
    await h.proc.close()
    assert h.acks == [] and len(h.storage.puts) == 1


async def test_ring_full_waits_then_busy_and_never_exceeds_slots(tmp_path: Path) -> None:
    h = Harness(tmp_path, ring_slots=2, batch_bytes=400, max_message_bytes=400)
    h.storage.gate.clear()                      # storage stalls
    await h.append(1)                           # batch 1 sealed (>= 400 bytes), uploading
    await h.append(2)                           # batch 2 sealed, uploading: ring full
    t0 = time.monotonic()
    busy = await h.append(3)
    assert busy is not None and busy.code == AckCode.BUSY and "batch slots busy" in busy.error
    assert time.monotonic() - t0 >= 0.19
    assert h.proc.busy_slots == 2
    waiter = asyncio.create_task(h.append(4))   # waits for a slot ...
    await async_wait_for(lambda: h.proc.waiting_for_slot == 1, 2.0, "the append waiting for a slot")
    assert not waiter.done()
    h.storage.gate.set()                        # ... and gets one when storage recovers
    assert await waiter is None
    await h.proc.close()
    assert sorted(a.id for a in h.acks if a.ok) == [1, 2, 4]
    assert h.storage.max_active <= 2


async def test_storage_failure_fails_every_message_of_batch(tmp_path: Path) -> None:
    h = Harness(tmp_path, batch_bytes=800, max_message_bytes=800)
    h.storage.fail = True
    await h.append(1)
    await h.append(2)
    await h.wait_acks(2)
    assert {(a.id, a.ok, a.code) for a in h.acks} == {(1, False, "STORAGE"), (2, False, "STORAGE")}
    assert "bucket unavailable" in h.acks[0].error
    h.storage.fail = False                      # the processor goes on with the next batch
    await h.append(3)
    await h.append(4)
    await h.wait_acks(4)
    assert [a.ok for a in h.acks[2:]] == [True, True]


async def test_notify_failure_fails_batch_and_keeps_the_object(tmp_path: Path) -> None:
    h = Harness(tmp_path, batch_bytes=400, max_message_bytes=400)
    h.publisher.fail = True
    await h.append(1)
    await h.wait_acks(1)
    assert (h.acks[0].ok, h.acks[0].code) == (False, "NOTIFY") and "kafka down" in h.acks[0].error
    # a failed publish may still be delivered: the object stays, counted as unannounced
    assert h.storage.deleted == [] and len(h.storage.puts) == 1
    assert await h.storage.get(h.storage.puts[0])
    assert h.metrics.registry.get_sample_value("memq_broker_unannounced_batches_total", {"topic": "t1"}) == 1


async def test_close_flushes_then_answers_closing(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    await h.append(1)
    await h.proc.close()
    assert [a.ok for a in h.acks] == [True]
    late = await h.append(2)
    assert late is not None and late.code == AckCode.CLOSING


@pytest.mark.parametrize("slots", [2, 4])
async def test_many_concurrent_appenders_each_message_once(tmp_path: Path, slots: int) -> None:
    # waiting for a slot is the point here, not BUSY: a loaded machine may take >0.2 s per upload
    h = Harness(tmp_path, busy_wait_s=10.0, ring_slots=slots, batch_bytes=2000, max_message_bytes=2000, batch_ms=20)

    async def appender(base: int) -> None:
        for i in range(50):
            ack = await h.append(base + i)
            assert ack is None

    await asyncio.gather(*(appender(k * 1000) for k in range(4)))
    await h.proc.close()
    assert sorted(a.id for a in h.acks) == sorted(k * 1000 + i for k in range(4) for i in range(50))
    assert all(a.ok for a in h.acks)
    seqs = []
    for loc in h.storage.puts:
        seqs += [mh.sequence for mh, _ in decode_batch(await h.storage.get(loc))[1]]
    assert sorted(seqs) == sorted(a.id for a in h.acks)
    assert len(h.publisher.sent) == len(h.storage.puts)


async def resend(h: Harness, seq: int, request_id: int, ack: AckLevel = AckLevel.ALL) -> Ack | None:
    """The producer's retry: the very same Message bytes under a new request id."""
    data = message(seq)
    return await append(h.proc, data, request_id, ack, h.acks.append)


def duplicates(h: Harness) -> float | None:
    return h.metrics.registry.get_sample_value("memq_broker_duplicate_messages_total", {"topic": "t1"})


async def test_a_resent_message_still_held_is_not_stored_twice_and_gets_the_originals_ack(tmp_path: Path) -> None:
    h = Harness(tmp_path, batch_ms=20)
    h.storage.gate.clear()                       # storage is slow: the batch sits uploading
    await h.append(1)
    await h.append(2)
    await async_wait_for(lambda: h.storage.active == 1, 2.0, "the batch sealed by batch_ms, uploading")
    assert await resend(h, 1, 101) is None       # held in the uploading batch: wait for its outcome
    assert await resend(h, 1, 102, AckLevel.LEADER) == Ack(102, True)
    assert h.acks == []
    h.storage.gate.set()
    await h.wait_acks(3)
    by_id = {a.id: a for a in h.acks}
    assert by_id[101] == dataclasses.replace(by_id[1], id=101) and by_id[101].ok
    assert len(h.storage.puts) == 1
    _, msgs = decode_batch(await h.storage.get(h.storage.puts[0]))
    assert [mh.sequence for mh, _ in msgs] == [1, 2]
    # once stored, a resend is answered at once with the original's location
    again = await resend(h, 2, 103)
    assert again == dataclasses.replace(by_id[2], id=103)
    await h.proc.close()                          # seals and stores whatever it still holds: nothing
    assert len(h.storage.puts) == 1 and duplicates(h) == 3


async def test_a_resend_after_a_failed_batch_is_stored_and_its_waiting_duplicates_fail_alike(tmp_path: Path) -> None:
    h = Harness(tmp_path, batch_ms=20)
    h.storage.gate.clear()
    h.storage.fail = True
    await h.append(1)
    await async_wait_for(lambda: h.storage.active == 1, 2.0, "the batch sealed by batch_ms, uploading")
    await resend(h, 1, 101)
    h.storage.gate.set()
    await h.wait_acks(2)
    assert [(a.id, a.ok, a.code) for a in sorted(h.acks, key=lambda a: a.id)] == [
        (1, False, AckCode.STORAGE), (101, False, AckCode.STORAGE)]
    h.storage.fail = False
    await resend(h, 1, 102)                       # the producer's retry after the failure
    await h.wait_acks(3)
    assert h.acks[-1].id == 102 and h.acks[-1].ok and len(h.storage.puts) == 1


def test_recent_messages_forget_the_oldest_stored_beyond_capacity() -> None:
    recent = RecentMessages(capacity=2, window_s=300)
    for seq in range(3):
        recent.hold((7, 0, seq))
    recent.stored(((7, 0, seq) for seq in range(3)), "b", "k", 1, 40, now=0.0)
    assert recent.seen((7, 0, 0)) is None and len(recent) == 2
    assert recent.seen((7, 0, 2)) == Ack(0, True, bucket="b", key="k", index=2, partition=1, offset=40)
    recent.stored([(7, 0, 3)], "b", "k2", 1, 41, now=1.0)      # over capacity again: the oldest goes
    assert recent.seen((7, 0, 1)) is None and recent.seen((7, 0, 3)) is not None and len(recent) == 2


def test_recent_messages_forget_what_was_stored_longer_ago_than_the_window() -> None:
    # a quiet topic must not keep its ids for hours: producers resend within their delivery timeout
    recent = RecentMessages(capacity=1000, window_s=60)
    recent.stored([(7, 0, 0), (7, 0, 1)], "b", "k0", 0, 0, now=0.0)
    recent.stored([(7, 0, 2)], "b", "k1", 0, 1, now=30.0)
    assert len(recent) == 3
    recent.stored([(7, 0, 3)], "b", "k2", 0, 2, now=61.0)      # the first batch is 61 s old
    assert [recent.seen((7, 0, s)) is not None for s in range(4)] == [False, False, True, True]
    recent.stored([(7, 0, 4)], "b", "k3", 0, 3, now=200.0)
    assert len(recent) == 1 and recent.seen((7, 0, 4)) is not None


async def test_a_part_never_holds_more_records_than_kafka_offsets_can_index(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sealed before a Message would overflow the part's record bits; a Message that alone would is refused."""
    monkeypatch.setattr("memq.broker.processor.MAX_PART_LOGMESSAGES", 5)
    h = Harness(tmp_path)                      # batch_ms 10 s, 1 MiB: only the record bound seals
    await h.append(1, n=3)
    await h.append(2, n=2)                     # 5: still fits
    await h.append(3, n=1, seal=True)          # 6 would not: the first part goes, this one starts the next
    await h.wait_acks(3)
    counts = sorted(n.logmessage_count for _, n in h.publisher.sent)
    assert counts == [1, 5] and all(a.ok for a in h.acks)
    refused = await h.append(4, n=6)
    assert refused is not None and refused.code is AckCode.TOO_LARGE and "at most 5" in refused.error
