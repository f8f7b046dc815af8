"""A broker's transaction metrics (prometheus, in the broker's registry)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class TxnMetrics:
    def __init__(self, registry: CollectorRegistry, open_now: Callable[[], int]) -> None:
        r = registry
        self.open = Gauge("memq_txn_open", "Transactions begun on this broker and not finished yet", registry=r)
        self.open.set_function(open_now)
        self.commits = Counter("memq_txn_commits", "Transactions committed (completed) by this broker", registry=r)
        self.aborts = Counter("memq_txn_aborts", "Transactions aborted (completed) by this broker, timeouts included",
                              registry=r)
        self.aborted_records = Counter("memq_txn_aborted_records",
                                       "Records (LogMessages) of transactions aborted by this broker: never readable",
                                       registry=r)
        self.timeouts = Counter("memq_txn_timeouts", "Transactions aborted because they outlived their timeout",
                                registry=r)
        self.expired_ids = Counter("memq_txn_expired_ids",
                                   "Transactional ids forgotten after broker.txn_id_expiration_ms unused", registry=r)
        self.pending = Counter("memq_txn_pending_notifications",
                               "Notifications of transactional produces kept pending until their commit", registry=r)
        self.offset_refusals = Counter(
            "memq_txn_offset_refusals", "Partitions whose transactional offsets the group coordinator refused at commit",
            registry=r)
        self.end_seconds = Histogram("memq_txn_end_seconds", "EndTxn from request to complete, by decision",
                                     ["decision"], buckets=_BUCKETS, registry=r)
