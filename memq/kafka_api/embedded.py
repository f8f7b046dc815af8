"""The consumer's embedded protocol, sans I/O: what a classic member of protocol type `consumer`
puts in its JoinGroup metadata (ConsumerProtocolSubscription: topics, owned partitions, rack) and
gets back in its SyncGroup assignment (ConsumerProtocolAssignment).

The coordinator reads them only when a classic member's partitions are its own to decide: in a
consumer group (KIP-848's online migration, `memq.broker.group.migration`), where the server-side
assignor, not a leader, assigns. kafka-python's codec of Kafka's schemas does the bytes; a newer
version than it knows is read as its newest, as Kafka's own reader does.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

from memq.errors import ProtocolError

TP = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Subscription:
    topics: tuple[str, ...]
    owned: frozenset[TP]    # v1+ (cooperative clients); an eager client owns nothing when it joins
    rack: str | None = None


def subscription(metadata: bytes) -> Subscription:
    """A JoinGroup protocol's metadata; ProtocolError on bytes that do not parse."""
    try:
        s = ConsumerProtocolSubscription.decode(bytes(metadata))
        owned = frozenset((t.topic, p) for t in (getattr(s, "owned_partitions", None) or []) for p in t.partitions)
        return Subscription(tuple(s.topics or ()), owned, getattr(s, "rack_id", None))
    except Exception as e:   # kafka-python raises struct, value and index errors on bad bytes
        raise ProtocolError(f"consumer protocol subscription does not parse: {type(e).__name__}: {e}") from None


def version(metadata: bytes) -> int:
    """The embedded protocol's version a member speaks (its metadata's first two bytes), at most
    the newest kafka-python writes."""
    if len(metadata) < 2:
        raise ProtocolError("consumer protocol metadata shorter than its version")
    return min(max(int.from_bytes(metadata[:2], "big", signed=True), 0), ConsumerProtocolAssignment.max_version)


def assignment(tps: frozenset[TP], at_version: int) -> bytes:
    """`tps` as a SyncGroup assignment of embedded protocol version `at_version`."""
    by: dict[str, list[int]] = {}
    for t, p in sorted(tps):
        by.setdefault(t, []).append(p)
    parts = [ConsumerProtocolAssignment.TopicPartition(topic=t, partitions=ps) for t, ps in by.items()]
    return bytes(ConsumerProtocolAssignment(version=at_version, assigned_partitions=parts,
                                            user_data=None).encode())


def assigned(raw: bytes) -> frozenset[TP]:
    """The partitions of a SyncGroup assignment (empty bytes: none)."""
    if not raw:
        return frozenset()
    try:
        a = ConsumerProtocolAssignment.decode(bytes(raw))
        return frozenset((t.topic, p) for t in a.assigned_partitions or [] for p in t.partitions)
    except Exception as e:
        raise ProtocolError(f"consumer protocol assignment does not parse: {type(e).__name__}: {e}") from None
