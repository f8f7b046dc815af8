"""The audit counts data retention deleted as expired, never as lost (memq.audit.books)."""

from __future__ import annotations

from memq.audit.books import Books, Status
from memq.audit.records import AuditRecord, Kind, decode_records, encode_records

from tests.support.audit import SETTINGS, T0, cons, prod


def expired(before_ms: int, topic: str = "t") -> AuditRecord:
    return AuditRecord(Kind.EXPIRED, topic, "", 0, 0, 0, 0, 0, before_ms, before_ms + 10)


def test_expired_records_round_trip() -> None:
    assert decode_records(encode_records("c", [expired(T0)]))[1] == [expired(T0)]


def test_messages_a_group_skipped_past_retention_are_expired_not_lost() -> None:
    b = Books(SETTINGS)
    for s in range(10):
        b.add(prod(s, created=T0 + s * 1000))
    b.add(cons(0, created=T0))                                 # the group read the first one
    b.add(cons(9, created=T0 + 9000, consumed=T0 + 20_000))     # ... then jumped past the rest
    b.add(expired(T0 + 5_000))                                  # the janitor deleted up to seq 4
    b.advance(T0 + 30_000)
    [row] = b.summary(T0 + 30_000)
    assert (row.expired, row.lost) == (40, 40)                  # seq 1-4 expired; 5-8 really lost
    assert row.consumed == 20


def test_a_loss_reckoned_before_the_janitor_reported_is_taken_back() -> None:
    b = Books(SETTINGS)
    for s in range(5):
        b.add(prod(s, created=T0 + s * 1000))
    b.add(cons(0, created=T0))
    b.add(cons(4, created=T0 + 4000, consumed=T0 + 6000))
    b.advance(T0 + 30_000)
    assert b.summary(T0 + 30_000)[0].lost == 30                 # seq 1-3 passed: lost, so far
    b.add(expired(T0 + 4_000))
    b.advance(T0 + 31_000)
    [row] = b.summary(T0 + 31_000)
    assert (row.lost, row.expired) == (0, 30)
    assert row.status != Status.LOSS
