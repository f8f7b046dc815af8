"""How Kafka's model maps onto memq's: node ids, partition leaders, acks, producer ids, errors.

A Kafka topic is a memq topic and its partitions are the topic's read partitions. Partition
i's leader is the i-th (round robin) broker hosting the topic that has a Kafka listener; any
hosting broker accepts writes to any partition (each stores the records in the partition
the producer chose), so leaders only spread producers over the hosting brokers.

Kafka's idempotence state is per (producer id, partition) with the sequence advancing by the
record count; memq's is per (producer id, topic) advancing by one per Message. Folding the
partition into memq's producer id keeps two partitions' sequences from colliding; the jumps
by record count are harmless because memq's de-duplication only compares ids for equality
(the broker's recent-Message set, readers' windows), never for gaps.
"""

from __future__ import annotations

from crc32c import crc32c

from memq.errors import ConfigError
from memq.format.metadata import ClusterMetadata
from memq.format.wire import AckCode, AckLevel

from .protocol import ErrorCode, Node, TopicPartitions

_U64 = (1 << 64) - 1
_PARTITION_BITS = 16
#: Bits of the producer ids InitProducerId hands out: they fit a Kafka i64 and, shifted by the
#: partition bits, memq's u64 (random per producer: no coordination between brokers).
PRODUCER_ID_BITS = 47

_ACKS = {0: AckLevel.NONE, 1: AckLevel.LEADER, -1: AckLevel.ALL}

_ERRORS = {
    AckCode.OK: ErrorCode.NONE,
    AckCode.BUSY: ErrorCode.REQUEST_TIMED_OUT,          # retriable: the client backs off and resends
    AckCode.NOT_HERE: ErrorCode.NOT_LEADER_OR_FOLLOWER,  # the client re-reads metadata
    AckCode.CLOSING: ErrorCode.NOT_LEADER_OR_FOLLOWER,
    AckCode.UNKNOWN_TOPIC: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    AckCode.CORRUPT: ErrorCode.CORRUPT_MESSAGE,
    AckCode.TOO_LARGE: ErrorCode.MESSAGE_TOO_LARGE,
    AckCode.STORAGE: ErrorCode.KAFKA_STORAGE_ERROR,      # retriable in Kafka as in memq
    AckCode.NOTIFY: ErrorCode.KAFKA_STORAGE_ERROR,
    AckCode.PROTOCOL: ErrorCode.INVALID_REQUEST,
    AckCode.DENIED: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
}


def ack_level(acks: int) -> AckLevel | None:
    """memq's ack level for Kafka's `acks` (0, 1, -1 = all); None for any other value."""
    return _ACKS.get(acks)


def error_code(code: str) -> ErrorCode:
    return _ERRORS.get(AckCode(code), ErrorCode.UNKNOWN_SERVER_ERROR)


def memq_producer_id(kafka_producer_id: int, partition: int) -> int:
    """memq's producer id for one Kafka (producer, partition) pair (see the module docstring)."""
    return ((kafka_producer_id << _PARTITION_BITS) | (partition & ((1 << _PARTITION_BITS) - 1))) & _U64


def node_id(broker_id: str) -> int:
    """A stable Kafka node id (i32 >= 0) for a memq broker id."""
    return crc32c(broker_id.encode()) & 0x7FFFFFFF


def split_address(address: str) -> tuple[str, int]:
    """("host", port) of a "host:port" Kafka listener address."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"Kafka listener address {address!r}: want host:port")
    return host, int(port)


def metadata_view(meta: ClusterMetadata, requested: tuple[str, ...] | None
                  ) -> tuple[list[Node], list[TopicPartitions]]:
    """The brokers with a Kafka listener as nodes, and the requested topics (None: all) with
    their partition leaders; a topic in `meta.refused` is TOPIC_AUTHORIZATION_FAILED."""
    nodes: dict[str, Node] = {}
    for b in meta.brokers:
        if b.kafka_address:
            host, port = split_address(b.kafka_address)
            nodes[b.url] = Node(node_id(b.id), host, port, b.rack or None)
    topics = []
    for name in (sorted(meta.topics) if requested is None else requested):
        t = meta.topics.get(name)
        if name in meta.refused:   # existing or not: the same answer
            topics.append(TopicPartitions(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
            continue
        if t is None:
            topics.append(TopicPartitions(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
            continue
        hosts = [nodes[url].node_id for url in t.brokers if url in nodes]
        if not hosts:
            topics.append(TopicPartitions(name, ErrorCode.LEADER_NOT_AVAILABLE))
            continue
        topics.append(TopicPartitions(name, leaders=tuple(hosts[i % len(hosts)] for i in range(t.read_partitions))))
    return list(nodes.values()), topics
