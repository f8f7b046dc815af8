"""SQLite persistence of the books, so that an auditor restart loses nothing and counts nothing twice.

Each `commit` writes the books' changes *and* the next audit-topic offset of every partition
in one transaction: after a crash the auditor reloads both and resumes reading exactly after
the last record it accounted for. WAL mode keeps readers (e.g. ad-hoc `sqlite3` queries of the
books) from blocking the writer. SQLite integers are signed 64-bit, so u64 ids are stored
shifted into that range.

The offsets only mean something on the Kafka cluster they were read from, so the file also
records that cluster's id; `reset` starts the books over for another one. A file written by an
older schema (`PRAGMA user_version`) is reset when opened: the books are derived data.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import msgpack

from memq.audit.books import Changes, Delivery, GroupState, MsgKey, Produced, Window
from memq.errors import ConfigError

log = logging.getLogger(__name__)
_VERSION = 4
_TABLES = ("meta", "offsets", "topics", "produced", "deliveries", "groups", "windows")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS offsets (part INTEGER PRIMARY KEY, next_offset INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS topics (topic TEXT PRIMARY KEY, produced INTEGER NOT NULL, aborted INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS produced (
    topic TEXT, pid INTEGER, epoch INTEGER, seq INTEGER,
    count INTEGER, digest INTEGER, created_ms INTEGER, acked_ms INTEGER, settled INTEGER,
    PRIMARY KEY (topic, pid, epoch, seq));
CREATE TABLE IF NOT EXISTS deliveries (
    topic TEXT, grp TEXT, pid INTEGER, epoch INTEGER, seq INTEGER,
    deliveries INTEGER, digest INTEGER, consumed_ms INTEGER, lost INTEGER,
    PRIMARY KEY (topic, grp, pid, epoch, seq));
CREATE TABLE IF NOT EXISTS groups (
    topic TEXT, grp TEXT, since_ms INTEGER, last_consumed_ms INTEGER, first_seen_ms INTEGER,
    caught_up INTEGER, consumed INTEGER, lost INTEGER, duplicates INTEGER, mismatches INTEGER,
    lag_messages INTEGER, lag_ms INTEGER, position_ms INTEGER, expired INTEGER, PRIMARY KEY (topic, grp));
CREATE TABLE IF NOT EXISTS windows (
    size_ms INTEGER, topic TEXT, grp TEXT, start_ms INTEGER,
    produced INTEGER, consumed INTEGER, lost INTEGER, duplicates INTEGER, mismatches INTEGER,
    latency BLOB, latency_max_ms INTEGER, lag_messages INTEGER, lag_ms INTEGER,
    PRIMARY KEY (size_ms, topic, grp, start_ms));
"""
_SHIFT = 1 << 63


def _s(u: int) -> int:
    return u - _SHIFT


def _u(s: int) -> int:
    return s + _SHIFT


def _key(pid: int, epoch: int, seq: int) -> MsgKey:
    return (_u(pid), epoch, _u(seq))


class AuditStore:
    """The auditor's database file; used from one thread at a time."""

    def __init__(self, path: str | Path) -> None:
        try:
            self._db = sqlite3.connect(str(path), timeout=10, check_same_thread=False,
                                       isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version != _VERSION:
                if self._db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                    log.warning("audit database %s has schema %d, not %d: starting the books over",
                                path, version, _VERSION)
                self._db.executescript("".join(f"DROP TABLE IF EXISTS {t};" for t in _TABLES))
                self._db.execute(f"PRAGMA user_version={_VERSION}")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as e:
            raise ConfigError(f"audit.db_path {str(path)!r}: cannot open SQLite database: {e}") from None

    def kafka_cluster(self) -> str | None:
        """The id of the Kafka cluster the stored offsets belong to (None: not recorded yet)."""
        row = self._db.execute("SELECT value FROM meta WHERE key='kafka_cluster'").fetchone()
        return None if row is None else str(row[0])

    def reset(self, kafka_cluster: str) -> None:
        """Forget all books and offsets; what follows is read from Kafka cluster `kafka_cluster`."""
        db = self._db
        db.execute("BEGIN")
        try:
            for t in _TABLES:
                db.execute(f"DELETE FROM {t}")
            db.execute("INSERT INTO meta VALUES ('kafka_cluster', ?)", (kafka_cluster,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def load(self, memory_since_ms: int) -> tuple[Changes, dict[int, int]]:
        """Every persisted row (windows from memory_since_ms on) and the audit offsets."""
        q = self._db.execute
        produced: dict[tuple[str, MsgKey], Produced | None] = {
            (t, _key(p, e, s)): Produced(c, d, cr, ak, bool(st))
            for t, p, e, s, c, d, cr, ak, st in q("SELECT * FROM produced")}
        deliveries: dict[tuple[str, str, MsgKey], Delivery | None] = {
            (t, g, _key(p, e, s)): Delivery(n, d, cm, bool(lost))
            for t, g, p, e, s, n, d, cm, lost in q("SELECT * FROM deliveries")}
        groups = {(t, g): GroupState(since, last, first, bool(caught), *rest)
                  for t, g, since, last, first, caught, *rest in q("SELECT * FROM groups")}
        topics = {t: (p, a) for t, p, a in q("SELECT topic, produced, aborted FROM topics")}
        windows = {}
        for size, t, g, start, pr, co, lo, du, mi, lat, lmax, lagm, lagms in q(
                "SELECT * FROM windows WHERE start_ms >= ?", (memory_since_ms,)):
            hist = msgpack.unpackb(lat, strict_map_key=False)
            windows[(size, t, g, start)] = Window(pr, co, lo, du, mi, hist, lmax, lagm, lagms)
        offsets = dict(q("SELECT part, next_offset FROM offsets").fetchall())
        return Changes(produced, deliveries, groups, topics, windows), offsets

    def commit(self, ch: Changes, offsets: dict[int, int]) -> None:
        """Write changes and the offsets they account for atomically."""
        db = self._db
        db.execute("BEGIN")
        try:
            for (t, (p, e, s)), pr in ch.produced.items():
                if pr is None:
                    db.execute("DELETE FROM produced WHERE topic=? AND pid=? AND epoch=? AND seq=?",
                               (t, _s(p), e, _s(s)))
                else:
                    db.execute("INSERT OR REPLACE INTO produced VALUES (?,?,?,?,?,?,?,?,?)",
                               (t, _s(p), e, _s(s), pr.count, pr.digest, pr.created_ms,
                                pr.acked_ms, int(pr.settled)))
            for (t, g, (p, e, s)), d in ch.deliveries.items():
                if d is None:
                    db.execute("DELETE FROM deliveries WHERE topic=? AND grp=? AND pid=? AND epoch=?"
                               " AND seq=?", (t, g, _s(p), e, _s(s)))
                else:
                    db.execute("INSERT OR REPLACE INTO deliveries VALUES (?,?,?,?,?,?,?,?,?)",
                               (t, g, _s(p), e, _s(s), d.deliveries, d.digest, d.consumed_ms,
                                int(d.lost)))
            db.executemany("INSERT OR REPLACE INTO groups VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                           [(t, g, gs.since_ms, gs.last_consumed_ms, gs.first_seen_ms,
                             int(gs.caught_up), gs.consumed, gs.lost,
                             gs.duplicates, gs.mismatches, gs.lag_messages, gs.lag_ms,
                             gs.position_ms, gs.expired)
                            for (t, g), gs in ch.groups.items()])
            db.executemany("INSERT OR REPLACE INTO topics VALUES (?,?,?)", [(t, p, a) for t, (p, a) in ch.topics.items()])
            db.executemany("INSERT OR REPLACE INTO windows VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                           [(size, t, g, start, w.produced, w.consumed, w.lost, w.duplicates,
                             w.mismatches, msgpack.packb(w.latency), w.latency_max_ms,
                             w.lag_messages, w.lag_ms)
                            for (size, t, g, start), w in ch.windows.items()])
            db.executemany("INSERT OR REPLACE INTO offsets VALUES (?,?)", list(offsets.items()))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._db.close()
