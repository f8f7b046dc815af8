"""Which read partition a keyed record goes to: Kafka's default partitioner.

A record is read from the partition its producer placed it in, on every topic, and readers
rely on "same key, same partition, in order" (stream processors keep per-key state per
partition; compaction keeps the latest record per key within each partition). memq's Producer
hashes the key as Kafka's Java clients do (murmur2 of the key bytes, sign bit cleared, modulo the
partitions; librdkafka's `murmur2_random`), so memq Producers and Kafka clients writing one topic
place a key alike (`murmur2` is the Java one: the tests hold Kafka's vectors and kafka-python's).
A record without a key is not placed (-1): the broker puts it in its batch's partition.

Cost: a key's hash is ~1.5 us of Python (kafka-python's murmur2 ~2.5 us), and keys recur (entity
ids), so the last `HASHES_KEPT` keys' hashes are kept (~0.1 us a hit).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from itertools import groupby

_M = 0x5BD1E995
_WORDS: dict[int, struct.Struct] = {}
HASHES_KEPT = 65_536
_hashes: dict[bytes, int] = {}


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of `data` (`org.apache.kafka.common.utils.Utils.murmur2`) as an unsigned 32-bit int."""
    length = len(data)
    h = 0x9747B28C ^ length
    n4 = length >> 2
    if n4:
        words = _WORDS.get(n4)
        if words is None:
            words = _WORDS[n4] = struct.Struct("<%dI" % n4)
        for k in words.unpack_from(data):
            k = (k * _M) & 0xFFFFFFFF
            k ^= k >> 24
            h = ((h * _M) & 0xFFFFFFFF) ^ ((k * _M) & 0xFFFFFFFF)
    rest = length & 3
    if rest:
        i = n4 << 2
        if rest == 3:
            h ^= data[i + 2] << 16
        if rest >= 2:
            h ^= data[i + 1] << 8
        h = ((h ^ data[i]) * _M) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * _M) & 0xFFFFFFFF
    return h ^ (h >> 15)


def key_partition(key: bytes, partitions: int) -> int:
    """The read partition of `key` among `partitions`, as Kafka's default partitioner picks it."""
    h = _hashes.get(key)
    if h is None:
        if len(_hashes) >= HASHES_KEPT:
            _hashes.clear()
        h = _hashes[key] = murmur2(key) & 0x7FFFFFFF
    return h % partitions


def runs(keys: Sequence[bytes | None], partitions: int) -> Iterator[tuple[int, int, int]]:
    """(start, end, partition) of each run of consecutive keys placed in one partition, in order
    (-1 for a run of records without a key)."""
    start = 0
    for partition, run in groupby(-1 if k is None else key_partition(k, partitions) for k in keys):
        end = start + sum(1 for _ in run)
        yield start, end, partition
        start = end
