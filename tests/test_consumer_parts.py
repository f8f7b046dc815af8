"""The Consumer's parts one at a time, over typed fakes (tests/support/consumer_fakes.py): no
server, no process, no sleep. The Consumer as a whole over the same fakes: test_reader_unit.py
and test_consumer_retention.py."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Literal

import pytest
from tests.support.clock import FakeClock
from tests.support.consumer_fakes import (CommitRecorder, FakeNotifications, MemorySource, SinkRecorder, batch,
                                    recs, values)

from memq.client.commits import Committer
from memq.client.consumer import Consumer
from memq.client.consumer_record import RECORD_CHUNK, ConsumerRecord, DecodedBatch, batch_pointer, build_records
from memq.client.handover import Handover
from memq.client.metrics import ConsumerMetrics
from memq.client.position_policy import PositionPolicy, RangeCheck, Reset
from memq.client.positions import Offsets, SequenceTracker
from memq.client.prefetch import RECORD_OVERHEAD, Fetch, Prefetch, PrefetchBudget
from memq.client.random_access import RandomAccess
from memq.client.reader import BatchReader, DataLossPolicy
from memq.config import MemqConfig
from memq.errors import (ConsumerError, DataLossError, InvalidInputError, ObjectNotFoundError,
                         OffsetOutOfRangeError, StorageError)
from memq.format import decode_batch
from memq.format.batch import decode_batch_rows
from memq.notify import NotificationRecord
from memq.storage import ObjectLocation

log = logging.getLogger("test.consumer.parts")


def decoded(rec: NotificationRecord, objects: dict[str, bytes]) -> DecodedBatch:
    """The ConsumerRecords of the batch `rec` names, as the reader's worker builds them."""
    return build_records("t", rec, decode_batch_rows(objects[rec.notification.key]))


def done(value: DecodedBatch | None = None, error: Exception | None = None) -> concurrent.futures.Future[DecodedBatch]:
    fut: concurrent.futures.Future[DecodedBatch] = concurrent.futures.Future()
    if error is not None:
        fut.set_exception(error)
    elif value is not None:
        fut.set_result(value)
    return fut


# --- consumer_record ---------------------------------------------------------------------------


def test_records_carry_their_position_and_a_running_index_across_messages() -> None:
    objects: dict[str, bytes] = {}
    rec = batch("k", [(7, 3, recs("a", "b")), (8, 0, recs("c"))], 4, objects, partition=2)
    out = decoded(rec, objects)
    assert [(h.producer_id, h.sequence) for h, _ in out] == [(7, 3), (8, 0)]
    flat = [r for _, rs in out for r in rs]
    assert [(bytes(r.value), r.index, r.producer_id, r.sequence) for r in flat] == [
        (b"a", 0, 7, 3), (b"b", 1, 7, 3), (b"c", 2, 8, 0)]
    assert {(r.topic, r.partition, r.offset, r.location) for r in flat} == {("t", 2, 4, ObjectLocation("b", "k"))}
    ptr = batch_pointer("t", rec)
    assert (ptr.size, ptr.crc32c, ptr.partition, ptr.offset) == (len(objects["k"]), rec.notification.crc32c, 2, 4)


# --- prefetch: budget and queue ----------------------------------------------------------------


def test_budget_always_admits_one_batch_then_only_what_fits() -> None:
    b = PrefetchBudget(limit=100)
    assert b.reserve(500) == 500                       # larger than the limit, but nothing reserved
    assert b.full and b.reserve(1) is None
    b.release(500)
    assert b.reserve(60) == 60 and b.reserve(60) == 60   # under the limit when asked: admitted
    assert b.full and b.reserved == 120 and b.reserve(1) is None


def test_budget_learns_the_decoded_size_first_from_one_batch_then_as_a_moving_average() -> None:
    objects: dict[str, bytes] = {}
    rec = batch("k", [(1, 0, recs("x" * 100, "y" * 100))], 0, objects)
    headers = [h for h, _ in decoded(rec, objects)]
    ratio = (headers[0].raw_length + 2 * RECORD_OVERHEAD) / 1000
    b = PrefetchBudget(limit=10**9)
    b.measure(1000, headers)
    assert b.expansion == pytest.approx(ratio)
    assert b.reserve(1000) == int(1000 * ratio)
    b.measure(2000, headers)                            # half the ratio: moves a fifth of the way
    assert b.expansion == pytest.approx(0.8 * ratio + 0.2 * ratio / 2)


def test_queue_starts_fetches_in_order_within_the_budget_and_asks_for_notes_only_when_all_started() -> None:
    objects: dict[str, bytes] = {}
    rs = [batch(f"k{i}", [(1, i, recs(str(i)))], i, objects) for i in range(3)]
    started: list[int] = []

    def submit(r: NotificationRecord) -> concurrent.futures.Future[DecodedBatch]:
        started.append(r.offset)
        return done(decoded(r, objects))

    size = rs[0].notification.size
    q = Prefetch(PrefetchBudget(limit=size + 1), submit)
    assert q.wants_notifications()
    q.add(rs)
    assert started == [0, 1] and not q.wants_notifications()   # the third waits for room
    assert list(q.pending()) == [(0, 0), (0, 1), (0, 2)] and q.partitions() == {0}
    head, got = q.take(0) or pytest.fail("head not ready")
    assert head.rec is rs[0] and [bytes(r.value) for r in got[0][1]] == [b"0"]
    q.done(head)                                        # handed over: its memory is free
    q.start()
    assert started == [0, 1, 2] and len(q) == 2


def test_take_waits_no_longer_than_asked_and_raises_a_loss_until_skipped() -> None:
    objects: dict[str, bytes] = {}
    rs = [batch(f"k{i}", [(1, i, recs(str(i)))], i, objects) for i in range(2)]
    lost = batch_pointer("t", rs[0]).lost("is missing")
    futures = {0: done(error=lost), 1: done()}          # the second never completes
    q = Prefetch(PrefetchBudget(limit=10**9), lambda r: futures[r.offset])
    q.add(rs)
    for _ in range(2):
        with pytest.raises(DataLossError):
            q.take(0)
        assert q.head.rec is rs[0]
    assert q.skip().rec is rs[0]
    assert q.take(0.01) is None and len(q) == 1


def test_take_refetches_after_a_transient_failure() -> None:
    objects: dict[str, bytes] = {}
    rec = batch("k", [(1, 0, recs("a"))], 0, objects)
    outcomes = [done(error=StorageError("slow down")), done(decoded(rec, objects))]
    q = Prefetch(PrefetchBudget(limit=10**9), lambda r: outcomes.pop(0))
    q.add([rec])
    with pytest.raises(StorageError):
        q.take(0)
    assert outcomes == [] and len(q) == 1               # fetched again, still at the head
    assert q.take(0) is not None and len(q) == 0


def test_drop_cancels_the_partitions_fetches_and_frees_their_memory() -> None:
    objects: dict[str, bytes] = {}
    rs = [batch(f"k{i}", [(1, i, recs(str(i)))], i, objects, partition=i % 2) for i in range(4)]
    futures: list[concurrent.futures.Future[DecodedBatch]] = []

    def submit(r: NotificationRecord) -> concurrent.futures.Future[DecodedBatch]:
        futures.append(done())
        return futures[-1]

    q = Prefetch(PrefetchBudget(limit=10**9), submit)
    q.add(rs)
    kept = sum(r.notification.size for r in rs if r.partition == 0)
    q.drop({1})
    assert list(q.pending()) == [(0, 0), (0, 2)] and q.budget.reserved == kept
    assert [f.cancelled() for f in futures] == [False, True, False, True]


# --- handover ----------------------------------------------------------------------------------


class Finished:
    """Records `on_finished` calls, and what the application had received by then."""

    def __init__(self) -> None:
        self.fetches: list[Fetch] = []
        self.seen_at_finish: list[int] = []
        self.seen = 0

    def __call__(self, f: Fetch) -> None:
        self.fetches.append(f)
        self.seen_at_finish.append(self.seen)


def handover(dedup: bool = True) -> tuple[Handover, Finished, SinkRecorder, ConsumerMetrics]:
    finished, sink, metrics = Finished(), SinkRecorder(), ConsumerMetrics()
    h = Handover("t", "g", dedup=SequenceTracker(16, 16) if dedup else None, audit=sink, metrics=metrics,
                 clock=FakeClock(wall_s=5.0, monotonic_s=5.0), on_finished=finished)
    return h, finished, sink, metrics


def test_the_last_record_comes_after_its_message_was_audited_and_its_batch_finished() -> None:
    objects: dict[str, bytes] = {}
    rec = batch("k", [(1, 0, recs("a", "b")), (1, 1, recs("c"))], 0, objects)
    h, finished, sink, metrics = handover()
    fetch = Fetch(rec)
    assert h.start(fetch, decoded(rec, objects)) and h.current is fetch
    audited_before: list[int] = []
    got = []
    for r in h.deliver():
        audited_before.append(len(sink.calls))
        got.append(bytes(r.value))
        finished.seen += 1
    assert got == [b"a", b"b", b"c"]
    assert audited_before == [0, 1, 2]                  # "b" after Message 0's audit, "c" after Message 1's
    assert finished.fetches == [fetch] and finished.seen_at_finish == [2]   # finished before "c" was handed
    assert [(c.topic, c.group, c.sequence, c.count, c.consumed_ms) for c in sink.calls] == [
        ("t", "g", 0, 2, 5000), ("t", "g", 1, 1, 5000)]
    assert h.current is None and metrics.records == 3


def test_an_abandoned_iterator_is_resumed_and_an_old_one_never_hands_a_later_batch() -> None:
    objects: dict[str, bytes] = {}
    first = batch("k0", [(1, 0, recs("a", "b", "c"))], 0, objects)
    second = batch("k1", [(1, 1, recs("d"))], 1, objects)
    h, finished, _, _ = handover()
    h.start(Fetch(first), decoded(first, objects))
    it1 = h.deliver()
    unused = h.deliver()                                # bound to the first batch, never iterated
    assert bytes(next(it1).value) == b"a"
    assert [bytes(r.value) for r in h.deliver()] == [b"b", b"c"]
    assert list(it1) == [] and len(finished.fetches) == 1
    h.start(Fetch(second), decoded(second, objects))
    assert list(unused) == []
    assert [bytes(r.value) for r in h.deliver()] == [b"d"]


def test_records_built_a_chunk_at_a_time_are_handed_once_in_order_across_abandoned_iterators() -> None:
    objects: dict[str, bytes] = {}
    n = 2 * RECORD_CHUNK + 3
    rec = batch("k", [(1, 0, recs(*(str(i) for i in range(n)))), (1, 1, recs("last"))], 0, objects)
    h, finished, sink, _ = handover()
    h.start(Fetch(rec), decoded(rec, objects))
    got: list[ConsumerRecord] = []
    for take in (1, RECORD_CHUNK - 2, 1, 1, RECORD_CHUNK, n):   # polls stopping at, before and after chunk ends
        it = h.deliver()
        got += [r for _, r in zip(range(take), it)]
    assert [bytes(r.value) for r in got] == [str(i).encode() for i in range(n)] + [b"last"]
    assert [r.index for r in got] == list(range(n + 1)) and type(got[0]) is ConsumerRecord
    assert len(sink.calls) == 2 and len(finished.fetches) == 1
    assert [tuple(r[:5]) for r in got] == [tuple(m) for _, ms in decode_batch(objects["k"])[1] for m in ms]


def test_duplicates_are_dropped_and_a_batch_of_only_duplicates_is_not_taken() -> None:
    objects: dict[str, bytes] = {}
    first = batch("k0", [(1, 0, recs("a")), (1, 1, recs("b", "b2"))], 0, objects)
    again = batch("k1", [(1, 1, recs("b", "b2"))], 1, objects)
    h, finished, _, metrics = handover()
    h.start(Fetch(first), decoded(first, objects))
    assert len(list(h.deliver())) == 3
    assert not h.start(Fetch(again), decoded(again, objects)) and h.current is None
    assert (metrics.duplicate_messages, metrics.duplicates_dropped, metrics.records) == (1, 2, 3)
    assert len(finished.fetches) == 1                   # the caller finishes a batch not taken
    h.clear_dedup()                                     # after a seek: wanted again
    assert h.start(Fetch(again), decoded(again, objects))
    off, _, _, off_metrics = handover(dedup=False)
    off.start(Fetch(first), decoded(first, objects))
    list(off.deliver())
    assert off.start(Fetch(again), decoded(again, objects)) and off_metrics.duplicate_messages == 0


def test_dropping_the_current_batch_stops_a_live_iterator_without_finishing_it() -> None:
    objects: dict[str, bytes] = {}
    rec = batch("k", [(1, 0, recs("a", "b", "c"))], 0, objects, partition=3)
    h, finished, _, _ = handover()
    fetch = Fetch(rec)
    h.start(fetch, decoded(rec, objects))
    it = h.deliver()
    next(it)
    assert h.drop({0, 1}) is None and h.current is fetch   # another partition: kept
    assert h.drop({3}) is fetch and h.current is None
    assert list(it) == [] and finished.fetches == []


# --- position policy ---------------------------------------------------------------------------


def policy(reset: Literal["earliest", "latest", "error"] = "earliest", skip: bool = False,
           retention_ms: int | None = 60_000) -> PositionPolicy:
    return PositionPolicy("t", "memq.t", "g", reset, retention_ms,
                          DataLossPolicy(skip=skip, logger=log, hint=""))


def test_a_committed_position_outside_the_retained_log_resets_by_policy() -> None:
    assert policy().reset(0, 5, 5, 9) is None and policy().reset(0, 9, 5, 9) is None
    assert policy("earliest").reset(2, 1, 5, 9) == Reset(2, 5, expired=4)
    assert policy("latest").reset(2, 1, 5, 9) == Reset(2, 9, expired=4)
    assert policy("earliest").reset(2, 99, 5, 9) == Reset(2, 5, expired=0)
    with pytest.raises(OffsetOutOfRangeError, match=r"topic t read partition 2: committed position 1 of group g "
                                                    r".*oldest available offset 5\) of Kafka topic memq.t") as e:
        policy("error").reset(2, 1, 5, 9)
    assert (e.value.topic, e.value.partition, e.value.offset, e.value.oldest) == ("t", 2, 1, 5)


def lost_missing(rec: NotificationRecord) -> DataLossError:
    try:
        raise ObjectNotFoundError("gone")
    except ObjectNotFoundError as cause:
        e = batch_pointer("t", rec).lost("is missing")
        e.__cause__ = cause
        return e


def test_a_lost_batch_is_expired_past_retention_else_data_loss_by_policy() -> None:
    objects: dict[str, bytes] = {}
    rec = dataclasses.replace(batch("k", [(1, 0, recs("a"))], 7, objects), timestamp_ms=1_000)
    old, young = 1_000 + 60_001, 1_000 + 59_999
    corrupt = batch_pointer("t", rec).lost("is corrupt")
    assert policy().lost(rec, lost_missing(rec), old) == "expired"
    with pytest.raises(OffsetOutOfRangeError, match="older than the topic's retention") as e:
        policy("error").lost(rec, lost_missing(rec), old)
    assert (e.value.offset, e.value.oldest) == (7, 8)
    for young_or_corrupt, now in ((lost_missing(rec), young), (corrupt, old)):
        with pytest.raises(DataLossError):
            policy().lost(rec, young_or_corrupt, now)
        assert policy(skip=True).lost(rec, young_or_corrupt, now) == "skipped"
    with pytest.raises(DataLossError):
        policy(retention_ms=None).lost(rec, lost_missing(rec), old)


class Log:
    """A RetainedLog: committed positions and watermarks per partition; counts committed() calls."""

    def __init__(self, committed: dict[int, int | None], low: int, high: int) -> None:
        self.positions, self.low, self.high = committed, low, high
        self.asked: list[list[int]] = []

    def committed(self, partitions: Iterable[int]) -> dict[int, int | None]:
        asked = sorted(partitions)
        self.asked.append(asked)
        return {p: self.positions[p] for p in asked}

    def watermarks(self, partition: int) -> tuple[int, int]:
        return self.low, self.high


def test_range_check_asks_once_for_all_new_partitions_and_skips_sought_ones() -> None:
    check = RangeCheck(policy("earliest"))
    log_ = Log({0: 1, 1: None, 2: 7, 3: 2}, low=5, high=9)
    check.add([0, 1, 2, 3])
    check.discard([3])                                  # the application sought it
    assert list(check.resets(log_)) == [Reset(0, 5, 4)]
    assert log_.asked == [[0, 1, 2]]
    assert list(check.resets(log_)) == [] and len(log_.asked) == 1   # checked once


def test_range_check_with_error_raises_again_until_sought_past() -> None:
    check = RangeCheck(policy("error"))
    log_ = Log({0: 6, 1: 1, 2: 1}, low=5, high=9)
    check.add([0, 1, 2])
    for _ in range(2):
        with pytest.raises(OffsetOutOfRangeError) as e:
            list(check.resets(log_))
        assert e.value.partition == 1
    assert log_.asked[-1] == [1, 2]                     # partition 0 was in range: not asked again
    check.discard([1, 2])
    assert list(check.resets(log_)) == []


# --- commits -----------------------------------------------------------------------------------


def test_commit_sends_only_what_was_handed_and_not_yet_committed() -> None:
    offsets, target, metrics = Offsets(), CommitRecorder(), ConsumerMetrics()
    c = Committer(target, offsets, metrics, interval_s=None, clock=FakeClock(), logger=log)
    assert c.commit() == {} and target.commits == [] and metrics.commits == 0
    offsets.finished(0, 4)
    assert c.commit() == {0: 5} and target.commits == [({0: 5}, False)] and metrics.commits == 1
    assert c.commit() == {} and metrics.commits == 1


def test_auto_commit_commits_asynchronously_once_per_interval() -> None:
    offsets, target, clock = Offsets(), CommitRecorder(), FakeClock()
    c = Committer(target, offsets, ConsumerMetrics(), interval_s=5.0, clock=clock, logger=log)
    off = Committer(target, offsets, ConsumerMetrics(), interval_s=None, clock=clock, logger=log)
    offsets.finished(0, 0)
    clock.advance(4.9)
    c.tick()
    assert target.commits == [] and c.auto and not off.auto
    clock.advance(0.1)
    off.tick()
    assert target.commits == []
    c.tick()
    assert target.commits == [({0: 1}, True)]
    offsets.finished(0, 1)
    c.tick()                                            # the interval starts again
    assert len(target.commits) == 1
    clock.advance(5)
    c.tick()
    assert target.commits[-1] == ({0: 2}, True)


def test_revocation_commits_only_the_leaving_partitions_and_survives_a_failure(
        caplog: pytest.LogCaptureFixture) -> None:
    offsets, target, metrics = Offsets(), CommitRecorder(), ConsumerMetrics()
    c = Committer(target, offsets, metrics, interval_s=None, clock=FakeClock(), logger=log)
    offsets.finished(0, 3)
    offsets.finished(1, 8)
    c.revoked({1})
    assert target.commits == [({1: 9}, False)] and offsets.to_commit() == {0: 4}
    target.fail = ConsumerError("group rebalanced")
    with caplog.at_level(logging.WARNING, logger=log.name):
        c.revoked({0})
    assert "commit on revoke failed for [0]" in caplog.text and offsets.to_commit() == {0: 4}


# --- random access -----------------------------------------------------------------------------


class Probe:
    """A throw-away notification consumer over `records`; steps `clock` by each poll's timeout."""

    def __init__(self, records: list[NotificationRecord], clock: FakeClock) -> None:
        self.records, self.clock = records, clock
        self.assigned: dict[int, int] = {}
        self.closed = False

    def assign(self, partitions_offsets: Mapping[int, int]) -> None:
        self.assigned = dict(partitions_offsets)

    def poll(self, timeout_s: float, max_records: int = 500) -> list[NotificationRecord]:
        (p, o), = self.assigned.items()
        out = [r for r in self.records if r.partition == p and r.offset >= o][:max_records]
        if not out:
            self.clock.advance(timeout_s)
        return out

    def close(self) -> None:
        self.closed = True


def test_read_returns_one_log_message_by_position_through_a_throwaway_probe() -> None:
    objects: dict[str, bytes] = {}
    rs = [batch("k0", [(1, 0, recs("a"))], 0, objects),
          batch("k1", [(4, 2, recs("b", "c")), (5, 0, recs("d"))], 1, objects)]
    clock = FakeClock()
    probes: list[tuple[str, Probe]] = []

    def open_probe(group: str) -> Probe:
        probes.append((group, Probe(rs[1:], clock)))    # offset 0 is gone from this log
        return probes[-1][1]

    reader = BatchReader(MemqConfig(), 2, source=lambda: MemorySource(objects))
    ra = RandomAccess("t", "g", reader, open_probe, clock)
    try:
        r = ra.read(0, 1, 2, timeout=5)
        assert (bytes(r.value), r.topic, r.partition, r.offset, r.index) == (b"d", "t", 0, 1, 2)
        assert (r.producer_id, r.sequence, r.location) == (5, 0, ObjectLocation("b", "k1"))
        with pytest.raises(InvalidInputError, match="index 3 is outside"):
            ra.read(0, 1, 3, timeout=5)
        with pytest.raises(InvalidInputError, match="offset 0 \\(next is 1\\)"):
            ra.read(0, 0, 0, timeout=5)
        start = clock.monotonic()
        with pytest.raises(ConsumerError, match="no notification at topic t read partition 1 offset 0 within 3"):
            ra.read(1, 0, 0, timeout=3)
        assert clock.monotonic() - start == pytest.approx(3)
    finally:
        reader.close()
    assert all(p.closed for _, p in probes) and len(probes) == 4
    assert len({g for g, _ in probes}) == 4 and all(g.startswith("g.read.") for g, _ in probes)


# --- the Consumer coordinating them ------------------------------------------------------------


def coordinated(rs: list[NotificationRecord], objects: dict[str, bytes]) -> tuple[Consumer, FakeNotifications]:
    notes = FakeNotifications(rs)
    config = MemqConfig()
    return Consumer(config, "t", notifications=notes,
                    reader=BatchReader(config, 2, source=lambda: MemorySource(objects))), notes


def test_a_seek_mid_batch_stops_the_live_iterator_frees_its_memory_and_reads_from_there() -> None:
    objects: dict[str, bytes] = {}
    rs = [batch(f"k{i}", [(1, i, recs(f"{i}a", f"{i}b"))], i, objects) for i in range(3)]
    c, _ = coordinated(rs, objects)
    with c:
        it = c.poll(5)
        assert bytes(next(it).value) == b"0a" and c.buffered_bytes > 0
        c.seek(0, 2)
        assert list(it) == [] and c.buffered_bytes == 0 and c.position() == {0: 2}
        assert values(c, 1) == [b"2a", b"2b"] and c.commit() == {0: 3}


def test_a_revocation_commits_what_was_handed_over_and_drops_the_rest() -> None:
    objects: dict[str, bytes] = {}
    rs = [batch(f"k{i}", [(1, i, recs(f"{i}a", f"{i}b"))], i, objects) for i in range(3)]
    revoked: list[list[int]] = []
    notes = FakeNotifications(rs)
    config = MemqConfig()
    c = Consumer(config, "t", notifications=notes, on_revoke=revoked.append,
                 reader=BatchReader(config, 2, source=lambda: MemorySource(objects)))
    with c:
        assert values(c, 1) == [b"0a", b"0b"]
        it = c.poll(5)
        next(it)
        assert notes.on_revoke is not None
        notes.on_revoke([0])
        assert notes.commits == [{0: 1}] and revoked == [[0]]      # batch 0 handed over, batch 1 half
        assert list(it) == [] and c.buffered_bytes == 0 and c.commit() == {}
