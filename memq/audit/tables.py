"""Where a table sync stands (pure, no I/O): what its Iceberg snapshot summaries say it committed
(`Committed`), and its lag behind the topic's ends (`TableStatus`, `status_of`).

Pure so that both sides use one arithmetic: `memq table status` (spark_source, pyiceberg) folds a
table's snapshots, and the dashboard (no pyiceberg in the broker image) gets the same `Committed`
as the sync reports it after each commit (`memq.audit.table_board`), adding its lag live.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from memq.errors import CorruptDataError

# a table sync's snapshot summary keys (spark_source.iceberg writes them)
SYNC_ID = "memq.sync-id"
BATCH_ID = "memq.batch-id"
END_OFFSETS = "memq.end-offsets"
DEAD_LETTERS = "memq.dead-letters"        # a typed sync's batch: how many records went to <table>_dlq
NEWEST_MS = "memq.newest-timestamp-ms"    # the newest message timestamp a batch committed (lag in time)
SCHEMA_VERSION = "memq.schema-version"    # a typed sync's batch: the newest subject version its read schema merged


@dataclass(frozen=True)
class Committed:
    """What a sync's commits to a table add up to (`committed`)."""

    sync_id: str
    topic: str
    table: str
    rows: int                             # the table's rows now
    batches: int                          # micro-batches this sync committed
    last_commit_ms: int | None
    schema_version: int | None            # typed syncs: the newest subject version merged
    dead_letters: int
    end_offsets: dict[int, int] = field(default_factory=dict)   # read partition → next offset not in the table
    newest_ms: int | None = None          # the newest message timestamp committed
    dense: bool = False                   # the source's offsets are records (else notifications)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Committed:
        """A report as `to_json` wrote it; CorruptDataError on anything else."""
        try:
            obj: dict[str, Any] = json.loads(raw)
            obj["end_offsets"] = {int(p): int(o) for p, o in obj["end_offsets"].items()}
            return cls(**obj)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise CorruptDataError(f"table sync report is not a Committed: {e}: {raw[:200]!r}") from None


def committed(snapshots: Iterable[tuple[int, Mapping[str, str]]], rows: int, *, sync_id: str, topic: str,
              table: str, dense: bool) -> Committed:
    """Fold a table's snapshots ((commit time, summary) pairs) into what `sync_id` committed."""
    ends: dict[int, int] = {}
    batches = dead = 0
    version = last_ms = newest_ms = None
    for commit_ms, summary in snapshots:
        if summary.get(SYNC_ID) != sync_id:
            continue
        batches += 1
        last_ms = max(last_ms or 0, commit_ms)
        for p, o in json.loads(summary.get(END_OFFSETS) or "{}").items():
            ends[int(p)] = max(ends.get(int(p), 0), int(o))
        dead += int(summary.get(DEAD_LETTERS) or 0)
        if summary.get(SCHEMA_VERSION):
            version = max(version or 0, int(summary[SCHEMA_VERSION]))
        if summary.get(NEWEST_MS):
            newest_ms = max(newest_ms or 0, int(summary[NEWEST_MS]))
    return Committed(sync_id, topic, table, rows, batches, last_ms, version, dead, ends, newest_ms, dense)


@dataclass(frozen=True)
class TableStatus:
    table: str
    rows: int
    batches: int                          # micro-batches this sync committed
    last_commit_ms: int | None
    schema_version: int | None            # typed syncs: the newest subject version merged
    dead_letters: int
    end_offsets: dict[int, int]           # read partition → next offset not in the table (the source's offsets)
    lag: int                              # the topic's offsets past end_offsets, in `lag_unit`
    lag_unit: str                         # "records" (a dense topic) or "notifications" (a sparse one)
    lag_s: float | None                   # now - the newest committed message timestamp, while lagging (else 0)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def status_of(done: Committed, highs: Mapping[int, int], now_ms: int) -> TableStatus:
    """`done` against the topic's high watermarks `highs` (in the source's offsets: records if
    `done.dense`, else notifications)."""
    ends = done.end_offsets
    lag = sum(max(0, high - ends.get(p, 0)) for p, high in highs.items())
    newest = done.newest_ms
    lag_s = 0.0 if lag == 0 else None if newest is None else max(0.0, (now_ms - newest) / 1000)
    return TableStatus(done.table, done.rows, done.batches, done.last_commit_ms, done.schema_version,
                       done.dead_letters, dict(ends), lag, "records" if done.dense else "notifications", lag_s)


def table_rows(reports: Mapping[str, Committed], highs: Mapping[str, Mapping[int, int] | str],
               now_ms: int) -> list[dict[str, Any]]:
    """The dashboard's rows, by table: each sync's status against its topic's ends `highs[topic]`,
    or, where those could not be read (a string: why), its committed figures with no lag."""
    rows = []
    for done in sorted(reports.values(), key=lambda d: (d.table, d.sync_id)):
        ends = highs.get(done.topic, "no ends asked")
        row: dict[str, Any] = {"sync_id": done.sync_id, "topic": done.topic, "error": None,
                               **asdict(status_of(done, ends if not isinstance(ends, str) else {}, now_ms))}
        if isinstance(ends, str):
            row.update(lag=None, lag_s=None, error=ends)
        rows.append(row)
    return rows
