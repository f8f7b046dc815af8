"""The SQLite store: books reloaded from disk continue exactly as if never stopped."""

from __future__ import annotations

from pathlib import Path

from memq.audit.books import BOOKS_MS, Books
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
