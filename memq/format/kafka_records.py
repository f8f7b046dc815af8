"""Kafka RecordBatch v2: the header check the broker runs and the full decode readers run.

A Kafka producer's batch is stored unchanged as the body of one memq Message tagged
`Codec.KAFKA` (see `kafka_message_header`), so the broker only checks the fixed header and
the batch's own CRC32C (`verify_kafka_batch`); readers decode records with
`decode_kafka_records`; `encode_kafka_batch` frames memq-produced records for Kafka readers
in any of Kafka's codecs (`compress_records`; `without_compression` undoes a codec for
readers that cannot take it). Layout (big-endian,
Kafka's `DefaultRecordBatch`): base offset i64, batch length i32, partition leader epoch i32,
magic i8 (=2), CRC32C u32 of every byte after it, attributes i16 (bits 0-2 codec, 3 timestamp type, 4 transactional, 5 control), last
offset delta i32, base/max timestamp i64, producer id i64, producer epoch i16, base sequence
i32, record count i32, then the (possibly compressed) records, each a zigzag-varint framed
`attributes, timestampDelta, offsetDelta, key, value, headers`.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

import cramjam
import zstandard
from crc32c import crc32c

from memq.errors import CorruptDataError, InvalidInputError, UnsupportedCodecError, UnsupportedVersionError
from memq.format.codec import MAX_BODY_BYTES
from memq.format.records import LogMessage, gc_paused

Buffer = bytes | bytearray | memoryview

_HEADER = struct.Struct(">qiibIhiqqqhii")
KAFKA_BATCH_HEADER_SIZE = _HEADER.size   # 61
_LENGTH_END = 12                          # base offset + batch length: what batch length excludes
_CRC_START = 21                           # the CRC covers attributes .. end
_CRC_AT = 17                              # where the CRC32C itself sits
_CRC = struct.Struct(">I")
_XERIAL_MAGIC = b"\x82SNAPPY\x00"         # the Java client's framed snappy
_XERIAL_HEADER = 16
_BLOCK_LEN = struct.Struct(">i")
_CONTROL = 0x20
_TRANSACTIONAL = 0x10
_LOG_APPEND_TIME = 0x08
_ZSTD_CHUNK = 1 << 20
_XERIAL_VERSION = b"\0\0\0\x01\0\0\0\x01"   # version 1, compatible with 1 (what snappy-java writes)
_XERIAL_BLOCK = 32 * 1024                  # snappy-java's block size
#: Framing levels (memq's own records, `encode_kafka_batch`): the fastest, as a part is framed on
#: the read path (docs/DECISIONS.md, "Records for every reader").
GZIP_LEVEL = 1
ZSTD_LEVEL = 1
LZ4_LEVEL = 1    # lz4 fast mode (cramjam's default, 4, is high compression: 12x the CPU for 10% fewer bytes)


class KafkaCodec(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


@dataclass(frozen=True, slots=True)
class KafkaBatchHeader:
    base_offset: int
    batch_length: int
    attributes: int
    last_offset_delta: int
    base_timestamp_ms: int
    max_timestamp_ms: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    count: int

    @property
    def size(self) -> int:
        return _LENGTH_END + self.batch_length

    @property
    def codec(self) -> KafkaCodec:
        try:
            return KafkaCodec(self.attributes & 0x07)
        except ValueError:
            raise UnsupportedCodecError(f"Kafka batch codec {self.attributes & 0x07} is not one of "
                                        f"none/gzip/snappy/lz4/zstd") from None

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL)

    @property
    def log_append_time(self) -> bool:
        """Records carry the broker's append time (the header's max timestamp), not their own."""
        return bool(self.attributes & _LOG_APPEND_TIME)

    @property
    def min_timestamp_ms(self) -> int:
        """A lower bound of the records' timestamps as the header tells it (the first record's)."""
        return min(self.base_timestamp_ms, self.max_timestamp_ms)


def peek_kafka_batch(buf: Buffer) -> KafkaBatchHeader:
    """Decode the fixed header (magic, length, codec, count) without the CRC pass."""
    n = len(buf)
    if n < KAFKA_BATCH_HEADER_SIZE:
        raise CorruptDataError(f"Kafka record batch truncated: {n} bytes, need {KAFKA_BATCH_HEADER_SIZE}")
    (base_offset, length, _leader_epoch, magic, _crc, attributes, last_delta, base_ts, max_ts,
     pid, epoch, base_seq, count) = _HEADER.unpack_from(buf)
    if magic != 2:
        raise UnsupportedVersionError(f"Kafka record batch magic {magic}: only v2 (magic 2) is supported")
    if length < KAFKA_BATCH_HEADER_SIZE - _LENGTH_END or _LENGTH_END + length > n:
        raise CorruptDataError(f"Kafka record batch length {length} does not fit the {n} bytes given")
    if count < 0 or last_delta < 0:
        raise CorruptDataError(f"Kafka record batch count {count} / last offset delta {last_delta} negative")
    if attributes & _CONTROL:
        raise UnsupportedVersionError("Kafka control batches (transaction markers) are not supported")
    header = KafkaBatchHeader(base_offset, length, attributes, last_delta, base_ts, max_ts, pid, epoch,
                              base_seq, count)
    header.codec   # noqa: B018 - raises UnsupportedCodecError for an unknown codec
    return header


def verify_kafka_batch(buf: Buffer) -> KafkaBatchHeader:
    """The broker's check: header fields, exact length and the batch's CRC32C, no decompression."""
    header = peek_kafka_batch(buf)
    if header.size != len(buf):
        raise CorruptDataError(f"Kafka record batch has {len(buf)} bytes, its header says {header.size}")
    if crc32c(memoryview(buf)[_CRC_START:]) != _HEADER.unpack_from(buf)[4]:
        raise CorruptDataError("Kafka record batch CRC32C mismatch")
    return header


def split_kafka_batches(buf: Buffer) -> list[memoryview]:
    """The batches back to back in a Produce request's `records` field, each as a view."""
    view = memoryview(buf)
    out = []
    while view:
        size = peek_kafka_batch(view).size
        out.append(view[:size])
        view = view[size:]
    return out


def decode_kafka_records(buf: Buffer) -> list[LogMessage]:
    """Verify one whole batch, decompress it and decode its records into LogMessages.

    Null values, and null header values, decode as b"" (a LogMessage value is bytes).
    """
    header = verify_kafka_batch(buf)
    return decode_raw_records(decompress_records(header.codec, memoryview(buf)[KAFKA_BATCH_HEADER_SIZE:]), header)


class KafkaEntry(NamedTuple):
    """One record of a batch as Kafka holds it: null values stay None (a compacted topic's tombstone)."""

    offset_delta: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


def decode_kafka_entries(buf: Buffer) -> list[KafkaEntry]:
    """Verify one whole batch and decode its records with their offset deltas and null values
    (compaction keeps each record's offset, and a null value is a tombstone there)."""
    header = verify_kafka_batch(buf)
    raw = decompress_records(header.codec, memoryview(buf)[KAFKA_BATCH_HEADER_SIZE:])
    with gc_paused():
        return _Records(raw, header).read_all(entries=True)  # type: ignore[return-value]


def decode_raw_records(raw: bytes | memoryview, header: KafkaBatchHeader) -> list[LogMessage]:
    """The records of a verified batch, `raw` = its records decompressed: the one definition
    of which records are corrupt (the column reader asks it to word its errors)."""
    with gc_paused():
        return _Records(raw, header).read_all()  # type: ignore[return-value]


def decompress_records(codec: KafkaCodec, body: memoryview,
                       zstd: zstandard.ZstdDecompressor | None = None) -> bytes | memoryview:
    """A batch's records decompressed, to at most MAX_BODY_BYTES (a hostile batch could declare
    more). A reader decoding many batches passes its `zstd` context: building one costs more
    than decompressing a 1,000-record batch."""
    try:
        if codec is KafkaCodec.NONE:
            return body
        if codec is KafkaCodec.GZIP:
            d = zlib.decompressobj(wbits=47)   # gzip or zlib container
            out = d.decompress(body, MAX_BODY_BYTES + 1)
        elif codec is KafkaCodec.SNAPPY:
            out = _unsnappy(body)
        elif codec is KafkaCodec.LZ4:
            out = bytes(cramjam.lz4.decompress(body))
        else:
            out = _unzstd(body, zstd or zstandard.ZstdDecompressor())
    except (zlib.error, zstandard.ZstdError, cramjam.DecompressionError) as exc:
        raise CorruptDataError(f"Kafka {codec.name} records do not decompress: {exc}") from exc
    if len(out) > MAX_BODY_BYTES:
        raise CorruptDataError(f"Kafka {codec.name} records decompress to over {MAX_BODY_BYTES} bytes")
    return out


def _unzstd(body: memoryview, zstd: zstandard.ZstdDecompressor) -> bytes:
    """The first zstd frame of `body`, to at most MAX_BODY_BYTES + 1 bytes. A frame that
    declares its size is decompressed in one call; else chunk by chunk, as
    reading MAX_BODY_BYTES at once allocates that much each time (~40 us a batch)."""
    size = zstandard.get_frame_parameters(body).content_size
    if size != zstandard.CONTENTSIZE_UNKNOWN:
        if size > MAX_BODY_BYTES:
            raise CorruptDataError(f"Kafka ZSTD records declare {size} bytes, over {MAX_BODY_BYTES}")
        return zstd.decompress(body, max_output_size=size)
    chunks = []
    got = 0
    with zstd.stream_reader(body) as reader:
        while got <= MAX_BODY_BYTES and (chunk := reader.read(_ZSTD_CHUNK)):
            chunks.append(chunk)
            got += len(chunk)
    return b"".join(chunks)


def _unsnappy(body: memoryview) -> bytes:
    """Raw snappy (librdkafka) or the Java client's xerial framing (8 magic, 8 version bytes,
    then blocks of i32 length + raw snappy)."""
    if bytes(body[:8]) != _XERIAL_MAGIC:
        return _snappy_block(body)
    out = bytearray()
    pos = _XERIAL_HEADER
    while pos < len(body):
        if pos + 4 > len(body):
            raise CorruptDataError("xerial snappy block length truncated")
        (n,) = _BLOCK_LEN.unpack_from(body, pos)
        if n < 0 or pos + 4 + n > len(body):
            raise CorruptDataError(f"xerial snappy block of {n} bytes overruns the body")
        out += _snappy_block(body[pos + 4:pos + 4 + n])
        pos += 4 + n
    return bytes(out)


def _snappy_block(block: memoryview) -> bytes:
    if cramjam.snappy.decompress_raw_len(block) > MAX_BODY_BYTES:
        raise CorruptDataError(f"snappy block declares over {MAX_BODY_BYTES} bytes")
    return bytes(cramjam.snappy.decompress_raw(block))


class _Records:
    """A cursor over the decompressed records of one batch."""

    __slots__ = ("buf", "pos", "header")

    def __init__(self, buf: bytes | memoryview, header: KafkaBatchHeader) -> None:
        self.buf = bytes(buf)
        self.pos = 0
        self.header = header

    def read_all(self, entries: bool = False) -> list[LogMessage] | list[KafkaEntry]:
        """The records as LogMessages (null values as b""), or as `KafkaEntry`s if `entries`."""
        h = self.header
        log_append = h.log_append_time
        out: list = []
        for i in range(h.count):
            length = self.varint()
            end = self.pos + length
            if length < 0 or end > len(self.buf):
                raise CorruptDataError(f"Kafka record {i} length {length} overruns the batch")
            self.pos += 1   # record attributes: unused by Kafka
            delta = self.varint()
            ts = h.max_timestamp_ms if log_append else h.base_timestamp_ms + delta
            offset_delta = self.varint()   # memq positions are per batch; compaction keeps them
            key = self.nullable_bytes()
            value = self.nullable_bytes()
            headers = tuple((self.string(), self.nullable_bytes() or b"") for _ in range(self.count()))
            if self.pos != end:
                raise CorruptDataError(f"Kafka record {i} is {length} bytes but its fields take "
                                       f"{self.pos - end + length}")
            out.append(KafkaEntry(offset_delta, ts, key, value, headers) if entries
                       else LogMessage(value or b"", key, headers, ts))
        if self.pos != len(self.buf):
            raise CorruptDataError(f"Kafka batch has {len(self.buf) - self.pos} bytes after its "
                                   f"{h.count} records")
        return out

    def varint(self) -> int:
        """A zigzag varint (Kafka uses the same encoding for varint and varlong)."""
        buf, pos, shift, acc = self.buf, self.pos, 0, 0
        while True:
            if pos >= len(buf):
                raise CorruptDataError("Kafka record truncated inside a varint")
            b = buf[pos]
            pos += 1
            acc |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 63:
                raise CorruptDataError("Kafka varint longer than 10 bytes")
        self.pos = pos
        return (acc >> 1) ^ -(acc & 1)

    def count(self) -> int:
        n = self.varint()
        if n < 0 or n > len(self.buf) - self.pos:
            raise CorruptDataError(f"Kafka record header count {n} is impossible here")
        return n

    def nullable_bytes(self) -> bytes | None:
        n = self.varint()
        if n < 0:
            if n != -1:
                raise CorruptDataError(f"Kafka record field length {n}")
            return None
        end = self.pos + n
        if end > len(self.buf):
            raise CorruptDataError(f"Kafka record field of {n} bytes overruns the record")
        out = self.buf[self.pos:end]
        self.pos = end
        return out

    def string(self) -> str:
        raw = self.nullable_bytes()
        if raw is None:
            raise CorruptDataError("Kafka record header key is null")
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise CorruptDataError(f"Kafka record header key is not UTF-8: {exc}") from exc


def encode_kafka_batch(records: Sequence[LogMessage], codec: KafkaCodec = KafkaCodec.NONE, *,
                       zstd: zstandard.ZstdCompressor | None = None, base_offset: int = 0,
                       deltas: Sequence[int] | None = None) -> bytes:
    """One RecordBatch v2 of `records` (base offset 0, record i at offset delta i, CreateTime,
    no producer ids): how memq-produced records are served to Kafka readers, whose Fetch
    rewrites the base offset (it lies outside the CRC). The records are compressed with `codec`
    when that saves at least 5% (random values go out as they are); a caller framing many
    batches passes its `zstd` context (building one costs more than compressing a small batch).
    Compaction passes the records' own `base_offset` and offset `deltas` (increasing, from 0)."""
    if not records:
        raise InvalidInputError("a Kafka record batch needs at least one record")
    base_ts = min(r.timestamp_ms for r in records)
    max_ts = max(r.timestamp_ms for r in records)
    body = bytearray()
    if deltas is not None and (len(deltas) != len(records) or deltas[0] != 0):
        raise InvalidInputError(f"{len(deltas)} offset deltas for {len(records)} records, the first must be 0")
    for i, r in enumerate(records):
        rec = bytearray(b"\0")   # record attributes
        rec += _varint(r.timestamp_ms - base_ts)
        rec += _varint(i if deltas is None else deltas[i])
        _put_bytes(rec, r.key)
        _put_bytes(rec, r.value)
        rec += _varint(len(r.headers))
        for name, value in r.headers:
            _put_bytes(rec, name.encode())
            _put_bytes(rec, value)
        body += _varint(len(rec))
        body += rec
    last = len(records) - 1 if deltas is None else deltas[-1]
    if codec is not KafkaCodec.NONE:
        packed = compress_records(codec, body, zstd)
        if len(packed) * 20 <= len(body) * 19:
            return _batch(codec, len(records), base_ts, max_ts, packed, base_offset, last)
    return _batch(KafkaCodec.NONE, len(records), base_ts, max_ts, body, base_offset, last)


def compress_records(codec: KafkaCodec, raw: bytes | bytearray, zstd: zstandard.ZstdCompressor | None = None
                     ) -> bytes:
    """`raw` records compressed as Kafka's clients expect `codec`: gzip in a gzip container,
    snappy in the Java client's xerial framing (what every client decodes; librdkafka and
    kafka-python also take raw snappy, the Java client does not), lz4 as an LZ4 frame of
    independent 64 KiB blocks (KIP-57; the Java client rejects linked blocks), zstd as one frame."""
    if codec is KafkaCodec.GZIP:
        z = zlib.compressobj(GZIP_LEVEL, wbits=31)
        return z.compress(raw) + z.flush()
    if codec is KafkaCodec.SNAPPY:
        out = bytearray(_XERIAL_MAGIC + _XERIAL_VERSION)
        for at in range(0, len(raw), _XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(raw[at:at + _XERIAL_BLOCK]))
            out += _BLOCK_LEN.pack(len(block)) + block
        return bytes(out)
    if codec is KafkaCodec.LZ4:
        lz4 = cramjam.lz4.Compressor(level=LZ4_LEVEL, content_checksum=False, block_linked=False)
        lz4.compress(bytes(raw))
        return bytes(lz4.finish())
    if codec is KafkaCodec.ZSTD:
        return (zstd or zstandard.ZstdCompressor(level=ZSTD_LEVEL)).compress(raw)
    return bytes(raw)


def without_compression(buf: Buffer) -> bytes:
    """A whole batch with its records decompressed (codec none, new length and CRC; every other
    header field kept): for readers that must not get a codec (KIP-110: zstd needs Fetch v10+)."""
    header = verify_kafka_batch(buf)
    raw = decompress_records(header.codec, memoryview(buf)[KAFKA_BATCH_HEADER_SIZE:])
    out = bytearray(buf[:KAFKA_BATCH_HEADER_SIZE])
    struct.pack_into(">i", out, 8, KAFKA_BATCH_HEADER_SIZE - _LENGTH_END + len(raw))
    struct.pack_into(">h", out, _CRC_START, header.attributes & ~0x07)
    out += raw
    _CRC.pack_into(out, _CRC_AT, crc32c(memoryview(out)[_CRC_START:]))
    return bytes(out)


def _batch(codec: KafkaCodec, count: int, base_ts: int, max_ts: int, records: bytes | bytearray,
           base_offset: int = 0, last_delta: int | None = None) -> bytes:
    out = bytearray(KAFKA_BATCH_HEADER_SIZE)
    _HEADER.pack_into(out, 0, base_offset, KAFKA_BATCH_HEADER_SIZE - _LENGTH_END + len(records), -1, 2, 0,
                      int(codec), count - 1 if last_delta is None else last_delta, base_ts, max_ts, -1, -1, -1,
                      count)
    out += records
    _CRC.pack_into(out, _CRC_AT, crc32c(memoryview(out)[_CRC_START:]))
    return bytes(out)


def _put_bytes(out: bytearray, value: bytes | None) -> None:
    if value is None:
        out += _varint(-1)
        return
    out += _varint(len(value))
    out += value


def _varint(n: int) -> bytes:
    """Kafka's zigzag varint (varlong) of `n`."""
    z = (n << 1) ^ (n >> 63)
    if z < 0x80:
        return _SMALL_VARINTS[z]
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_SMALL_VARINTS = [bytes([z]) for z in range(0x80)]


class KafkaFields(NamedTuple):
    """The keys and values of one batch's records, nothing else built (a null as None): what a
    check of a topic's keys or values reads (memq.schema.check)."""

    keys: list[bytes | None]
    values: list[bytes | None]


def kafka_fields(buf: Buffer) -> KafkaFields:
    """Verify one whole batch, decompress it and read its records' keys and values only: one
    lean pass with the varints read inline, ~5x cheaper a record than `decode_kafka_records`,
    which builds a LogMessage with its headers. Corrupt records raise what
    `decode_kafka_records` would raise (it words the error: the one definition of what is corrupt)."""
    header = verify_kafka_batch(buf)
    raw = decompress_records(header.codec, memoryview(buf)[KAFKA_BATCH_HEADER_SIZE:])
    data = raw if isinstance(raw, bytes) else bytes(raw)
    walk = _compiled_walk()
    try:
        got = _fields(data, header.count) if walk is None else walk(data, header.count)
        if got is not None:
            return got
    except (IndexError, ValueError):
        pass
    decode_raw_records(data, header)   # raises the exact error
    raise CorruptDataError("Kafka batch records do not decode")   # pragma: no cover - the decoder agrees


_WALK: list[Callable[[bytes, int], KafkaFields | None] | None] = []


def _compiled_walk() -> Callable[[bytes, int], KafkaFields | None] | None:
    """numba's walk over the records (`kafka_walk`, ~0.2 us a record against ~1.5 us in
    Python) where numba is installed (the `spark` extra); None where it is not (the broker role
    does not pull it: the Python walk then). Looked for once."""
    if not _WALK:
        try:
            from memq.format import kafka_walk as kw   # numba: imported on first use only
        except ImportError:
            _WALK.append(None)
        else:
            def walk(raw: bytes, count: int) -> KafkaFields | None:
                import numpy as np
                if not 0 <= count <= len(raw):   # a record takes bytes: a count beyond them is corrupt
                    return None
                rec = np.empty((kw.RECORD_COLUMNS, count), np.int64)
                hdr = np.empty((kw.HEADER_COLUMNS, 0), np.int64)   # headers only counted
                status, _, _ = kw.walk(np.frombuffer(raw, np.uint8), np.array([0, len(raw)], np.int64),
                                       np.array([count], np.int64), rec, hdr)
                if status == kw.FAILED:
                    return None
                ks, kl, vs, vl = (rec[c].tolist() for c in (kw.KEY_START, kw.KEY_LEN, kw.VALUE_START, kw.VALUE_LEN))
                return KafkaFields([raw[a:a + b] if b >= 0 else None for a, b in zip(ks, kl)],
                                   [raw[a:a + b] if b >= 0 else None for a, b in zip(vs, vl)])
            _WALK.append(walk)
    return _WALK[0]


def _fields(raw: bytes, count: int) -> KafkaFields:
    """`count` records' keys and values, walking `raw`; IndexError or ValueError on anything
    that does not frame exactly (the caller re-reads with the wording decoder)."""
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    add_key, add_value = keys.append, values.append
    pos = 0
    size = len(raw)
    for _ in range(count):
        # the record's length (a zigzag varint): one or two bytes for any record up to 8 KiB
        b = raw[pos]
        if b < 0x80:
            n, pos = b, pos + 1
        else:
            n, pos = _uvarint(raw, pos)
        if n & 1:
            raise ValueError("negative record length")
        end = pos + (n >> 1)
        if end > size:
            raise ValueError("record overruns the batch")
        pos += 1                                     # attributes
        while raw[pos] & 0x80:                       # timestamp delta
            pos += 1
        pos += 1
        while raw[pos] & 0x80:                       # offset delta
            pos += 1
        pos += 1
        for add in (add_key, add_value):
            b = raw[pos]
            if b < 0x80:
                n, pos = b, pos + 1
            else:
                n, pos = _uvarint(raw, pos)
            if n == 1:                               # -1: null
                add(None)
                continue
            if n & 1:
                raise ValueError("negative field length")
            n >>= 1
            add(raw[pos:pos + n])
            pos += n
        b = raw[pos]                                 # headers: skipped, their framing checked
        if b < 0x80:
            nh, pos = b, pos + 1
        else:
            nh, pos = _uvarint(raw, pos)
        if nh & 1:
            raise ValueError("negative header count")
        for _ in range(nh >> 1):
            n, pos = _uvarint(raw, pos)
            if n & 1:
                raise ValueError("null header key")
            pos += n >> 1
            n, pos = _uvarint(raw, pos)
            if n & 1 and n != 1:
                raise ValueError("negative header value length")
            pos += 0 if n == 1 else n >> 1
        if pos != end:
            raise ValueError("record fields do not fill the record")
    if pos != size:
        raise ValueError("bytes after the last record")
    return KafkaFields(keys, values)


def _uvarint(raw: bytes, pos: int) -> tuple[int, int]:
    """The unsigned (still zigzag-encoded) varint at `pos` and the position after it."""
    acc = shift = 0
    while True:
        b = raw[pos]
        pos += 1
        acc |= (b & 0x7F) << shift
        if b < 0x80:
            return acc, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")
