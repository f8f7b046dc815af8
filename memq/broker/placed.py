"""A compacted topic of several read partitions on a broker: one TopicProcessor per partition.

Compaction keeps the latest record per key within each notification partition, so a key's
records must all go to one partition. Kafka's clients choose it (their partitioner hashes the
key) and memq's Producer does the same (murmur2, as Kafka's default partitioner): each request
names its partition, and its Message goes to that partition's processor, whose batches are
published there. The processors of one topic share its storage group writer: parts of several
partitions may share an object. A topic that is not compacted keeps one processor and Kafka's
partitioner (no lookup per Message).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from memq.config import TopicConfig

from .processor import TopicProcessor


class PlacedTopic:
    """The per-partition processors of one compacted topic (`lanes[p].partition == p`)."""

    def __init__(self, lanes: Sequence[TopicProcessor]) -> None:
        self._lanes = tuple(lanes)

    @property
    def config(self) -> TopicConfig:
        return self._lanes[0].config

    @property
    def notification_topic(self) -> str:
        return self._lanes[0].notification_topic

    def lane(self, partition: int) -> TopicProcessor | None:
        """The processor of `partition`; None when the topic has no such partition."""
        return self._lanes[partition] if 0 <= partition < len(self._lanes) else None

    async def close(self) -> None:
        """Close every partition's processor (each seals, stores and acks what it holds)."""
        await asyncio.gather(*(lane.close() for lane in self._lanes))
