"""Batch: the stored object. Header + index of Messages + the Messages back to back.

Layout (little-endian):
  prefix  magic "MQBT", version u8, 3 zero bytes, header_size u32   (BATCH_PREFIX_SIZE bytes)
  fixed   message_count u32, logmessage_count u64, min/max timestamp i64, created_ms i64,
          broker_id length u16
  broker_id (UTF-8), then per Message: offset u64, length u32, LogMessage count u32
  CRC32C u32 of every header byte before it
A reader fetches the prefix, then the header, then any one Message by its byte range.

An object is one batch, or (a storage group's shared object) several batches back to back,
each self-contained with offsets relative to its own start: `split_parts` walks them.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

from crc32c import crc32c

from memq.errors import CorruptDataError, InvalidInputError
from memq.format.codec import Compressors
from memq.format.message import Buffer, MessageHeader, check_magic_and_version, decode_message
from memq.format.records import LogMessage, gc_paused

R = TypeVar("R")

BATCH_MAGIC = b"MQBT"
BATCH_VERSION = 1
_PREFIX = struct.Struct("<4sB3xI")
_FIXED = struct.Struct("<IQqqqH")
_ENTRY = struct.Struct("<QII")
_CRC = struct.Struct("<I")
BATCH_PREFIX_SIZE = _PREFIX.size
_MIN_HEADER = _PREFIX.size + _FIXED.size + _CRC.size
# Bounds what a reader allocates for a header: ~4M Messages, far beyond any real batch.
MAX_BATCH_HEADER_BYTES = 64 * 1024 * 1024
_MAX_U32 = 0xFFFFFFFF
#: LogMessages one part (one topic's batch) may hold. A broker seals a batch before a Message
#: would take it past this, and refuses a single Message holding more, so a record's index in its
#: part always fits the low bits of its Kafka offset (memq.kafka_api.offsets). 16.7M records is
#: 16x the default `batch_messages`; a fuller part could only come from tiny, highly compressed records.
PART_RECORD_BITS = 24
MAX_PART_LOGMESSAGES = 1 << PART_RECORD_BITS


@dataclass(frozen=True, slots=True)
class BatchHeader:
    version: int
    message_count: int
    logmessage_count: int
    min_timestamp_ms: int
    max_timestamp_ms: int
    created_ms: int
    broker_id: str
    header_size: int
    message_ranges: tuple[tuple[int, int], ...]  # absolute (start, end) of each Message
    message_counts: tuple[int, ...]              # LogMessages in each Message

    @property
    def object_size(self) -> int:
        """Size of the whole object this header describes."""
        return self.message_ranges[-1][1] if self.message_ranges else self.header_size


def encode_batch(messages: Sequence[Buffer], headers: Sequence[MessageHeader], *,
                 broker_id: str, created_ms: int | None = None) -> list[Buffer]:
    """Chunks (header, then the Messages as given, uncopied) whose concatenation is the object."""
    if len(messages) != len(headers):
        raise InvalidInputError(f"{len(messages)} Messages but {len(headers)} headers")
    if len(messages) > _MAX_U32:
        raise InvalidInputError(f"a batch holds at most {_MAX_U32} Messages")
    bid = broker_id.encode()
    if len(bid) > 0xFFFF:
        raise InvalidInputError(f"broker_id of {len(bid)} bytes is longer than 65535")
    header_size = _MIN_HEADER + len(bid) + _ENTRY.size * len(messages)
    if header_size > MAX_BATCH_HEADER_BYTES:
        raise InvalidInputError(f"batch header of {header_size} bytes is too large")
    index = bytearray()
    offset = header_size
    for i, (msg, h) in enumerate(zip(messages, headers)):
        if len(msg) != h.total_size:
            raise InvalidInputError(
                f"Message {i} has {len(msg)} bytes, its header says {h.total_size}")
        index += _ENTRY.pack(offset, len(msg), h.count)
        offset += len(msg)
    stamped = [h for h in headers if h.count]
    lo = min((h.min_timestamp_ms for h in stamped), default=0)
    hi = max((h.max_timestamp_ms for h in stamped), default=0)
    created = time.time_ns() // 1_000_000 if created_ms is None else created_ms
    try:
        head = b"".join((_PREFIX.pack(BATCH_MAGIC, BATCH_VERSION, header_size),
                         _FIXED.pack(len(messages), sum(h.count for h in headers), lo, hi,
                                     created, len(bid)), bid, index))
    except struct.error as exc:
        raise InvalidInputError(f"batch header field out of range: {exc}") from exc
    return [head + _CRC.pack(crc32c(head)), *messages]


def batch_header_size(prefix: Buffer) -> int:
    """The header size, from the first BATCH_PREFIX_SIZE bytes of an object."""
    n = len(prefix)
    check_magic_and_version(prefix, "batch", BATCH_MAGIC, BATCH_VERSION, BATCH_PREFIX_SIZE)
    if n < BATCH_PREFIX_SIZE:
        raise CorruptDataError(f"batch prefix truncated: {n} of {BATCH_PREFIX_SIZE} bytes")
    size = _PREFIX.unpack_from(prefix)[2]
    if not _MIN_HEADER <= size <= MAX_BATCH_HEADER_BYTES:
        raise CorruptDataError(f"batch header size {size} outside [{_MIN_HEADER}, "
                               f"{MAX_BATCH_HEADER_BYTES}]")
    return size


def decode_batch_header(buf: Buffer) -> BatchHeader:
    """Decode and check the header (CRC, layout, contiguous index) from an object's start."""
    size = batch_header_size(buf)
    if len(buf) < size:
        raise CorruptDataError(f"batch header truncated: {len(buf)} of {size} bytes")
    view = memoryview(buf)[:size]
    if crc32c(view[:-_CRC.size]) != _CRC.unpack_from(view, size - _CRC.size)[0]:
        raise CorruptDataError("batch header CRC32C mismatch")
    count, logcount, lo, hi, created, bid_len = _FIXED.unpack_from(view, _PREFIX.size)
    index_at = _PREFIX.size + _FIXED.size + bid_len
    if size != _MIN_HEADER + bid_len + _ENTRY.size * count:
        raise CorruptDataError(f"batch header size {size} does not fit {count} Messages and a "
                               f"{bid_len}-byte broker id")
    try:
        broker_id = bytes(view[_PREFIX.size + _FIXED.size:index_at]).decode()
    except UnicodeDecodeError as exc:
        raise CorruptDataError(f"batch broker id is not UTF-8: {exc}") from exc
    entries = list(_ENTRY.iter_unpack(view[index_at:size - _CRC.size]))
    ranges = []
    end = size
    for i, (offset, length, _) in enumerate(entries):
        if offset != end:
            raise CorruptDataError(f"batch index: Message {i} starts at {offset}, want {end}")
        end = offset + length
        ranges.append((offset, end))
    counts = tuple(e[2] for e in entries)
    if sum(counts) != logcount:
        raise CorruptDataError(f"batch says {logcount} LogMessages, its index sums to "
                               f"{sum(counts)}")
    if lo > hi:
        raise CorruptDataError(f"batch min timestamp {lo} is after max timestamp {hi}")
    return BatchHeader(BATCH_VERSION, count, logcount, lo, hi, created, broker_id, size,
                       tuple(ranges), counts)


def _log_messages(msg: Buffer, compressors: Compressors) -> tuple[MessageHeader, Sequence[LogMessage]]:
    return decode_message(msg, compressors=compressors)


def iter_batch_messages(obj: Buffer) -> Iterator[memoryview]:
    """The Messages of a whole object as memoryview slices, after checking header and size."""
    return _message_views(obj, decode_batch_header(obj))


def _message_views(obj: Buffer, header: BatchHeader) -> Iterator[memoryview]:
    if len(obj) != header.object_size:
        what = "truncated" if len(obj) < header.object_size else "has trailing bytes"
        raise CorruptDataError(f"batch {what}: {len(obj)} bytes, header says "
                               f"{header.object_size}")
    view = memoryview(obj)
    return (view[start:end] for start, end in header.message_ranges)


def decode_batch(obj: Buffer, *, compressors: Compressors | None = None
                 ) -> tuple[BatchHeader, list[tuple[MessageHeader, Sequence[LogMessage]]]]:
    """Decode a whole object into LogMessages; every Message must agree with the batch index."""
    return decode_batch_as(obj, _log_messages, compressors=compressors)


def decode_batch_rows(obj: Buffer, *, compressors: Compressors | None = None
                      ) -> tuple[BatchHeader, list[tuple[MessageHeader, Sequence[tuple]]]]:
    """As `decode_batch`, msgpack records as plain tuples in LogMessage's field order (`unpack_rows`)."""
    return decode_batch_as(obj, _rows, compressors=compressors)


def _rows(msg: Buffer, compressors: Compressors) -> tuple[MessageHeader, Sequence[tuple]]:
    return decode_message(msg, compressors=compressors, rows=True)


def decode_batch_as(obj: Buffer, decode: Callable[[Buffer, Compressors], tuple[MessageHeader, R]], *,
                    compressors: Compressors | None = None) -> tuple[BatchHeader, list[tuple[MessageHeader, R]]]:
    """Decode a whole object, each Message by `decode` (LogMessages for `decode_batch`, Arrow
    columns for Spark: `memq.format.columns`); every Message must agree with the batch index.

    One GC pause for the whole object, not one per Message: the records stay alive, so
    collections between Messages would rescan them (see `gc_paused`)."""
    header = decode_batch_header(obj)
    comp = compressors or Compressors()
    out = []
    with gc_paused():
        for i, msg in enumerate(_message_views(obj, header)):
            mh, records = decode(msg, comp)
            if mh.count != header.message_counts[i]:
                raise CorruptDataError(f"batch Message {i} holds {mh.count} LogMessages, index "
                                       f"says {header.message_counts[i]}")
            if mh.count and not (header.min_timestamp_ms <= mh.min_timestamp_ms
                                 and mh.max_timestamp_ms <= header.max_timestamp_ms):
                raise CorruptDataError(f"batch Message {i} timestamps fall outside the batch "
                                       f"range")
            out.append((mh, records))
    return header, out


def split_parts(obj: Buffer) -> list[memoryview]:
    """The batches of an object stored back to back (one for a topic's own object), each
    checked by its header only (decode each to check its Messages)."""
    view = memoryview(obj)
    parts: list[memoryview] = []
    at = 0
    while at < len(view):
        end = at + decode_batch_header(view[at:]).object_size
        if end > len(view):
            raise CorruptDataError(f"part {len(parts)} at byte {at} is truncated: it ends at {end}, "
                                   f"the object at {len(view)}")
        parts.append(view[at:end])
        at = end
    return parts


def object_crc32c(chunks: Iterable[Buffer]) -> int:
    """CRC32C of the concatenation of `chunks` (the Notification's whole-object checksum)."""
    crc = 0
    for chunk in chunks:
        crc = crc32c(chunk, crc)
    return crc
