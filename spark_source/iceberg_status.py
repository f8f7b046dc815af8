"""`memq table status`: where a table sync stands, from its snapshot summaries and the topic's
notification log: rows, last commit, the subject version its read schema reached, dead letters,
and its lag behind the topic in the topic's offsets (records on a dense topic, notifications, i.e.
batch objects, on a sparse one) and in time."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from pyiceberg.table import Table

from spark_source.iceberg import (
    DEAD_LETTERS,
    END_OFFSETS,
    NEWEST_MS,
    SCHEMA_VERSION,
    SYNC_ID,
    TableSync,
    open_catalog,
)
from spark_source.dense import driver_offsets, record_offsets
from spark_source.options import parse_options
from spark_source.plan import NotificationLog


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


def status_of(table: Table, sync_id: str, highs: Mapping[int, int], now_ms: int, *,
              dense: bool = False) -> TableStatus:
    """The status of `sync_id`'s commits to `table`, against the topic's high watermarks `highs`
    (record offsets if `dense`, else notification offsets)."""
    ends: dict[int, int] = {}
    batches = dead = 0
    version: int | None = None
    last_ms: int | None = None
    newest_ms: int | None = None
    for snap in table.metadata.snapshots:
        summary = snap.summary
        if summary is None or summary[SYNC_ID] != sync_id:
            continue
        batches += 1
        last_ms = max(last_ms or 0, snap.timestamp_ms)
        for p, o in json.loads(summary[END_OFFSETS] or "{}").items():
            ends[int(p)] = max(ends.get(int(p), 0), int(o))
        dead += int(summary[DEAD_LETTERS] or 0)
        if summary[SCHEMA_VERSION]:
            version = max(version or 0, int(summary[SCHEMA_VERSION] or 0))
        if summary[NEWEST_MS]:
            newest_ms = max(newest_ms or 0, int(summary[NEWEST_MS] or 0))
    current = table.current_snapshot()
    rows = int(current.summary["total-records"] or 0) if current is not None and current.summary else 0
    lag = sum(max(0, high - ends.get(p, 0)) for p, high in highs.items())
    lag_s = 0.0 if lag == 0 else None if newest_ms is None else max(0.0, (now_ms - newest_ms) / 1000)
    return TableStatus(".".join(table.name()), rows, batches, last_ms, version, dead,
                       ends, lag, "records" if dense else "notifications", lag_s)


def table_status(spec: TableSync, now_ms: int) -> TableStatus:
    """`spec`'s table status, asking the topic's notification log for its high watermarks."""
    table = open_catalog(spec.catalog).load_table(spec.table)
    opts = parse_options({**spec.source, "topic": spec.topic})
    nlog = NotificationLog(opts)
    offsets = driver_offsets(opts)
    try:
        highs = record_offsets(offsets, nlog.highs())   # in the offsets the table's ends are in
    finally:
        nlog.close()
    return status_of(table, spec.id, highs, now_ms, dense=offsets is not None)
