"""Compacted parts: the survivors of compaction as an ordinary memq object (pure, no I/O).

A part is a memq Batch whose Messages are `Codec.KAFKA` Messages, each one Kafka RecordBatch v2
holding survivors in offset order with their ORIGINAL Kafka offsets, in the topic's scheme (sparse, or
a dense topic's record numbers: Kafka keeps offsets across compaction) (base offset + offset deltas:
a new RecordBatch wherever a delta would not fit an int32, or a RecordBatch is full), their
timestamps, keys, values (None: a tombstone) and headers. So a Kafka reader is served the
RecordBatches as stored, and memq's decoders read the Messages as they read any Codec.KAFKA one.
A survivor keeps the codec its record arrived in (a Kafka producer's batch codec; for memq's own
records the topic's framing codec, `kafka_compression`): a RecordBatch holds survivors of one
codec, so a reader never gets a codec it did not ask for (Kafka keeps a batch's codec too).

After the Batch, in the same object, a trailer (`PartIndex`) found by the manifest
(`PartRef.index_offset`, `index_size`): per Message its first Kafka offset (to seek by offset
with one ranged GET), and the key index: (64-bit key hash, Message number) sorted by hash,
12 bytes per survivor, to find a key's Message without reading the others.

Layout of the trailer (little-endian): magic "MQKI", version u8, 3 zero bytes, Message count
u32, key count u32, then the Messages' first offsets (i64 each), then the key entries (u64 hash,
u32 Message), then CRC32C u32 of every trailer byte before it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import zstandard
from crc32c import crc32c

from memq.errors import CorruptDataError, InvalidInputError
from memq.format.batch import BatchHeader, decode_batch_header, encode_batch, object_crc32c
from memq.format.codec import Codec, Compressors
from memq.format.kafka_columns import split_kafka_records
from memq.format.kafka_records import (KafkaCodec, decode_kafka_entries, decode_raw_records, encode_kafka_batch,
                                       peek_kafka_batch)
from memq.format.message import (MESSAGE_HEADER_SIZE, Buffer, MessageHeader, decode_message, decode_message_header,
                                 encode_kafka_message, verify_message)
from memq.format.records import gc_paused
from memq.storage.base import ObjectLocation

_TRAILER = struct.Struct("<4sB3xII")
_KEY_ENTRY = np.dtype([("hash", "<u8"), ("message", "<u4")])
_CRC = struct.Struct("<I")
TRAILER_MAGIC = b"MQKI"
TRAILER_VERSION = 1
#: Survivors per RecordBatch (one Message): a reader seeking an offset GETs at most one such Message.
RECORDS_PER_BATCH = 2000
_I32_MAX = 0x7FFFFFFF
#: Producer id of compacted Messages: the compactor (never a real producer's, so dedup ignores it).
COMPACTOR_PRODUCER_ID = 0


class Survivor(NamedTuple):
    """A record kept by compaction: its original Kafka offset and its fields as produced."""

    offset: int
    timestamp_ms: int
    key: bytes
    value: bytes | None          # None: a tombstone
    headers: tuple[tuple[str, bytes], ...] = ()
    codec: KafkaCodec = KafkaCodec.NONE   # the codec it arrived in, which its part's RecordBatch keeps

    @property
    def tombstone(self) -> bool:
        return self.value is None


def key_hash(key: bytes) -> int:
    """The 64-bit hash a key index sorts by (BLAKE2b: the same in every process and language)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


@dataclass(frozen=True, slots=True)
class PartRef:
    """One compacted part as a manifest lists it: where it is, what it holds."""

    bucket: str
    key: str
    size: int                    # bytes of the Batch at the object's start (what a record reader reads)
    header_size: int             # of the Batch header
    crc32c: int                  # of the Batch bytes [0, size)
    first_offset: int            # Kafka offset of its first survivor
    last_offset: int             # ... and of its last
    records: int
    tombstones: int
    min_timestamp_ms: int
    max_timestamp_ms: int
    index_offset: int            # where its trailer (`PartIndex`) starts in the object (== size)
    index_size: int

    @property
    def location(self) -> ObjectLocation:
        return ObjectLocation(self.bucket, self.key)

    @property
    def object_size(self) -> int:
        return self.index_offset + self.index_size


@dataclass(frozen=True, slots=True)
class EncodedPart:
    """A part ready to PUT: `chunks` (Batch, then trailer) and its description but for where it goes."""

    chunks: list[Buffer]
    size: int
    header_size: int
    crc32c: int
    first_offset: int
    last_offset: int
    records: int
    tombstones: int
    min_timestamp_ms: int
    max_timestamp_ms: int
    index_size: int

    def ref(self, loc: ObjectLocation) -> PartRef:
        """Its `PartRef` once stored at `loc`."""
        return PartRef(loc.bucket, loc.key, self.size, self.header_size, self.crc32c, self.first_offset,
                       self.last_offset, self.records, self.tombstones, self.min_timestamp_ms,
                       self.max_timestamp_ms, self.size, self.index_size)


class PartIndex:
    """A part's trailer decoded: which Message holds an offset, which may hold a key."""

    __slots__ = ("first_offsets", "_hashes", "_messages")

    def __init__(self, first_offsets: np.ndarray, keys: np.ndarray) -> None:
        self.first_offsets = first_offsets       # i64 per Message, increasing
        self._hashes = keys["hash"]
        self._messages = keys["message"]

    @property
    def message_count(self) -> int:
        return len(self.first_offsets)

    def message_for(self, offset: int) -> int:
        """The Message holding the first survivor at or after Kafka `offset` (message_count: none)."""
        i = int(np.searchsorted(self.first_offsets, offset, side="right")) - 1
        return max(i, 0)

    def messages_for_key(self, key: bytes) -> list[int]:
        """The Messages that may hold `key` (its hash's; usually one, none if absent)."""
        h = np.uint64(key_hash(key))
        lo = int(np.searchsorted(self._hashes, h, side="left"))
        hi = int(np.searchsorted(self._hashes, h, side="right"))
        return sorted({int(m) for m in self._messages[lo:hi]})

    def has_any(self, hashes: set[int]) -> bool:
        """Whether any of these key hashes is in the index (a key of them may be in the part)."""
        if not hashes or not len(self._hashes):
            return False
        return bool(np.isin(np.fromiter(hashes, dtype=np.uint64, count=len(hashes)), self._hashes).any())

    def __len__(self) -> int:
        return len(self._hashes)


def encode_part(survivors: Sequence[Survivor], *, broker_id: str, created_ms: int | None = None,
                records_per_batch: int = RECORDS_PER_BATCH) -> EncodedPart:
    """Survivors (at least one, increasing offsets) as a part: Batch of Codec.KAFKA Messages + trailer,
    each Message one RecordBatch in its survivors' codec.

    Deterministic for the same survivors and `created_ms`, so re-running a plan writes the same bytes."""
    if not survivors:
        raise InvalidInputError("a compacted part needs at least one survivor")
    zstd = zstandard.ZstdCompressor(level=3) if any(s.codec is KafkaCodec.ZSTD for s in survivors) else None
    messages: list[Buffer] = []
    headers: list[MessageHeader] = []
    first_offsets: list[int] = []
    hashes = np.empty(len(survivors), dtype=_KEY_ENTRY)
    prev = -1
    for n, run in enumerate(_runs(survivors, records_per_batch)):
        base = run[0].offset
        batch = encode_kafka_batch(run, run[0].codec, zstd=zstd, base_offset=base,   # type: ignore[arg-type]
                                   deltas=[s.offset - base for s in run])
        msg, mh = encode_kafka_message(batch, peek_kafka_batch(batch), producer_id=COMPACTOR_PRODUCER_ID,
                                       epoch=0, sequence=n, created_ms=created_ms)
        messages.append(msg)
        headers.append(mh)
        first_offsets.append(base)
        for s in run:
            if s.offset <= prev:
                raise InvalidInputError(f"survivor offsets must increase: {s.offset} after {prev}")
            prev = s.offset
    at = 0
    for n, run in enumerate(_runs(survivors, records_per_batch)):
        for s in run:
            hashes[at] = (key_hash(s.key), n)
            at += 1
    hashes.sort(order=["hash", "message"])
    chunks = encode_batch(messages, headers, broker_id=broker_id, created_ms=created_ms)
    size = sum(len(c) for c in chunks)
    trailer = _encode_trailer(first_offsets, hashes)
    stamps = [s.timestamp_ms for s in survivors]
    return EncodedPart([*chunks, trailer], size, len(chunks[0]), object_crc32c(chunks), survivors[0].offset,
                       survivors[-1].offset, len(survivors), sum(1 for s in survivors if s.value is None),
                       min(stamps), max(stamps), len(trailer))


def _runs(survivors: Sequence[Survivor], limit: int) -> Iterator[Sequence[Survivor]]:
    """Survivors cut into RecordBatches: at most `limit` each, every offset delta an int32, one codec."""
    start = 0
    for i in range(1, len(survivors) + 1):
        if (i == len(survivors) or i - start >= limit or survivors[i].offset - survivors[start].offset > _I32_MAX
                or survivors[i].codec is not survivors[start].codec):
            yield survivors[start:i]
            start = i


def _encode_trailer(first_offsets: Sequence[int], keys: np.ndarray) -> bytes:
    body = b"".join((_TRAILER.pack(TRAILER_MAGIC, TRAILER_VERSION, len(first_offsets), len(keys)),
                     np.asarray(first_offsets, dtype="<i8").tobytes(), keys.tobytes()))
    return body + _CRC.pack(crc32c(body))


def decode_index(buf: Buffer) -> PartIndex:
    """A part's trailer (bytes [index_offset, index_offset + index_size) of its object), checked."""
    view = memoryview(buf)
    if len(view) < _TRAILER.size + _CRC.size:
        raise CorruptDataError(f"compacted part index truncated: {len(view)} bytes")
    magic, version, messages, keys = _TRAILER.unpack_from(view)
    if magic != TRAILER_MAGIC:
        raise CorruptDataError(f"bad compacted part index magic {bytes(magic)!r}, want {TRAILER_MAGIC!r}")
    if version != TRAILER_VERSION:
        raise CorruptDataError(f"compacted part index version {version}, this reader knows {TRAILER_VERSION}")
    want = _TRAILER.size + 8 * messages + _KEY_ENTRY.itemsize * keys + _CRC.size
    if len(view) != want:
        raise CorruptDataError(f"compacted part index has {len(view)} bytes, its counts say {want}")
    if crc32c(view[:-_CRC.size]) != _CRC.unpack_from(view, len(view) - _CRC.size)[0]:
        raise CorruptDataError("compacted part index CRC32C mismatch")
    offs = np.frombuffer(view, dtype="<i8", count=messages, offset=_TRAILER.size)
    entries = np.frombuffer(view, dtype=_KEY_ENTRY, count=keys, offset=_TRAILER.size + 8 * messages)
    return PartIndex(offs, entries)


def message_range(header: BatchHeader, message: int) -> tuple[int, int]:
    """Byte range [start, end) of Message `message` of a part, from its Batch header."""
    if not 0 <= message < header.message_count:
        raise InvalidInputError(f"part has {header.message_count} Messages, no Message {message}")
    return header.message_ranges[message]


def kafka_batch(message: Buffer) -> memoryview:
    """The Kafka RecordBatch inside one of a part's Messages, checked, as stored (original offsets)."""
    mh = verify_message(message)
    if mh.codec is not Codec.KAFKA:
        raise CorruptDataError(f"compacted part Message has codec {mh.codec.name}, want KAFKA")
    return memoryview(message)[MESSAGE_HEADER_SIZE:]


def message_survivors(message: Buffer) -> list[Survivor]:
    """The survivors of one of a part's Messages (tombstones keep their None value).

    Fields are located by the compiled walk (`kafka_walk`, ~20 ns a record) and sliced out in
    one comprehension: a Python decode per record (`decode_kafka_entries`) cost 4 us a survivor,
    more than reading the plain records compaction replaced (a key's state read was barely 8x
    cheaper than the uncompacted log's). A record the walk refuses is worded by the decoder."""
    from memq.format import kafka_walk as kw   # numba: imported by the readers that need it

    records = split_kafka_records(kafka_batch(message))
    h, raw = records.header, records.raw
    n = h.count
    rec = np.empty((kw.RECORD_COLUMNS, n), np.int64)
    hdr = np.empty((kw.HEADER_COLUMNS, n), np.int64)
    u8 = np.frombuffer(raw, np.uint8)
    status, found, i = kw.walk(u8, np.array([0, len(raw)], np.int64), np.array([n], np.int64), rec, hdr)
    if status == kw.MORE_HEADERS:
        hdr = np.empty((kw.HEADER_COLUMNS, found), np.int64)
        status, found, i = kw.walk(u8, np.array([0, len(raw)], np.int64), np.array([n], np.int64), rec, hdr)
    if status == kw.FAILED:
        decode_raw_records(raw, h)          # raises the record decoder's CorruptDataError
        raise CorruptDataError(f"Kafka record {i} of {n} does not decode")
    offsets = (rec[kw.OFFSET_DELTA] + h.base_offset).tolist()
    stamps = ([h.max_timestamp_ms] * n if h.log_append_time else (rec[kw.TS_DELTA] + h.base_timestamp_ms).tolist())
    ks, kl, vs, vl = (rec[c].tolist() for c in (kw.KEY_START, kw.KEY_LEN, kw.VALUE_START, kw.VALUE_LEN))
    make = Survivor._make     # tuple.__new__: a NamedTuple's keyword-taking __new__ costs a call more a survivor
    with gc_paused():
        codec = h.codec
        out = [make((o, t, raw[a:a + b] if b > 0 else b"", raw[c:c + d] if d >= 0 else None, (), codec))
               for o, t, a, b, c, d in zip(offsets, stamps, ks, kl, vs, vl)]
    if found:
        hks, hkl, hvs, hvl = (hdr[c, :found].tolist() for c in (kw.HKEY_START, kw.HKEY_LEN, kw.HVALUE_START,
                                                                 kw.HVALUE_LEN))
        at = 0
        try:
            for j, count in enumerate(rec[kw.HEADER_COUNT].tolist()):
                if count:
                    out[j] = out[j]._replace(headers=tuple(
                        (raw[hks[x]:hks[x] + hkl[x]].decode(), raw[hvs[x]:hvs[x] + max(hvl[x], 0)])
                        for x in range(at, at + count)))
                    at += count
        except UnicodeDecodeError as e:
            raise CorruptDataError(f"Kafka record header key is not UTF-8: {e}") from None
    return out


def decode_part(obj: Buffer, start: int = 0) -> tuple[BatchHeader, list[tuple[MessageHeader, list[Survivor]]]]:
    """A compacted part's Batch (its bytes, or its whole object) as its readers take it: per
    Message, its header and its survivors at or after Kafka offset `start` (a Message with none
    left keeps an empty list). The one decoder of parts: memq's Consumer cuts the survivors into
    runs of its positions (`memq.client.compacted`), Spark into columns (`spark_source.compacted`)."""
    header = decode_batch_header(obj)
    view = memoryview(obj)[:header.object_size]
    out: list[tuple[MessageHeader, list[Survivor]]] = []
    for lo, hi in header.message_ranges:
        msg = view[lo:hi]
        survivors = message_survivors(msg)
        if start and survivors and survivors[0].offset < start:
            survivors = [s for s in survivors if s.offset >= start]
        out.append((decode_message_header(msg), survivors))
    return header, out


def part_survivors(obj: Buffer, start: int = 0) -> list[Survivor]:
    """Every survivor at or after Kafka offset `start` of a part's Batch bytes (or its whole object)."""
    return [s for _, survivors in decode_part(obj, start)[1] for s in survivors]


def plain_survivors(first: int, part: Buffer, compressors: Compressors | None = None, *,
                    own_codec: KafkaCodec = KafkaCodec.NONE) -> list[Survivor]:
    """The keyed records of a plain part (the batch a notification names) with their Kafka offsets
    (`first + index`: `first` is the offset of the part's first record in the topic's scheme, the
    notification's `first_offset` on a sparse topic, its counted base on a dense one), null values
    and the codec they arrived in kept (a
    Kafka producer's batch's; `own_codec`, the topic's framing codec, for memq's own records);
    keyless records are skipped (they still take their index)."""
    header = decode_batch_header(part)
    view = memoryview(part)[:header.object_size]
    comp = compressors or Compressors()
    out: list[Survivor] = []
    index = 0
    for lo, hi in header.message_ranges:
        msg = view[lo:hi]
        if verify_message(msg).codec is Codec.KAFKA:
            body = msg[MESSAGE_HEADER_SIZE:]
            codec = peek_kafka_batch(body).codec
            for e in decode_kafka_entries(body):
                if e.key is not None:
                    out.append(Survivor(first + index, e.timestamp_ms, e.key, e.value,
                                        e.headers, codec))
                index += 1
        else:
            for m in decode_message(msg, compressors=comp)[1]:
                if m.key is not None:
                    out.append(Survivor(first + index, m.timestamp_ms, m.key, m.value,
                                        tuple(m.headers), own_codec))
                index += 1
    return out


def find_key(message: Buffer, key: bytes) -> Survivor | None:
    """`key`'s survivor in one of a part's Messages (its latest there), None if absent."""
    found = None
    for s in message_survivors(message):
        if s.key == key:
            found = s
    return found
