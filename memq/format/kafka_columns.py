"""Kafka RecordBatch v2 records straight to Arrow columns, for readers that want columns (Spark).

`decode_kafka_records` builds a LogMessage (and its bytes) per record in a Python loop, ~7 us
a record. Here no Python step runs per record: one compiled walk (`kafka_walk`) over all the
batches of an object locates every field of every record (`spans.SpanColumns`: values, keys
and header fields become Arrow arrays copied once out of the decompressed buffer). Layout,
null handling and what is corrupt as in `kafka_records`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import zstandard

from memq.errors import CorruptDataError
from memq.format.kafka_records import (KAFKA_BATCH_HEADER_SIZE, KafkaBatchHeader, decode_raw_records,
                                       decompress_records, verify_kafka_batch)

if TYPE_CHECKING:
    from memq.format.spans import SpanColumns

Buffer = bytes | bytearray | memoryview

_GROUP_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class KafkaRecords:
    """One verified, decompressed batch; its records are located later, with all of an
    object's batches at once."""

    header: KafkaBatchHeader
    raw: bytes

    def __len__(self) -> int:
        return self.header.count


def split_kafka_records(buf: Buffer, zstd: zstandard.ZstdDecompressor | None = None) -> KafkaRecords:
    """Verify one whole batch and decompress it (with the reader's reused `zstd` context)."""
    header = verify_kafka_batch(buf)
    return KafkaRecords(header, bytes(decompress_records(header.codec, memoryview(buf)[KAFKA_BATCH_HEADER_SIZE:], zstd)))


def decode_kafka_columns(buf: Buffer) -> SpanColumns:
    """Verify one whole batch, decompress it and locate every field of every record;
    CorruptDataError where `decode_kafka_records` would raise one."""
    return locate_kafka_columns([split_kafka_records(buf)])[0]


def locate_kafka_columns(batches: Sequence[KafkaRecords]) -> list[SpanColumns]:
    """Every field of every record of `batches`, located in one compiled walk over them all
    (`kafka_walk`), at most _GROUP_BYTES of records per walk (int32 Arrow offsets)."""
    out: list[SpanColumns] = []
    group: list[KafkaRecords] = []
    size = 0
    for b in batches:
        if group and size + len(b.raw) > _GROUP_BYTES:
            out += _locate(group)
            group, size = [], 0
        group.append(b)
        size += len(b.raw)
    return out + (_locate(group) if group else [])


def _locate(batches: Sequence[KafkaRecords]) -> list[SpanColumns]:
    from memq.format import kafka_walk as kw   # numba: imported by the readers that need it
    from memq.format.spans import Spans, SpanColumns

    raw = b"".join(b.raw for b in batches)
    starts = np.cumsum([0] + [len(b.raw) for b in batches], dtype=np.int64)
    counts = np.array([b.header.count for b in batches], np.int64)
    records = np.empty((kw.RECORD_COLUMNS, int(counts.sum())), np.int64)
    u8 = np.frombuffer(raw, np.uint8)
    headers = np.empty((kw.HEADER_COLUMNS, records.shape[1]), np.int64)   # room for one header a record
    status, found, i = kw.walk(u8, starts, counts, records, headers)
    if status == kw.MORE_HEADERS:
        headers = np.empty((kw.HEADER_COLUMNS, found), np.int64)
        status, found, i = kw.walk(u8, starts, counts, records, headers)
    if status == kw.FAILED:
        bad = batches[found]
        decode_raw_records(bad.raw, bad.header)    # raises the record decoder's CorruptDataError
        raise CorruptDataError(f"Kafka record {i} of {bad.header.count} does not decode")
    headers = headers[:, :found]
    for length in (records[kw.VALUE_LEN], headers[kw.HVALUE_LEN]):
        np.maximum(length, 0, out=length)      # a null value reads as b"", as in `kafka_records`
    offsets = np.zeros(records.shape[1] + 1, np.int64)
    np.cumsum(records[kw.HEADER_COUNT], out=offsets[1:])
    first = np.cumsum([0] + [len(b) for b in batches])   # each batch's first record
    no_ids = Spans(np.zeros(records.shape[1], np.int64), np.full(records.shape[1], -1, np.int64))   # Kafka has none
    out = []
    for b, lo, hi in zip(batches, first, first[1:]):
        h_lo, h_hi = offsets[lo], offsets[hi]
        rec, hdr = records[:, lo:hi], headers[:, h_lo:h_hi]
        out.append(SpanColumns(raw, Spans(rec[kw.VALUE_START], rec[kw.VALUE_LEN]),
                               Spans(rec[kw.KEY_START], rec[kw.KEY_LEN]), _timestamps(b.header, rec[kw.TS_DELTA]),
                               no_ids[lo:hi], (offsets[lo:hi + 1] - h_lo).astype(np.int32),
                               Spans(hdr[kw.HKEY_START], hdr[kw.HKEY_LEN]),
                               Spans(hdr[kw.HVALUE_START], hdr[kw.HVALUE_LEN]), header_keys_utf8=False))
    return out


def _timestamps(header: KafkaBatchHeader, deltas: np.ndarray) -> np.ndarray:
    if header.log_append_time:
        return np.full(len(deltas), header.max_timestamp_ms, np.int64)
    return deltas + header.base_timestamp_ms
