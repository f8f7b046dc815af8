"""The tables panel's arithmetic (pure): a sync's snapshot summaries folded into what it committed,
its report's round trip, and the dashboard's rows against the topic's ends now."""

from __future__ import annotations

import pytest

from memq.audit.tables import (
    DEAD_LETTERS,
    END_OFFSETS,
    NEWEST_MS,
    SCHEMA_VERSION,
    SYNC_ID,
    Committed,
    committed,
    table_rows,
)
from memq.errors import CorruptDataError

SNAPSHOTS = [
    (1_000, {SYNC_ID: "t->ns.t", END_OFFSETS: '{"0": 5}', DEAD_LETTERS: "1", SCHEMA_VERSION: "2", NEWEST_MS: "900"}),
    (2_000, {SYNC_ID: "other->ns.t", END_OFFSETS: '{"0": 99}', DEAD_LETTERS: "7"}),   # another sync's commit
    (3_000, {SYNC_ID: "t->ns.t", END_OFFSETS: '{"0": 8, "1": 3}', DEAD_LETTERS: "2", SCHEMA_VERSION: "3",
             NEWEST_MS: "2500"}),
    (4_000, {SYNC_ID: "t->ns.t", END_OFFSETS: "{}"}),   # a dead-letter-only batch names no end
]


def test_a_syncs_commits_fold_into_its_report_and_back() -> None:
    done = committed(SNAPSHOTS, 40, sync_id="t->ns.t", topic="t", table="ns.t", dense=True)
    assert done == Committed("t->ns.t", "t", "ns.t", 40, 3, 4_000, 3, 3, {0: 8, 1: 3}, 2_500, True)
    assert Committed.from_json(done.to_json()) == done
    with pytest.raises(CorruptDataError):
        Committed.from_json(b'{"sync_id": "x"}')


def test_the_rows_show_lag_in_records_and_time_or_why_it_is_unknown() -> None:
    done = committed(SNAPSHOTS, 40, sync_id="t->ns.t", topic="t", table="ns.t", dense=True)
    idle = Committed("u->ns.u", "u", "ns.u", 0, 0, None, None, 0)
    lost = Committed("v->ns.v", "v", "ns.v", 9, 1, 5, None, 0, {0: 1})
    rows = table_rows({r.sync_id: r for r in (idle, done, lost)},
                      {"t": {0: 10, 1: 3, 2: 4}, "u": {0: 0}, "v": "Kafka did not answer"}, now_ms=7_500)
    assert [r["table"] for r in rows] == ["ns.t", "ns.u", "ns.v"]
    t, u, v = rows
    assert (t["lag"], t["lag_unit"], t["lag_s"], t["rows"], t["dead_letters"], t["schema_version"]) == \
        (2 + 0 + 4, "records", 5.0, 40, 3, 3)             # a partition never committed lags by all its records
    assert (u["lag"], u["lag_unit"], u["lag_s"], u["error"]) == (0, "notifications", 0.0, None)
    assert (v["lag"], v["lag_s"], v["rows"], v["error"]) == (None, None, 9, "Kafka did not answer")
