"""Prometheus metrics of storage calls, registered on a registry the caller passes in.

Built as an object (not module globals) so several handlers, or several test processes'
handlers, can live in one interpreter: share one `StorageMetrics` per registry.

Requests and bytes are labelled by topic (taken from the object key or listing prefix, see
`memq.storage.naming`), because a storage request is what S3 bills: `memq cost` prices these
counters per topic. A storage group's shared objects are labelled `group:<group>` (no topic
name holds ':'), and `memq cost` splits them over the group's topics by their bytes. Calls
that name no topic are counted under topic "".
"""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# `<pp>/<cluster>/topics/<topic>/` or `.../groups/<group>/`, anywhere in an s3:// URL, a key or a listing prefix.
_TOPIC_IN_KEY = re.compile(r"(?:^|/)[0-9a-f]{2}/[A-Za-z0-9._-]+/(topics|groups)/([A-Za-z0-9._-]+)/")
GROUP_LABEL = "group:"


def group_label(group: str) -> str:
    """The topic label of a storage group's objects in storage and janitor metrics."""
    return f"{GROUP_LABEL}{group}"


def topic_of(where: str) -> str:
    """The topic whose object key or listing prefix `where` names (`group:<g>` for a storage
    group's), or "" when it names none."""
    m = _TOPIC_IN_KEY.search(where)
    if m is None:
        return ""
    return m[2] if m[1] == "topics" else group_label(m[2])


class StorageMetrics:
    """Counters and latency per backend ("s3", "file") and operation (put, get, get_range, list, delete)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.attempts = Counter("memq_storage_attempts",
                                "Storage requests sent (each try counts), by topic of the key they touch",
                                ["backend", "op", "topic"], registry=registry)
        self.retries = Counter("memq_storage_retries", "Storage requests retried, by failure reason",
                               ["backend", "op", "reason"], registry=registry)
        self.failures = Counter("memq_storage_failures", "Storage calls that failed for good, by reason",
                                ["backend", "op", "reason"], registry=registry)
        self.bytes = Counter("memq_storage_bytes", "Object bytes written (put) or read (get, get_range), by topic",
                             ["backend", "op", "topic"], registry=registry)
        self.hedges = Counter("memq_storage_hedges",
                              "Hedged requests: second attempts sent after the usual latency (outcome=sent), "
                              "and those that answered first (outcome=won)", ["backend", "op", "outcome"],
                              registry=registry)
        self.latency = Histogram("memq_storage_latency_seconds",
                                 "Duration of a storage call, retries and backoff included",
                                 ["backend", "op"], buckets=_LATENCY_BUCKETS, registry=registry)

    def sent(self, backend: str, op: str, where: str) -> None:
        """Count one request (one try) of `op` on the object or prefix `where`."""
        self.attempts.labels(backend, op, topic_of(where)).inc()

    def moved(self, backend: str, op: str, where: str, nbytes: int) -> None:
        """Count `nbytes` object bytes written or read by `op` on `where`."""
        self.bytes.labels(backend, op, topic_of(where)).inc(nbytes)
