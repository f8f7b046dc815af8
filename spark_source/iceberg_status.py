"""`memq table status`: where a table sync stands, from its snapshot summaries and the topic's
notification log: rows, last commit, the subject version its read schema reached, dead letters,
and its lag behind the topic in the topic's offsets (records on a dense topic, notifications, i.e.
batch objects, on a sparse one) and in time (the arithmetic: `memq.audit.tables`)."""

from __future__ import annotations

from memq.audit.tables import TableStatus, status_of
from spark_source.dense import driver_offsets, record_offsets
from spark_source.iceberg import TableSync, open_catalog, sync_committed
from spark_source.options import parse_options
from spark_source.plan import NotificationLog


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
    return status_of(sync_committed(table, spec, dense=offsets is not None), highs, now_ms)
