"""Kafka's view of a compacted topic (pure): its compacted batches placed in a Fetch, and which
records a producer may not write to one. (Its log start and end are the partition log's answers:
`memq.log.model`.)

A compacted part's RecordBatches carry their records' original offsets (`memq.compaction.parts`),
so a Fetch copies them as stored (the partition leader epoch set to -1, unknown, as memq's
Metadata says; outside the CRC); a Kafka client skips the records below its fetch offset.

A compacted topic keeps the latest record per key, so a record without a key has no place in
it: Kafka refuses such a record (INVALID_RECORD), and so does memq's door. Seeing that means
reading the records' keys, the one exception to "the broker never decodes records", bounded to
compacted topics.
"""

from __future__ import annotations

from collections.abc import Iterable

from memq.format.kafka_records import (Buffer, KafkaCodec, decode_kafka_records, peek_kafka_batch,
                                       without_compression)

_EPOCH_AT = 12
_EPOCH_END = 16
_NO_EPOCH = b"\xff\xff\xff\xff"


def keyless_records(batches: Iterable[Buffer]) -> int:
    """How many records of these verified RecordBatches v2 have no key (a null key)."""
    return sum(1 for b in batches for r in decode_kafka_records(b) if r.key is None)


def place_batch(batch: Buffer, out: bytearray, limit: int, *, at_least_one: bool, zstd: bool) -> int | None:
    """Append one compacted RecordBatch to `out` if `out` stays within `limit` bytes (with
    `at_least_one` and `out` empty: whatever its size, KIP-74); zstd batches go decompressed to a
    reader whose Fetch predates zstd. The Kafka offset after its last record, None if it did not fit."""
    header = peek_kafka_batch(batch)
    data = without_compression(batch) if not zstd and header.codec is KafkaCodec.ZSTD else batch
    if (out or not at_least_one) and len(out) + len(data) > limit:
        return None
    view = memoryview(data)
    out += view[:_EPOCH_AT]
    out += _NO_EPOCH
    out += view[_EPOCH_END:]
    return header.base_offset + header.last_offset_delta + 1
