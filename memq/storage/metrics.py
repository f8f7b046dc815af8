"""Prometheus metrics of storage calls, registered on a registry the caller passes in.

Built as an object (not module globals) so several handlers, or several test processes'
handlers, can live in one interpreter: share one `StorageMetrics` per registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class StorageMetrics:
    """Counters and latency per backend ("s3", "file") and operation (put, get, get_range, list, delete)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.attempts = Counter("memq_storage_attempts", "Storage requests sent (each try counts)",
                                ["backend", "op"], registry=registry)
        self.retries = Counter("memq_storage_retries", "Storage requests retried, by failure reason",
                               ["backend", "op", "reason"], registry=registry)
        self.failures = Counter("memq_storage_failures", "Storage calls that failed for good, by reason",
                                ["backend", "op", "reason"], registry=registry)
        self.bytes = Counter("memq_storage_bytes", "Object bytes written (put) or read (get, get_range)",
                             ["backend", "op"], registry=registry)
        self.latency = Histogram("memq_storage_latency_seconds",
                                 "Duration of a storage call, retries and backoff included",
                                 ["backend", "op"], buckets=_LATENCY_BUCKETS, registry=registry)
