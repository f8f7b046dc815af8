"""memq.broker.share's sessions and deliveries, pure: what a share fetch takes from a part in
memory, what an acknowledgement applies, the dead-letter record, the session epochs; and the
share service's fetches, acknowledgements and dead letters over fakes of the broker (no I/O)."""

from __future__ import annotations

import uuid

from memq.broker.share.delivery import (Budget, ack_runs, acknowledge, by_note, dead_letter, record_at, take_again,
                                        take_new, whole_batches)
from memq.broker.share.partition import AckOutcome, Archived, SharePartition
from memq.broker.share.service import Shares
from memq.broker.share.session import ShareSessions
from memq.broker.share.store import MemoryStateStore
from memq.config import ShareConfig
from memq.format import LogMessage
from memq.format.kafka_records import decode_kafka_records, encode_kafka_batch, split_kafka_batches
from memq.kafka_api.metadata_flex import topic_id
from memq.kafka_api.offsets import first_offset, split_offset
from memq.kafka_api.records import FramedBatch, FramedPart
from memq.kafka_api.share import AckBatch, AckType, SharePartitionData, ShareError
from memq.log.model import SPARSE
from tests.support.clock import FakeClock
from tests.support.share_fakes import FakeAdmission, FakeShareBroker

TID = uuid.uuid4()


def framed(values: list[list[bytes]]) -> FramedPart:
    """A part whose batches hold `values` in turn (keys k<index>)."""
    batches, at = [], 0
    for vs in values:
        recs = [LogMessage(v, b"k%d" % (at + i)) for i, v in enumerate(vs)]
        batches.append(FramedBatch(at, len(vs), encode_kafka_batch(recs)))
        at += len(vs)
    return FramedPart(tuple(batches), at)


def partition(clock: FakeClock, start: int = 0) -> SharePartition:
    sp = SharePartition(clock, lock_s=30, delivery_limit=2)
    sp.begin(start)
    return sp


def values_of(out: SharePartitionData) -> list[bytes]:
    return [r.value for b in split_kafka_batches(bytes(out.records)) for r in decode_kafka_records(b)]


def test_ack_runs_expand_per_record_types_and_drop_gaps() -> None:
    batches = [AckBatch(0, 4, (AckType.ACCEPT,)),
               AckBatch(10, 13, (AckType.RELEASE, AckType.GAP, AckType.REJECT, AckType.ACCEPT))]
    assert ack_runs(batches) == [(0, 4, AckOutcome.ACCEPT), (10, 10, AckOutcome.RELEASE),
                                 (12, 12, AckOutcome.REJECT), (13, 13, AckOutcome.ACCEPT)]


def test_an_acknowledgement_applies_what_it_may_and_says_when_a_record_was_not_the_members() -> None:
    sp = partition(FakeClock())
    sp.acquire("a", [0, 1, 2])
    ok, archived = acknowledge(sp, "a", [AckBatch(0, 0, (AckType.ACCEPT,)), AckBatch(1, 1, (AckType.REJECT,))])
    assert ok and [(x.offset, x.reason) for x in archived] == [(1, "rejected")]
    ok, archived = acknowledge(sp, "b", [AckBatch(2, 2, (AckType.ACCEPT,))])
    assert not ok and archived == []


def test_whole_batches_from_a_record_on_stop_at_the_first_limit_reached() -> None:
    part = framed([[b"a", b"b"], [b"c", b"d", b"e"], [b"f"]])
    assert [b.first_index for b in whole_batches(part, 0, 2, 1 << 20)] == [0]
    assert [b.first_index for b in whole_batches(part, 1, 2, 1 << 20)] == [0, 2]   # 1 record of the first
    assert [b.first_index for b in whole_batches(part, 2, 100, 1 << 20)] == [2, 5]
    assert [b.first_index for b in whole_batches(part, 0, 100, 1)] == [0]          # one batch goes whatever its size


def test_new_records_are_taken_from_the_window_end_and_the_next_part_follows() -> None:
    sp, out = partition(FakeClock(), first_offset(7)), SharePartitionData(0)
    budget = Budget(10, 1 << 20)
    assert take_new(sp, "m", out, budget, SPARSE, 7, 3, framed([[b"a", b"b"], [b"c"]]))   # the whole part: read on
    assert out.acquired == [(first_offset(7), first_offset(7) + 2, 1)]
    assert values_of(out) == [b"a", b"b", b"c"] and budget.records == 7
    assert sp.end == first_offset(8)
    assert take_new(sp, "m", out, budget, SPARSE, 9, 1, framed([[b"d"]]))   # a gap in the notifications: skipped
    assert split_offset(out.acquired[-1][0]) == (9, 0) and sp.end == first_offset(10)


def test_a_record_budget_stops_inside_a_part_and_the_next_take_resumes_there() -> None:
    sp, out = partition(FakeClock()), SharePartitionData(0)
    part = framed([[b"a", b"b"], [b"c", b"d"]])
    budget = Budget(2, 1 << 20)
    assert not take_new(sp, "m", out, budget, SPARSE, 0, 4, part)   # stopped inside the part
    assert out.acquired == [(0, 1, 1)] and sp.end == 2 and budget.records == 0
    more = SharePartitionData(0)
    assert take_new(sp, "n", more, Budget(10, 1 << 20), SPARSE, 0, 4, part)
    assert more.acquired == [(2, 3, 1)] and values_of(more) == [b"c", b"d"]


def test_redelivered_records_are_taken_again_with_their_delivery_count() -> None:
    clock = FakeClock()
    sp = partition(clock)
    sp.acquire("a", [0, 1, 2])
    clock.advance(31)   # the lock expired
    sp.expire()
    again = sp.redeliverable(10)
    assert by_note(again + [first_offset(1)], SPARSE) == {0: [0, 1, 2], 1: [first_offset(1)]}
    out, budget = SharePartitionData(0), Budget(10, 1 << 20)
    take_again(sp, "b", out, budget, SPARSE, 0, again, framed([[b"a", b"b", b"c"]]))
    assert out.acquired == [(0, 2, 2)] and budget.records == 7 and values_of(out) == [b"a", b"b", b"c"]


def test_a_dead_letter_keeps_the_record_and_says_why_and_where_from() -> None:
    part = framed([[b"a"], [b"b", b"c"]])
    rec = record_at(part, 2)
    assert rec is not None and (rec.value, rec.key) == (b"c", b"k2") and record_at(part, 3) is None
    letter = dead_letter(Archived(first_offset(4) | 2, "rejected", 1), rec, "g", "t", 3)
    assert (letter.value, letter.key) == (b"c", b"k2")
    assert dict(letter.headers) == {"reason": b"rejected", "topic": b"t", "partition": b"3",
                                    "offset": b"%d" % (first_offset(4) | 2), "group": b"g", "delivery_count": b"1"}
    unread = dead_letter(Archived(5, "delivery_limit", 2), None, "g", "t", 0)
    assert (unread.value, unread.key, dict(unread.headers)["reason"]) == (b"", None, b"delivery_limit")


def test_share_session_epochs_open_count_up_close_and_expire() -> None:
    sessions = ShareSessions(timeout_s=10)
    s, err, replaced = sessions.step("g", "m", 0, [(TID, 0)], now=0)
    assert s is not None and err is ShareError.NONE and replaced is None
    assert sessions.step("g", "m", 2, [], now=1)[1] is ShareError.INVALID_SHARE_SESSION_EPOCH
    s, _, _ = sessions.step("g", "m", 1, [(TID, 1)], now=1)
    assert s is not None and s.keys == {(TID, 0), (TID, 1)}
    assert sessions.step("g", "other", 1, [], now=1)[:2] == (None, ShareError.SHARE_SESSION_NOT_FOUND)
    again, _, old = sessions.step("g", "m", 0, [(TID, 2)], now=2)   # a new session replaces the old one
    assert old is s and again is not None and again.keys == {(TID, 2)}
    closed, err, _ = sessions.step("g", "m", -1, [], now=3)
    assert closed is again and err is ShareError.NONE and ("g", "m") not in sessions.open
    sessions.step("g", "x", 0, [], now=4)
    assert sessions.expired(now=14) == [] and [k for k, _ in sessions.expired(now=14.5)] == [("g", "x")]


def service(clock: FakeClock, dead_letter_suffix: str = "-dlq") -> tuple[Shares, FakeShareBroker]:
    """A broker's share service over topic t (one partition) and dead-letter topic g-dlq, in memory."""
    broker = FakeShareBroker({"t": 1, "g-dlq": 1}, FakeAdmission("g-dlq"))
    broker.reads.add("n.t", 0, 0, framed([[b"a", b"b"], [b"c"]]))
    broker.reads.add("n.t", 0, 1, framed([[b"d"]]))
    config = ShareConfig(auto_offset_reset="earliest", flush_ms=0, delivery_count_limit=2,
                         dead_letter_suffix=dead_letter_suffix)
    return Shares(config, MemoryStateStore(), clock, "b1", broker), broker


KEY = (topic_id("c", "t"), 0)


async def fetched(shares: Shares, member: str, max_records: int = 10) -> SharePartitionData:
    out = SharePartitionData(0)
    await shares.fetch("g", member, {KEY: "t"}, {KEY: out}, max_records, 1 << 20, 0)
    return out


async def test_the_service_redelivers_released_records_first_and_archives_to_the_dead_letter_topic() -> None:
    shares, broker = service(FakeClock())
    first = await fetched(shares, "m")
    assert values_of(first) == [b"a", b"b", b"c", b"d"]
    assert first.acquired == [(0, 2, 1), (first_offset(1), first_offset(1), 1)]
    release, reject = (AckBatch(1, 1, (AckType.RELEASE,)), AckBatch(2, 2, (AckType.REJECT,)))
    assert await shares.acknowledge("g", "m", "t", 0, [release, reject]) is ShareError.NONE
    again = await fetched(shares, "n")
    assert again.acquired == [(1, 1, 2)]   # the released record, before anything new (none is left)
    assert await shares.acknowledge("g", "n", "t", 0, [release]) is ShareError.NONE   # its delivery limit
    assert await shares.acknowledge("g", "n", "t", 0, [AckBatch(0, 0, (AckType.ACCEPT,))]) \
        is ShareError.INVALID_RECORD_STATE   # m's record, not n's
    await shares.close()   # the dead letters under way are appended
    letters = broker.admission.topics["g-dlq"].records
    assert [(r.value, dict(r.headers)["reason"]) for r in letters] == [(b"c", b"rejected"), (b"b", b"delivery_limit")]
    assert shares.dead_letters == {"g": 2}


async def test_a_new_session_of_a_member_releases_what_its_old_one_held() -> None:
    shares, _ = service(FakeClock(), dead_letter_suffix="")
    session, error = shares.open_session("g", "m", 0, [KEY])
    assert session is not None and error is ShareError.NONE
    assert (await fetched(shares, "m", max_records=1)).acquired == [(0, 1, 1)]   # a and b: the batch goes whole
    assert shares.open_session("g", "m", 5, [])[1] is ShareError.INVALID_SHARE_SESSION_EPOCH
    shares.open_session("g", "m", 0, [KEY])   # the member restarted
    assert (await fetched(shares, "n")).acquired == [(0, 1, 2)]   # released: redelivered first
