"""Metadata v9-12 (flexible, with topic ids), for clients that address topics by id (share consumers).

A memq topic's Kafka topic id is a UUID derived from the cluster and topic names, so every
broker answers the same id with nothing stored, and a topic deleted and created again under
the same name keeps it (its records' offsets are a function of where they are, too).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from .flexible import FlexReader, FlexWriter
from .protocol import ErrorCode, Node, TopicPartitions

_NAMESPACE = uuid.UUID("6d656d71-0000-4000-8000-6b61666b6121")   # memq's, fixed forever
UNKNOWN_TOPIC_ID = 100
NO_TOPIC_ID = uuid.UUID(int=0)


def topic_id(cluster: str, topic: str) -> uuid.UUID:
    """The stable Kafka topic id of `topic` in `cluster`."""
    return uuid.uuid5(_NAMESPACE, f"{cluster}/{topic}")


@dataclass(frozen=True, slots=True)
class FlexMetadataRequest:
    names: tuple[str, ...] | None         # None: every topic
    ids: tuple[uuid.UUID, ...] = ()        # topics asked for by id (v10+)


def decode_metadata_flex(version: int, r: FlexReader) -> FlexMetadataRequest:
    n = r.compact_count(nullable=True)
    names: list[str] = []
    ids: list[uuid.UUID] = []
    for _ in range(max(n, 0)):
        tid = r.uuid() if version >= 10 else NO_TOPIC_ID
        name = r.compact_nullable_string()
        r.skip_tags()
        if name is not None:
            names.append(name)
        elif tid != NO_TOPIC_ID:
            ids.append(tid)
    r.i8()   # allow auto topic creation: never
    if version <= 10:
        r.i8()   # include cluster authorized operations
    r.i8()       # include topic authorized operations
    r.skip_tags()
    # No r.done(): librdkafka 2.16 sends a request for every topic with its null topic array
    # left as a 4-byte placeholder (00 00 00 00, then the fields), so 3 bytes follow the last
    # field; Kafka's brokers ignore bytes after a request's fields, and so does this one.
    return FlexMetadataRequest(None if n < 0 else tuple(names), tuple(ids))


def encode_metadata_flex(version: int, correlation_id: int, brokers: list[Node], cluster: str, controller: int,
                         topics: list[TopicPartitions], unknown_ids: tuple[uuid.UUID, ...] = ()) -> bytes:
    w = FlexWriter(correlation_id).i32(0).count(len(brokers))
    for b in brokers:
        w.i32(b.node_id).string(b.host).i32(b.port).string(b.rack).tags()
    w.string(cluster).i32(controller).count(len(topics) + len(unknown_ids))
    for t in topics:
        w.i16(t.error).string(t.name)
        if version >= 10:
            w.uuid(topic_id(cluster, t.name) if t.error == ErrorCode.NONE else NO_TOPIC_ID)
        w.i8(0).count(len(t.leaders))   # is_internal
        for index, leader in enumerate(t.leaders):
            w.i16(ErrorCode.NONE).i32(index).i32(leader).i32(-1)   # leader epoch: unknown
            w.count(1).i32(leader).count(1).i32(leader).count(0).tags()   # replicas, isr, offline
        w.i32(-2147483648).tags()   # topic authorized operations: not computed
    for tid in unknown_ids:
        w.i16(UNKNOWN_TOPIC_ID).string(None).uuid(tid).i8(0).count(0).i32(-2147483648).tags()
    if version <= 10:
        w.i32(-2147483648)   # cluster authorized operations
    return w.tags().frame()
