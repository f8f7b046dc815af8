"""The SQLite store: books reloaded from disk continue exactly as if never stopped."""

from __future__ import annotations

from pathlib import Path

from memq.audit.books import BOOKS_MS, Books
from memq.audit.records import AuditRecord, Kind
from memq.audit.store import AuditStore
from tests.support.audit import SETTINGS, T0, cons, prod


def test_incremental_commits_reload_into_identical_books(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    live = Books(SETTINGS)
    store = AuditStore(db)
    big = 2**64 - 3                                   # u64 ids survive SQLite's signed integers
    live.add_all([prod(0, pid=big), prod(1), prod(2), cons(0, pid=big), cons(0, pid=big)])
    live.advance(T0 + 1_000)
    store.commit(live.drain_changes(), {0: 5})
    live.add_all([cons(2, digest=8)])
    live.advance(T0 + 10_000)                         # seq 1 is lost now
    store.commit(live.drain_changes(), {0: 6, 1: 2})
    store.close()

    store = AuditStore(db)
    state, offsets = store.load(memory_since_ms=0)
    assert offsets == {0: 6, 1: 2}
    again = Books(SETTINGS)
    again.restore(state)
    assert again.summary(T0 + 10_000) == live.summary(T0 + 10_000)
    assert again.window(BOOKS_MS, "t", "g", T0) == live.window(BOOKS_MS, "t", "g", T0)
    row = again.summary(T0 + 10_000)[0]
    assert (row.produced, row.consumed, row.lost, row.duplicates, row.mismatches) == (30, 20, 10, 10, 10)
    for books in (live, again):                       # late arrival and eviction work after reload
        books.add(cons(1, consumed=T0 + 20_000))
        books.advance(T0 + SETTINGS.retention_ms + 60_000)
    assert again.summary(T0 + 30_000) == live.summary(T0 + 30_000)
    assert again.summary(T0 + 30_000)[0].lost == 0
    store.commit(again.drain_changes(), {0: 7})
    state, _ = store.load(memory_since_ms=0)
    assert not [v for v in state.produced.values() if v] and not state.deliveries
    store.close()


def test_aborted_records_count_apart_and_survive_a_reload(tmp_path: Path) -> None:
    """A transaction's aborted LogMessages: neither produced nor expected of any group (no loss),
    counted per topic, kept across a restart of the auditor."""
    def aborted(topic: str, count: int) -> AuditRecord:
        return AuditRecord(Kind.ABORTED, topic, "", 0, 0, 0, count, 0, T0, T0)

    live = Books(SETTINGS)
    live.add_all([prod(0), aborted("t", 7), aborted("t", 2), aborted("u", 3), cons(0)])
    live.advance(T0 + 60_000)
    rows = {r.topic: r for r in live.summary(T0 + 60_000)}
    assert (rows["t"].produced, rows["t"].consumed, rows["t"].lost, rows["t"].aborted) == (10, 10, 0, 9)
    assert (rows["u"].group, rows["u"].produced, rows["u"].aborted) == ("", 0, 3)
    store = AuditStore(tmp_path / "audit.db")
    store.commit(live.drain_changes(), {0: 1})
    again = Books(SETTINGS)
    again.restore(store.load(memory_since_ms=0)[0])
    store.close()
    assert again.summary(T0 + 60_000) == live.summary(T0 + 60_000)
