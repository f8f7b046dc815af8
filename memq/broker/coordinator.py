"""Which broker coordinates a key: a transactional id (transactions) or a share group's id.

One rule for both, so every broker names the same coordinator without asking the others: a
CRC32C of the key over the ids of the brokers with a Kafka listener, sorted. FindCoordinator
answers with it; the coordinator's calls elsewhere are NOT_COORDINATOR (the client finds it
again), and COORDINATOR_NOT_AVAILABLE when no broker has a listener.
"""

from __future__ import annotations

from crc32c import crc32c

from memq.format.metadata import ClusterMetadata
from memq.kafka_api.protocol import ErrorCode


def coordinator_of(meta: ClusterMetadata, key: str) -> str | None:
    """The broker id coordinating `key`: a hash of it over the brokers with a Kafka listener,
    None when no broker has one."""
    ids = sorted(b.id for b in meta.brokers if b.kafka_address)
    return ids[crc32c(key.encode()) % len(ids)] if ids else None


def not_coordinator(meta: ClusterMetadata, key: str, broker_id: str) -> ErrorCode | None:
    """None if `broker_id` coordinates `key`; else NOT_COORDINATOR (another broker does) or
    COORDINATOR_NOT_AVAILABLE (none does)."""
    coordinator = coordinator_of(meta, key)
    if coordinator == broker_id:
        return None
    return ErrorCode.COORDINATOR_NOT_AVAILABLE if coordinator is None else ErrorCode.NOT_COORDINATOR
