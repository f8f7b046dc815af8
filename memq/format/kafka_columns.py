"""Kafka RecordBatch v2 records straight to Arrow columns, for readers that want columns (Spark).

`decode_kafka_records` builds a LogMessage (and its bytes) per record in a Python loop, ~7 us
a record. Here the only per-record Python step is following the records' length prefixes
(one varint each) to find where each starts; every field after it is decoded for all records
at once with numpy (a varint is at most 10 bytes, so a few vector passes decode them all),
in one pass over all the batches of an object, and values, keys and header fields become
Arrow arrays over the decompressed buffer (one `take` copies the bytes out). Layout and null
handling as in `kafka_records`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import zstandard

from memq.errors import CorruptDataError
from memq.format.arrow_body import _pyarrow
from memq.format.kafka_records import (KAFKA_BATCH_HEADER_SIZE, KafkaBatchHeader, decompress_records,
                                       verify_kafka_batch)

if TYPE_CHECKING:
    import pyarrow as pa

Buffer = bytes | bytearray | memoryview

_GROUP_BYTES = 1 << 30
_PAD = 10           # bytes of zeros after the records, so a varint read near the end stays in the array
_MAX_VARINT = 10


@dataclass(frozen=True, slots=True)
class _Spans:
    """Byte ranges [start, start + length) in the records buffer; length -1 = null."""

    start: np.ndarray
    length: np.ndarray

    def __getitem__(self, rows: slice) -> _Spans:
        return _Spans(self.start[rows], self.length[rows])


@dataclass(frozen=True, slots=True)
class KafkaColumns:
    """One batch's records as located fields; `column` builds a LogMessage field's Arrow array."""

    data: bytes                  # the records of one or more batches, decompressed
    timestamps: np.ndarray
    keys: _Spans
    values: _Spans
    header_offsets: np.ndarray   # int32, records + 1: record i's headers are items [o[i], o[i+1])
    header_keys: _Spans
    header_values: _Spans

    def __len__(self) -> int:
        return len(self.timestamps)

    def column(self, name: str) -> pa.Array:
        """The field as the Arrow type `arrow_body.body_schema()` gives it."""
        pa = _pyarrow()
        if name == "value":
            return self._binary(self.values, pa.binary(), null_as_empty=True)
        if name == "key":
            return self._binary(self.keys, pa.binary(), null_as_empty=False)
        if name == "timestamp_ms":
            return pa.array(self.timestamps)
        if name == "headers":
            keys = self._binary(self.header_keys, pa.string(), null_as_empty=False)
            try:
                keys.validate(full=True)
            except pa.ArrowInvalid as exc:
                raise CorruptDataError(f"Kafka record header key is not UTF-8: {exc}") from exc
            values = self._binary(self.header_values, pa.binary(), null_as_empty=True)
            item = pa.struct([pa.field("key", pa.string(), nullable=False),
                              pa.field("value", pa.binary(), nullable=False)])
            items = pa.StructArray.from_arrays([keys, values], fields=list(item))
            return pa.ListArray.from_arrays(pa.array(self.header_offsets), items,
                                            type=pa.list_(pa.field("item", item, nullable=False)))
        if name == "message_id":
            return pa.nulls(len(self), pa.binary())
        raise KeyError(name)

    def _binary(self, spans: _Spans, typ: pa.DataType, *, null_as_empty: bool) -> pa.Array:
        """The spans as one array: an array over the whole buffer whose elements alternate
        span / gap to the next span (offsets need only be non-decreasing), then `take` of the spans."""
        pa = _pyarrow()
        n = len(spans.start)
        if n == 0:
            return pa.array([], typ)
        ends = spans.start + np.maximum(spans.length, 0)
        offsets = np.empty(2 * n + 1, np.int32)
        offsets[0:2 * n:2] = spans.start
        offsets[1:2 * n:2] = ends
        offsets[2 * n] = ends[-1]
        validity = None
        if not null_as_empty and (spans.length < 0).any():
            valid = np.ones(2 * n, bool)
            valid[0::2] = spans.length >= 0
            validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
        whole = pa.Array.from_buffers(typ, 2 * n, [validity, pa.py_buffer(offsets), pa.py_buffer(self.data)])
        return whole.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int32)))


@dataclass(frozen=True, slots=True)
class KafkaRecords:
    """One verified, decompressed batch and where each record's length prefix is; the
    prefixes and every field are decoded later, for all of an object's batches at once."""

    header: KafkaBatchHeader
    raw: bytes
    prefixes: np.ndarray     # int64: where each record (its length varint) starts in `raw`

    def __len__(self) -> int:
        return len(self.prefixes)


def split_kafka_records(buf: Buffer, zstd: zstandard.ZstdDecompressor | None = None) -> KafkaRecords:
    """Verify one whole batch, decompress it (with the reader's reused `zstd` context) and
    find where each record starts."""
    header = verify_kafka_batch(buf)
    raw = bytes(decompress_records(header.codec, memoryview(buf)[KAFKA_BATCH_HEADER_SIZE:], zstd))
    return KafkaRecords(header, raw, _record_prefixes(raw, header.count))


def decode_kafka_columns(buf: Buffer) -> KafkaColumns:
    """Verify one whole batch, decompress it and locate every field of every record;
    CorruptDataError where `decode_kafka_records` would raise one."""
    return locate_kafka_columns([split_kafka_records(buf)])[0]


def locate_kafka_columns(batches: Sequence[KafkaRecords]) -> list[KafkaColumns]:
    """Every field of every record of `batches`, located in one numpy pass over them all (a
    pass costs ~100 numpy calls whatever its size: once per object, not once per Message)."""
    out: list[KafkaColumns] = []
    group: list[KafkaRecords] = []
    size = 0
    for b in batches:     # int32 Arrow offsets: at most _GROUP_BYTES of records per pass
        if group and size + len(b.raw) > _GROUP_BYTES:
            out += _locate(group)
            group, size = [], 0
        group.append(b)
        size += len(b.raw)
    return out + (_locate(group) if group else [])


def _locate(batches: Sequence[KafkaRecords]) -> list[KafkaColumns]:
    sizes = [len(b.raw) for b in batches]
    shift = np.cumsum([0] + sizes)
    raw = b"".join([*(b.raw for b in batches), bytes(_PAD)])   # padded: see _PAD
    first = np.cumsum([0] + [len(b) for b in batches])   # each batch's first record
    prefixes = np.concatenate([b.prefixes + at for b, at in zip(batches, shift)])
    batch_ends = np.repeat(shift[1:], np.diff(first))
    u8 = np.frombuffer(raw, np.uint8)
    lengths, starts = _varints(u8, prefixes, batch_ends, "length")
    if (lengths < 0).any():
        i = int(np.flatnonzero(lengths < 0)[0])
        n = int(np.searchsorted(first, i, side="right")) - 1
        raise CorruptDataError(f"Kafka record {i - first[n]} length {int(lengths[i])} is negative")
    ends = starts + lengths     # = the next prefix, and the batch's end for its last: `_record_prefixes`
    pos = starts + 1                                   # record attributes: unused by Kafka
    deltas, pos = _varints(u8, pos, ends, "timestamp delta")
    _, pos = _varints(u8, pos, ends, "offset delta")   # memq positions are per batch, not per record
    keys, pos = _field(u8, pos, ends, "key")
    values, pos = _field(u8, pos, ends, "value")
    counts, pos = _varints(u8, pos, ends, "header count")
    if (counts < 0).any() or (counts > ends - pos).any():
        raise CorruptDataError("Kafka record header count is impossible here")
    offsets = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    hk_start, hk_len, hv_start, hv_len = (np.zeros(int(offsets[-1]), np.int64) for _ in range(4))
    for j in range(int(counts.max(initial=0))):         # the j-th header of every record that has one
        rows = np.flatnonzero(counts > j)
        at = offsets[rows] + j
        hkey, pos[rows] = _field(u8, pos[rows], ends[rows], "header key")
        if (hkey.length < 0).any():
            raise CorruptDataError("Kafka record header key is null")
        hval, pos[rows] = _field(u8, pos[rows], ends[rows], "header value")
        hk_start[at], hk_len[at], hv_start[at], hv_len[at] = hkey.start, hkey.length, hval.start, hval.length
    if (pos != ends).any():
        i = int(np.flatnonzero(pos != ends)[0])
        n = int(np.searchsorted(first, i, side="right")) - 1
        raise CorruptDataError(f"Kafka record {i - first[n]} is {ends[i] - starts[i]} bytes but its fields take "
                               f"{pos[i] - starts[i]}")
    out = []
    for b, lo, hi in zip(batches, first, first[1:]):
        h_lo, h_hi = offsets[lo], offsets[hi]
        out.append(KafkaColumns(raw, _timestamps(b.header, deltas[lo:hi]), keys[lo:hi], values[lo:hi],
                                (offsets[lo:hi + 1] - h_lo).astype(np.int32),
                                _Spans(hk_start[h_lo:h_hi], hk_len[h_lo:h_hi]),
                                _Spans(hv_start[h_lo:h_hi], hv_len[h_lo:h_hi])))
    return out


def _timestamps(header: KafkaBatchHeader, deltas: np.ndarray) -> np.ndarray:
    if header.log_append_time:
        return np.full(len(deltas), header.max_timestamp_ms, np.int64)
    return deltas + header.base_timestamp_ms


def _record_prefixes(raw: bytes, count: int) -> np.ndarray:
    """Where each of the `count` records starts: the one per-record Python loop, since where a
    record starts depends on every length before it. It only follows the length prefixes
    (1- and 2-byte ones inline: records up to 8 KiB); `_locate` decodes and checks them
    for all records at once (a negative length, skipped here as its magnitude, fails there)."""
    at: list[int] = []
    append = at.append
    pos = 0
    try:
        for _ in range(count):
            append(pos)
            b = raw[pos]
            if b < 0x80:
                pos += 1 + (b >> 1)
            elif raw[pos + 1] < 0x80:
                pos += 2 + (((b & 0x7F) | raw[pos + 1] << 7) >> 1)
            else:
                zigzag, pos = _long_varint(raw, pos)
                pos += zigzag >> 1
    except IndexError:
        raise CorruptDataError(f"Kafka batch ends inside record {len(at) - 1} of {count}") from None
    if pos != len(raw):
        raise CorruptDataError(f"Kafka batch records end at byte {pos}, the batch at {len(raw)}")
    return np.array(at, np.int64)


def _long_varint(raw: bytes, pos: int) -> tuple[int, int]:
    """A varint of 3 or more bytes at `pos`, zigzag-encoded as stored, and the position after it."""
    acc = shift = 0
    while True:
        b = raw[pos]
        pos += 1
        acc |= (b & 0x7F) << shift
        if not b & 0x80:
            return acc, pos
        shift += 7
        if shift > 63:
            raise CorruptDataError("Kafka varint longer than 10 bytes")


def _varints(u8: np.ndarray, pos: np.ndarray, ends: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    """The zigzag varint at each `pos`, and the position after it; each must end by its `ends`."""
    if (pos >= ends).any():
        raise CorruptDataError(f"Kafka record truncated before its {what}")
    b = u8[pos]
    acc = (b & 0x7F).astype(np.uint64)
    after = pos + 1
    going = np.flatnonzero(b >= 0x80)
    k = 1
    while len(going):
        if k == _MAX_VARINT:
            raise CorruptDataError("Kafka varint longer than 10 bytes")
        b = u8[after[going]]
        acc[going] |= (b & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        after[going] += 1
        going = going[b >= 0x80]
        k += 1
    if (after > ends).any():
        raise CorruptDataError(f"Kafka record truncated inside its {what}")
    return ((acc >> np.uint64(1)) ^ -(acc & np.uint64(1))).view(np.int64), after


def _field(u8: np.ndarray, pos: np.ndarray, ends: np.ndarray, what: str) -> tuple[_Spans, np.ndarray]:
    """A length-prefixed (-1 = null) field at each `pos`, and the position after it."""
    length, pos = _varints(u8, pos, ends, f"{what} length")
    if (length < -1).any():
        raise CorruptDataError(f"Kafka record {what} length {int(length.min())}")
    after = pos + np.maximum(length, 0)
    if (after > ends).any():
        raise CorruptDataError(f"Kafka record {what} overruns the record")
    return _Spans(pos, length), after
