"""The audit arithmetic on its own: matching, loss, duplicates, corruption, latency, lag, status."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from memq.audit.books import BOOKS_MS, LIVE_MS, Books, Status
from memq.audit.dashboard import series_json
from memq.audit.records import decode_records, encode_records
from memq.errors import CorruptDataError, UnsupportedVersionError

from tests.support.audit import SETTINGS, T0, cons, prod


def test_records_roundtrip_and_bad_bytes() -> None:
    recs = [prod(1), cons(2, pid=2**64 - 1)]
    cluster, back = decode_records(encode_records("c1", recs))
    assert cluster == "c1" and back == recs and back[1].key == (2**64 - 1, 0, 2)
    as_tuples = [tuple(r) for r in recs]          # what the emitter buffers
    assert decode_records(encode_records("c1", as_tuples))[1] == recs
    with pytest.raises(CorruptDataError):
        decode_records(b"\xc1garbage")
    with pytest.raises(CorruptDataError):
        decode_records(encode_records("c", [[9, "t", "", 1, 0, 1, 1, 1, 1, 1]]))
    with pytest.raises(CorruptDataError):
        decode_records(encode_records("c", [[1, "t", "", -1, 0, 1, 1, 1, 1, 1]]))
    with pytest.raises(UnsupportedVersionError):
        decode_records(b"\x93\x02\xa1c\x90")
    with pytest.raises(CorruptDataError):
        decode_records(encode_records("c", recs)[:-3])


def test_no_fault_balances_exactly() -> None:
    b = Books(SETTINGS)
    for s in range(20):
        b.add(prod(s, count=s + 1, created=T0 + s * 1000))
    for s in range(20):
        b.add(cons(s, count=s + 1, created=T0 + s * 1000, consumed=T0 + s * 1000 + 200))
    b.advance(T0 + 120_000)
    [row] = b.summary(T0 + 120_000)
    total = sum(range(1, 21))
    assert (row.produced, row.consumed, row.lost, row.duplicates, row.mismatches) == (total, total, 0, 0, 0)
    assert b.window(BOOKS_MS, "t", "", T0).produced == total
    assert b.window(BOOKS_MS, "t", "g", T0).consumed == total
    assert b.window(LIVE_MS, "t", "g", T0).consumed == sum(range(1, 11))   # seconds 0..9
    assert row.lag_messages == 0 and row.status is Status.IDLE     # all consumed, a minute ago


def test_loss_is_counted_in_the_creation_window_after_grace_and_taken_back_if_late() -> None:
    b = Books(SETTINGS)
    for s in range(3):
        b.add(prod(s, count=100, created=T0 + s * 20_000))   # windows T0, T0+20s, T0+40s
    b.add(cons(0, count=100, created=T0))
    b.add(cons(2, count=100, created=T0 + 40_000))
    b.advance(T0 + 20_000 + 5 + SETTINGS.grace_ms - 1)       # grace not over for seq 1
    assert b.summary(T0 + 26_000)[0].lost == 0
    b.advance(T0 + 20_000 + 5 + SETTINGS.grace_ms)
    assert b.window(LIVE_MS, "t", "g", T0 + 20_000).lost == 100
    assert b.window(LIVE_MS, "t", "g", T0).lost == 0
    assert b.window(BOOKS_MS, "t", "g", T0).lost == 100
    assert b.status("t", "g", T0 + 30_000) is Status.LOSS
    b.add(cons(1, count=100, created=T0 + 20_000, consumed=T0 + 50_000))   # late, not lost
    assert b.window(BOOKS_MS, "t", "g", T0).lost == 0
    [row] = b.summary(T0 + 50_000)
    assert (row.consumed, row.lost, row.duplicates) == (300, 0, 0)


def test_messages_older_than_a_group_ever_read_are_not_expected_of_it() -> None:
    b = Books(SETTINGS)
    b.add(prod(0, created=T0))
    b.add(prod(1, created=T0 + 1000))
    b.add(cons(1, created=T0 + 1000))
    b.advance(T0 + 60_000)
    assert b.summary(T0 + 60_000)[0].lost == 0


def test_duplicates_and_hash_mismatch_in_either_arrival_order() -> None:
    b = Books(SETTINGS)
    b.add(prod(0, count=5))
    b.add(cons(0, count=5))
    b.add(cons(0, count=5))                  # re-delivered batch
    b.add(cons(1, count=3, digest=99))       # consumed before its ack record arrives...
    b.add(prod(1, count=3, digest=7))        # ...and the bodies differ
    b.add(cons(2, count=4, digest=1))
    b.add(prod(2, count=4, digest=1))        # same digest: fine
    b.advance(T0 + 60_000)
    [row] = b.summary(T0 + 60_000)
    assert (row.produced, row.consumed, row.duplicates, row.mismatches, row.lost) == (12, 12, 5, 3, 0)
    assert b.window(BOOKS_MS, "t", "g", T0).duplicates == 5


def test_groups_are_balanced_separately() -> None:
    b = Books(SETTINGS)
    for s in range(4):
        b.add(prod(s))
        b.add(cons(s, group="a"))
        if s != 2:
            b.add(cons(s, group="b"))
    b.advance(T0 + 60_000)
    rows = {r.group: r for r in b.summary(T0 + 60_000)}
    assert rows["a"].lost == 0 and rows["b"].lost == 10
    assert b.summary(T0 + 60_000)[0].group == "b"          # worst first


def test_latency_percentiles_and_max() -> None:
    b = Books(SETTINGS)
    for s in range(100):                     # latencies 10 ms .. 1000 ms, one LogMessage each
        b.add(prod(s, count=1))
        b.add(cons(s, count=1, consumed=T0 + (s + 1) * 10))
    w = b.window(BOOKS_MS, "t", "g", T0)
    assert w.latency_max_ms == 1000
    assert w.percentile_ms(0.5) == pytest.approx(500, rel=0.05)
    assert w.percentile_ms(0.99) == pytest.approx(990, rel=0.05)


def test_lag_warn_and_stall() -> None:
    b = Books(SETTINGS)
    b.add(prod(0, created=T0))
    b.add(cons(0, created=T0, consumed=T0 + 10))
    for s in range(1, 4):
        b.add(prod(s, count=7, created=T0 + s))
    b.advance(T0 + 1_000)
    [row] = b.summary(T0 + 1_000)
    assert row.lag_messages == 21 and row.lag_s == pytest.approx(0.999) and row.status is Status.OK
    b.advance(T0 + 3_500)
    assert b.status("t", "g", T0 + 3_500) is Status.LAG         # lag 3.5 s > warn 3 s
    b.advance(T0 + 4_500)
    assert b.status("t", "g", T0 + 4_500) is Status.STOPPED     # nothing consumed for 4.49 s
    assert b.window(LIVE_MS, "t", "g", T0).lag_messages == 21


def test_lost_messages_leave_the_lag_of_table_and_chart_alike() -> None:
    b = Books(SETTINGS)
    b.add(prod(0, created=T0))
    b.add(cons(0, created=T0, consumed=T0 + 10))
    b.add(prod(1, count=40, created=T0 + 100))                  # injected loss: never consumed
    b.add(prod(2, count=1, created=T0 + 200))
    b.add(cons(2, count=1, created=T0 + 200, consumed=T0 + 300))  # ... but the group moved past it
    b.advance(T0 + 2_200)
    [row] = b.summary(T0 + 2_200)
    assert (row.lag_messages, row.lag_s) == (40, 2.1)
    b.advance(T0 + 5_200)                                       # grace over: reported lost
    [row] = b.summary(T0 + 5_200)
    assert (row.lost, row.lag_messages, row.lag_s) == (40, 0, 0)
    for size in (LIVE_MS, BOOKS_MS):                            # the chart's newest window
        [(start, w)] = b.series(size, "t", "g", T0)
        assert (start, w.lost, w.lag_messages, w.lag_ms) == (T0, 40, 0, 0)
    chart = series_json(b, "t", LIVE_MS, T0)["groups"]["g"]
    assert (chart["lag_messages"][-1], chart["lag_s"][-1]) == (row.lag_messages, row.lag_s)


def test_state_is_forgotten_after_retention() -> None:
    b = Books(SETTINGS)
    b.add(prod(0))
    b.add(cons(0))
    b.add(cons(5))                           # never produced (e.g. audit off at the producer)
    b.drain_changes()
    b.advance(T0 + SETTINGS.retention_ms + 1_000)
    ch = b.drain_changes()
    assert ch.produced == {("t", (1, 0, 0)): None}
    assert set(ch.deliveries) == {("t", "g", (1, 0, 0)), ("t", "g", (1, 0, 5))}
    assert all(v is None for v in ch.deliveries.values())


def test_restore_from_changes_resumes_exactly() -> None:
    b = Books(SETTINGS)
    for s in range(4):
        b.add(prod(s, created=T0 + s))
    b.add(cons(0))
    b.advance(T0 + 1000)
    full = b.drain_changes()
    again = Books(SETTINGS)
    again.restore(copy.deepcopy(full))     # as if read back from disk
    for books in (b, again):
        books.add(cons(1, created=T0 + 1))
        books.add(cons(1, created=T0 + 1))
        books.add(cons(3, created=T0 + 3))         # seq 2 passed: lost
        books.advance(T0 + 60_000)
    assert b.summary(T0 + 60_000) == again.summary(T0 + 60_000)
    assert again.summary(T0 + 60_000)[0].lost == 10


def test_a_group_that_appears_after_the_grace_period_gets_its_own() -> None:
    b = Books(SETTINGS)
    for s in range(3):
        b.add(prod(s, created=T0 + s))
    b.advance(T0 + 30_000)                   # all settled, no group yet: nothing to blame
    b.add(cons(0, created=T0, consumed=T0 + 30_000))
    b.advance(T0 + 30_000 + SETTINGS.grace_ms - 1)
    assert b.summary(T0 + 34_000)[0].lost == 0          # still catching up on history
    b.add(cons(2, created=T0 + 2, consumed=T0 + 31_000))
    b.advance(T0 + 30_000 + SETTINGS.grace_ms)
    [row] = b.summary(T0 + 36_000)
    assert (row.consumed, row.lost) == (20, 10)
    assert b.window(BOOKS_MS, "t", "g", T0).lost == 10


def test_a_stopped_group_keeps_its_backlog_and_loses_nothing() -> None:
    """Not consumed yet is backlog, however old; only Messages the group moved past are lost."""
    b = Books(SETTINGS)
    for s in range(10):
        b.add(prod(s, created=T0 + s * 100))
    for s in range(5):
        b.add(cons(s, created=T0 + s * 100, consumed=T0 + s * 100 + 50))
    # The consumer exits (a clean SIGTERM: Messages 5..9 were never fetched); long after grace:
    for now in (T0 + 10_000, T0 + 40_000):
        b.advance(now)
        [row] = b.summary(now)
        assert (row.lost, row.lag_messages) == (0, 50)
        assert row.lag_s == pytest.approx((now - T0 - 500) / 1000)
        assert row.status is Status.STOPPED
    assert b.window(BOOKS_MS, "t", "g", T0).lost == 0
    b.add(cons(8, created=T0 + 800, consumed=T0 + 41_000))   # restarted; 5..7 were skipped
    b.advance(T0 + 41_000)
    [row] = b.summary(T0 + 41_000)
    assert (row.lost, row.lag_messages, row.status) == (30, 10, Status.LOSS)   # 9 still pending


def test_states_ok_idle_lag_stalled() -> None:
    b = Books(SETTINGS)
    b.add(prod(0, created=T0))
    b.add(cons(0, created=T0, consumed=T0 + 10))
    b.advance(T0 + 1_000)
    assert b.status("t", "g", T0 + 1_000) is Status.OK
    b.advance(T0 + 4_100)
    assert b.status("t", "g", T0 + 4_100) is Status.IDLE          # nothing to do for 4 s
    b.add(prod(1, created=T0 + 4_200))                          # a pending Message...
    seen = {}
    for i, now in enumerate(range(T0 + 4_300, T0 + 9_000, 500)):  # ...while others flow
        b.add(prod(10 + i, created=now - 50))
        b.add(cons(10 + i, created=now - 50, consumed=now))
        b.advance(now)
        seen[now - T0] = b.status("t", "g", now)
    assert seen[4_300] is Status.OK and seen[7_300] is Status.LAG
    assert seen[8_800] is Status.STALLED                          # 4.6 s old, others consumed
    assert b.summary(T0 + 8_800)[0].lost == 0                     # still in its grace


def test_interleaved_partitions_at_a_stop_are_backlog_within_the_skew() -> None:
    """At a stop, partition B's newest Message may be older than partition A's last delivered one."""
    b = Books(dataclasses.replace(SETTINGS, skew_ms=1_000))
    b.add(prod(0, created=T0))
    b.add(cons(0, created=T0))
    b.add(prod(1, created=T0 + 700))                          # partition B, not yet delivered
    b.add(prod(2, created=T0 + 800))                          # partition A
    b.add(cons(2, created=T0 + 800, consumed=T0 + 900))
    b.advance(T0 + 30_000)                                    # grace long over, the group stopped
    [row] = b.summary(T0 + 30_000)
    assert (row.lost, row.lag_messages, row.status) == (0, 10, Status.STOPPED)
    b.add(prod(3, created=T0 + 1_700))
    b.add(cons(3, created=T0 + 1_700, consumed=T0 + 31_000))  # back, and 1 s past it: lost now
    b.advance(T0 + 31_000)
    assert b.summary(T0 + 31_000)[0].lost == 10
