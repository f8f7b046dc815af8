"""Message: the producer's upload unit, a fixed binary header plus an encoded body.

Header (little-endian, 72 bytes, `_HEADER`): magic "MQMS", version, codec, header size,
producer id u64, epoch u32, sequence u64, LogMessage count u32, min/max timestamp and
created time (i64 ms), body length u32, raw (uncompressed) body length u32, CRC32C of the
body, CRC32C of the header bytes before it. The broker checks header and body CRCs without
decompressing; the header CRC keeps a flipped id or timestamp from passing as a real one.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Literal, Sequence, overload

from crc32c import crc32c

from memq.errors import CorruptDataError, InvalidInputError, UnsupportedVersionError
from memq.format.codec import MAX_BODY_BYTES, Codec, Compressors, codec_of
from memq.format.arrow_body import ArrowRecords, decode_arrow_body, encode_arrow_body
from memq.format.kafka_records import KafkaBatchHeader, decode_kafka_records
from memq.format.records import (LogMessage, check_records, gc_paused, packed_records, unpack_rows,
                                 timestamp_range, unpack_records)

Buffer = bytes | bytearray | memoryview

MESSAGE_MAGIC = b"MQMS"
MESSAGE_VERSION = 1
_HEADER = struct.Struct("<4sBBHQIQIqqqIIII")
MESSAGE_HEADER_SIZE = _HEADER.size
_CRC_END = MESSAGE_HEADER_SIZE - 4  # the header CRC covers every byte before itself
_MAX_U32 = 0xFFFFFFFF
_U32 = struct.Struct("<I")


# not frozen: a frozen dataclass's __init__ (object.__setattr__ per field) costs ~1.2 us more, per Message
@dataclass(slots=True)
class MessageHeader:
    """The decoded fixed header in front of every Message."""

    version: int
    codec: Codec
    producer_id: int
    epoch: int
    sequence: int
    count: int
    min_timestamp_ms: int
    max_timestamp_ms: int
    created_ms: int
    body_length: int
    body_crc32c: int
    header_size: int
    raw_length: int  # body length before compression

    @property
    def total_size(self) -> int:
        return self.header_size + self.body_length


def encode_message(records: Sequence[LogMessage], *, producer_id: int, epoch: int,
                   sequence: int, codec: Codec = Codec.ZSTD, created_ms: int | None = None,
                   compressors: Compressors | None = None, timestamps: tuple[int, int] | None = None,
                   shaped: bool = False, adaptive: bool = False, headroom: int = 0) -> bytearray:
    """Encode LogMessages (or 5-tuples in their field order) into one Message (header + body).

    `adaptive=True` stores the body uncompressed (Codec.NONE in the header) when `codec` would
    not shrink it by >= 5% (`Compressors.compress_if_pays`); the producer always asks for it.
    `headroom` bytes (zeroed) precede the Message in the returned buffer, so a caller can write
    its own frame header there instead of copying the Message behind it (the producer puts the
    ProduceRequest header there).

    A caller that knows more skips per-record passes: `timestamps` is the records' (min, max)
    timestamp_ms (else computed here), `shaped=True` says it built the 5-tuples itself (else
    `check_records` checks them). The producer passes both, so its records only go through
    msgpack's C loop.
    """
    if len(records) > _MAX_U32:
        raise InvalidInputError(f"a Message holds at most {_MAX_U32} LogMessages")
    codec = codec_of(codec)
    if codec is Codec.ARROW:   # Arrow compresses the buffers inside; `adaptive` does not apply
        if not shaped:
            check_records(records)
        body = encode_arrow_body(records)
        if len(body) > MAX_BODY_BYTES:
            raise InvalidInputError(f"Message body of {len(body)} bytes exceeds {MAX_BODY_BYTES}")
        lo, hi = timestamp_range(records) if timestamps is None else timestamps
        return _message(headroom, codec, producer_id, epoch, sequence, len(records), lo, hi, created_ms,
                        body, len(body))
    comp = compressors or Compressors()
    with packed_records(records, comp.packer) as raw:
        if not shaped:
            check_records(records)   # after packing, while the records are still in cache
        if adaptive:
            codec, body = comp.compress_if_pays(codec, raw)
        else:
            body = comp.compress(codec, raw)
        if len(raw) > MAX_BODY_BYTES or len(body) > MAX_BODY_BYTES:
            raise InvalidInputError(f"Message body of {len(raw)} bytes exceeds {MAX_BODY_BYTES}")
        lo, hi = timestamp_range(records) if timestamps is None else timestamps
        return _message(headroom, codec, producer_id, epoch, sequence, len(records), lo, hi, created_ms,
                        body, len(raw))


def _message(headroom: int, codec: Codec, producer_id: int, epoch: int, sequence: int, count: int,
             lo: int, hi: int, created_ms: int | None, body: Buffer, raw_length: int) -> bytearray:
    out = bytearray(headroom + MESSAGE_HEADER_SIZE)   # `+= body` below: no zero-fill of 1 MiB
    _pack_header(out, headroom, codec, producer_id, epoch, sequence, count, lo, hi, created_ms, body, raw_length)
    out += body
    return out


def encode_kafka_message(batch: Buffer, kafka: KafkaBatchHeader, *, producer_id: int, epoch: int,
                         sequence: int, created_ms: int | None = None) -> tuple[bytearray, MessageHeader]:
    """Wrap a verified Kafka RecordBatch v2, unchanged, as a Message tagged Codec.KAFKA.

    Count and timestamps come from the Kafka batch header, so the broker never decodes records.
    Returns the Message and its header (what `verify_message` would return for it).
    """
    if len(batch) > MAX_BODY_BYTES:
        raise InvalidInputError(f"Kafka batch of {len(batch)} bytes exceeds {MAX_BODY_BYTES}")
    out = bytearray(MESSAGE_HEADER_SIZE)
    lo, hi = kafka.min_timestamp_ms, kafka.max_timestamp_ms
    _pack_header(out, 0, Codec.KAFKA, producer_id, epoch, sequence, kafka.count, lo, hi, created_ms,
                 batch, len(batch))
    out += batch
    return out, decode_message_header(out)


def _pack_header(out: bytearray, at: int, codec: Codec, producer_id: int, epoch: int, sequence: int,
                 count: int, lo: int, hi: int, created_ms: int | None, body: Buffer, raw_length: int) -> None:
    created = time.time_ns() // 1_000_000 if created_ms is None else created_ms
    try:
        _HEADER.pack_into(out, at, MESSAGE_MAGIC, MESSAGE_VERSION, codec, MESSAGE_HEADER_SIZE,
                          producer_id, epoch, sequence, count, lo, hi, created,
                          len(body), raw_length, crc32c(body), 0)
    except struct.error as exc:
        raise InvalidInputError(
            f"Message header field out of range (producer_id u64, epoch u32, sequence u64, "
            f"timestamps i64): {exc}") from exc
    crc_at = at + _CRC_END
    _U32.pack_into(out, crc_at, crc32c(memoryview(out)[at:crc_at]))


def check_magic_and_version(buf: Buffer, what: str, magic: bytes, version: int, need: int) -> None:
    """The check every binary header starts with: 4 magic bytes, then a version byte.

    `need` is the size the caller will read next, named in the truncation error.
    """
    n = len(buf)
    if n < 5:
        raise CorruptDataError(f"{what} truncated: {n} bytes, need {need}")
    if buf[:4] != magic:
        raise CorruptDataError(f"bad {what} magic {bytes(buf[:4])!r}, want {magic!r}")
    if buf[4] != version:
        raise UnsupportedVersionError(f"{what} version {buf[4]}, this reader knows {version}")


def decode_message_header(buf: Buffer) -> MessageHeader:
    """Decode and check the header only (magic, version, header CRC, lengths)."""
    n = len(buf)
    check_magic_and_version(buf, "Message", MESSAGE_MAGIC, MESSAGE_VERSION, MESSAGE_HEADER_SIZE)
    if n < MESSAGE_HEADER_SIZE:
        raise CorruptDataError(f"Message header truncated: {n} of {MESSAGE_HEADER_SIZE} bytes")
    (_, version, codec, header_size, producer_id, epoch, sequence, count, lo, hi, created,
     body_length, raw_length, body_crc, header_crc) = _HEADER.unpack_from(buf)
    if crc32c(buf[:_CRC_END]) != header_crc:
        raise CorruptDataError("Message header CRC32C mismatch")
    if header_size != MESSAGE_HEADER_SIZE:
        raise CorruptDataError(f"Message header size {header_size}, want {MESSAGE_HEADER_SIZE}")
    if body_length > MAX_BODY_BYTES or raw_length > MAX_BODY_BYTES:
        raise CorruptDataError(f"Message body length {max(body_length, raw_length)} exceeds "
                               f"{MAX_BODY_BYTES}")
    if lo > hi:
        raise CorruptDataError(f"Message min timestamp {lo} is after max timestamp {hi}")
    return MessageHeader(version, codec_of(codec), producer_id, epoch, sequence, count, lo, hi,
                         created, body_length, body_crc, header_size, raw_length)


def verify_message(buf: Buffer) -> MessageHeader:
    """Check header, exact length and body CRC without decompressing (the broker's check)."""
    header = decode_message_header(buf)
    total = header.total_size
    if len(buf) != total:
        what = "truncated" if len(buf) < total else "has trailing bytes"
        raise CorruptDataError(f"Message {what}: {len(buf)} bytes, header says {total}")
    if crc32c(memoryview(buf)[header.header_size:]) != header.body_crc32c:
        raise CorruptDataError("Message body CRC32C mismatch")
    return header


@overload
def decode_message(buf: Buffer, *, compressors: Compressors | None = None, rows: Literal[False] = False
                   ) -> tuple[MessageHeader, Sequence[LogMessage]]: ...


@overload
def decode_message(buf: Buffer, *, compressors: Compressors | None = None, rows: Literal[True]
                   ) -> tuple[MessageHeader, Sequence[tuple]]: ...


def decode_message(buf: Buffer, *, compressors: Compressors | None = None, rows: bool = False
                   ) -> tuple[MessageHeader, Sequence[LogMessage] | Sequence[tuple]]:
    """Verify, decompress and unpack a Message into its LogMessages (with the GC paused).

    A Codec.KAFKA Message holds a Kafka RecordBatch v2, decoded by `decode_kafka_records`; a
    Codec.ARROW one Arrow columns, kept as such in `ArrowRecords` until its rows are read.
    `rows`: msgpack records as plain tuples in LogMessage's field order (`unpack_rows`).
    """
    header = verify_message(buf)
    body = memoryview(buf)[header.header_size:]
    if header.codec is Codec.KAFKA:
        records = decode_kafka_records(body)
        if len(records) != header.count:
            raise CorruptDataError(f"Kafka batch holds {len(records)} records, header says {header.count}")
        return header, records
    if header.codec is Codec.ARROW:   # stored as Arrow wrote it: raw = body
        if header.raw_length != header.body_length:
            raise CorruptDataError(f"Codec.ARROW raw length {header.raw_length}, body length {header.body_length}")
        return header, ArrowRecords(decode_arrow_body(body, header.count))
    raw = (compressors or Compressors()).decompress(header.codec, body, header.raw_length)
    with gc_paused():
        return header, (unpack_rows if rows else unpack_records)(raw, header.count)
