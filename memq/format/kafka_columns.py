"""Kafka RecordBatch v2 records straight to Arrow columns, for readers that want columns (Spark).

`decode_kafka_records` builds a LogMessage (and its bytes) per record in a Python loop, ~7 us
a record. Here no Python step runs per record: one compiled walk (`kafka_walk`) over all the
batches of an object locates every field of every record, and values, keys and header fields
become Arrow arrays over the decompressed buffer (`spans.binary_array` copies the bytes out). Layout,
null handling and what is corrupt as in `kafka_records`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import zstandard

from memq.errors import CorruptDataError
from memq.format.arrow_body import _pyarrow
from memq.format.kafka_records import (KAFKA_BATCH_HEADER_SIZE, KafkaBatchHeader, decode_raw_records,
                                       decompress_records, verify_kafka_batch)

if TYPE_CHECKING:
    import pyarrow as pa

    from memq.format.spans import Spans

Buffer = bytes | bytearray | memoryview

_GROUP_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class KafkaColumns:
    """One batch's records as located fields; `column` builds a LogMessage field's Arrow array."""

    data: bytes                  # the records of one or more batches, decompressed
    timestamps: np.ndarray
    keys: Spans
    values: Spans
    header_offsets: np.ndarray   # int32, records + 1: record i's headers are items [o[i], o[i+1])
    header_keys: Spans
    header_values: Spans

    def __len__(self) -> int:
        return len(self.timestamps)

    def column(self, name: str) -> pa.Array:
        """The field as the Arrow type `arrow_body.body_schema()` gives it."""
        from memq.format.spans import binary_array   # numba: imported by the readers that need it

        pa = _pyarrow()
        if name == "value":
            return binary_array(self.values, self.data, pa.binary(), null_as_empty=True)
        if name == "key":
            return binary_array(self.keys, self.data, pa.binary(), null_as_empty=False)
        if name == "timestamp_ms":
            return pa.array(self.timestamps)
        if name == "headers":
            keys = binary_array(self.header_keys, self.data, pa.string(), null_as_empty=False)
            try:
                keys.validate(full=True)
            except pa.ArrowInvalid as exc:
                raise CorruptDataError(f"Kafka record header key is not UTF-8: {exc}") from exc
            values = binary_array(self.header_values, self.data, pa.binary(), null_as_empty=True)
            item = pa.struct([pa.field("key", pa.string(), nullable=False),
                              pa.field("value", pa.binary(), nullable=False)])
            items = pa.StructArray.from_arrays([keys, values], fields=list(item))
            return pa.ListArray.from_arrays(pa.array(self.header_offsets), items,
                                            type=pa.list_(pa.field("item", item, nullable=False)))
        if name == "message_id":
            return pa.nulls(len(self), pa.binary())
        raise KeyError(name)


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


def decode_kafka_columns(buf: Buffer) -> KafkaColumns:
    """Verify one whole batch, decompress it and locate every field of every record;
    CorruptDataError where `decode_kafka_records` would raise one."""
    return locate_kafka_columns([split_kafka_records(buf)])[0]


def locate_kafka_columns(batches: Sequence[KafkaRecords]) -> list[KafkaColumns]:
    """Every field of every record of `batches`, located in one compiled walk over them all
    (`kafka_walk`), at most _GROUP_BYTES of records per walk (int32 Arrow offsets)."""
    out: list[KafkaColumns] = []
    group: list[KafkaRecords] = []
    size = 0
    for b in batches:
        if group and size + len(b.raw) > _GROUP_BYTES:
            out += _locate(group)
            group, size = [], 0
        group.append(b)
        size += len(b.raw)
    return out + (_locate(group) if group else [])


def _locate(batches: Sequence[KafkaRecords]) -> list[KafkaColumns]:
    from memq.format import kafka_walk as kw   # numba: imported by the readers that need it
    from memq.format.spans import Spans

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
    offsets = np.zeros(records.shape[1] + 1, np.int64)
    np.cumsum(records[kw.HEADER_COUNT], out=offsets[1:])
    first = np.cumsum([0] + [len(b) for b in batches])   # each batch's first record
    out = []
    for b, lo, hi in zip(batches, first, first[1:]):
        h_lo, h_hi = offsets[lo], offsets[hi]
        rec, hdr = records[:, lo:hi], headers[:, h_lo:h_hi]
        out.append(KafkaColumns(raw, _timestamps(b.header, rec[kw.TS_DELTA]),
                                Spans(rec[kw.KEY_START], rec[kw.KEY_LEN]),
                                Spans(rec[kw.VALUE_START], rec[kw.VALUE_LEN]),
                                (offsets[lo:hi + 1] - h_lo).astype(np.int32),
                                Spans(hdr[kw.HKEY_START], hdr[kw.HKEY_LEN]),
                                Spans(hdr[kw.HVALUE_START], hdr[kw.HVALUE_LEN])))
    return out


def _timestamps(header: KafkaBatchHeader, deltas: np.ndarray) -> np.ndarray:
    if header.log_append_time:
        return np.full(len(deltas), header.max_timestamp_ms, np.int64)
    return deltas + header.base_timestamp_ms
