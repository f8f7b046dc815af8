"""Which read partition a keyed record goes to: Kafka's default partitioner.

A record is read from the partition its producer placed it in, on every topic, and readers
rely on "same key, same partition, in order" (stream processors keep per-key state per
partition; compaction keeps the latest record per key within each partition). memq's Producer
hashes the key as Kafka's Java clients do (murmur2 of the key bytes, sign bit cleared, modulo the
partitions; librdkafka's `murmur2_random`), so memq Producers and Kafka clients writing one topic
place a key alike. kafka-python's murmur2 is the Java one (its tests hold Kafka's vectors).
A record without a key is not placed (-1): the broker puts it in its batch's partition.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import groupby

from kafka.partitioner.default import murmur2


def key_partition(key: bytes, partitions: int) -> int:
    """The read partition of `key` among `partitions`, as Kafka's default partitioner picks it."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def runs(keys: Sequence[bytes | None], partitions: int) -> Iterator[tuple[int, int, int]]:
    """(start, end, partition) of each run of consecutive keys placed in one partition, in order
    (-1 for a run of records without a key)."""
    start = 0
    for partition, run in groupby(-1 if k is None else key_partition(k, partitions) for k in keys):
        end = start + sum(1 for _ in run)
        yield start, end, partition
        start = end
