"""A stored part as Kafka RecordBatches v2, and those batches placed at their Kafka offsets (pure).

`frame_part` turns a part (one topic's Batch) into batches once: a Kafka-produced Message
(Codec.KAFKA) is its producer's RecordBatch, served as stored; each run of memq-produced
Messages (any other codec) is decoded and framed as batches of about `FRAMED_BATCH_BYTES` of
records, compressed in the codec the broker passes (the topic's `kafka_compression`:
`framing_codec`; compaction writes memq's own records in it too). Each batch keeps the index of its first record in the part,
so `place` writes a Kafka offset into its base offset field (outside the batch CRC) as it is
copied into a Fetch response, and the partition leader epoch as -1 (unknown, as memq's
Metadata says); a reader whose Fetch version predates zstd (KIP-110: v10) gets zstd batches
decompressed as they are placed.

Which codec by default: gzip, the one every tested client decodes without a plug-in (kafkajs
decodes gzip alone; kafka-python needs extra libraries for snappy and lz4); measured by
`python -m bench kafka_framing` (docs/DECISIONS.md, "Records for every reader"). Batches of
1 MiB compressed cost librdkafka ~40% of its read rate against 128 KiB ones, hence the size.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import zstandard

from memq.config import BrokerConfig, TopicConfig
from memq.errors import CorruptDataError
from memq.format import Codec, LogMessage, decode_batch_header, decode_message, decode_message_header
from memq.format.kafka_records import (ZSTD_LEVEL, KafkaCodec, encode_kafka_batch, peek_kafka_batch,
                                       verify_kafka_batch, without_compression)


#: A run of memq-produced records is framed in batches of about this many bytes of records: a
#: consumer gets any one batch whole (KIP-74), so one part's decoded records must not become one
#: batch larger than a client accepts (librdkafka: receive.message.max.bytes), and librdkafka
#: reads compressed batches of this size as fast as uncompressed ones of 1 MiB (see above).
FRAMED_BATCH_BYTES = 128 * 1024
RECORD_OVERHEAD = 16   # a record's framing beside its key and value, roughly (headers add theirs)
_BASE = struct.Struct(">q")


def framing_codec(topic: TopicConfig | None, broker: BrokerConfig) -> KafkaCodec:
    """The codec memq frames a topic's own records in: the topic's `kafka_compression`, the
    broker's for "auto" or a topic this broker has no settings of."""
    name = topic.kafka_compression if topic is not None and topic.kafka_compression != "auto" else None
    return KafkaCodec[(name or broker.kafka_compression).upper()]

_EPOCH_AT = 12
_EPOCH_END = 16
_NO_EPOCH = struct.pack(">i", -1)


@dataclass(frozen=True, slots=True)
class FramedBatch:
    first_index: int   # of its first record in the part
    count: int
    data: bytes        # a RecordBatch v2 with base offset 0, its records maybe compressed


@dataclass(frozen=True, slots=True)
class FramedPart:
    batches: tuple[FramedBatch, ...]
    count: int = 0     # records in the part, dropped ones included: a reader past its batches is past it

    @property
    def nbytes(self) -> int:
        return sum(len(b.data) for b in self.batches)


def frame_part(part: bytes | memoryview, drop: frozenset[int] = frozenset(),
               codec: KafkaCodec = KafkaCodec.ZSTD) -> FramedPart:
    """The part's records as RecordBatches, but for those of the Messages at the indexes in
    `drop` (`kafka_api.dedup`: left as a gap, no batch spans it), memq-produced records
    compressed with `codec` (the topic's `kafka_compression`); CorruptDataError (a FormatError)
    on bad bytes."""
    zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL) if codec is KafkaCodec.ZSTD else None   # one per call:
    # frame_part runs on any thread

    def batch(run: list[LogMessage]) -> bytes:
        return encode_kafka_batch(run, codec, zstd=zstd)
    view = memoryview(part)
    header = decode_batch_header(view)
    out: list[FramedBatch] = []
    run: list[LogMessage] = []
    run_start = run_bytes = index = 0
    for m, ((start, end), count) in enumerate(zip(header.message_ranges, header.message_counts)):
        if end > len(view):
            raise CorruptDataError(f"part of {len(view)} bytes has a Message ending at {end}")
        if m in drop:
            if run:
                out.append(FramedBatch(run_start, len(run), batch(run)))
                run = []
            index += count
            continue
        msg = view[start:end]
        mh = decode_message_header(msg)
        if mh.codec is Codec.KAFKA:
            if run:
                out.append(FramedBatch(run_start, len(run), batch(run)))
                run = []
            body = msg[mh.header_size:]
            if verify_kafka_batch(body).count != count:
                raise CorruptDataError(f"Kafka batch at byte {start} does not hold the {count} records indexed")
            out.append(FramedBatch(index, count, bytes(body)))
        else:
            records = decode_message(msg)[1]
            if len(records) != count:
                raise CorruptDataError(f"Message at byte {start} holds {len(records)} records, {count} indexed")
            for i, rec in enumerate(records):
                if not run:
                    run_start, run_bytes = index + i, 0
                run.append(rec)
                run_bytes += len(rec.value or b"") + len(rec.key or b"") + RECORD_OVERHEAD   # None: a tombstone
                if run_bytes >= FRAMED_BATCH_BYTES:
                    out.append(FramedBatch(run_start, len(run), batch(run)))
                    run = []
        index += count
    if run:
        out.append(FramedBatch(run_start, len(run), batch(run)))
    return FramedPart(tuple(out), index)


def place(part: FramedPart, part_offset: int, from_index: int, out: bytearray, limit: int, *,
          at_least_one: bool = False, zstd: bool = True) -> int:
    """Append the part's batches holding records at `from_index` or later to `out`, each with its
    Kafka base offset (`part_offset`, its first record's offset, plus its first index), while `out` stays within `limit` bytes; with `at_least_one` and `out`
    empty, the first batch goes whatever its size (KIP-74: a batch larger than the limits must
    not stall its reader); without `zstd` (the reader's Fetch predates it) zstd batches go
    decompressed. Returns the index after the last record placed (`from_index` if none), or the
    part's `count` once every batch from `from_index` on was placed (dropped records at its end
    are passed too)."""
    after = from_index
    for b in part.batches:
        if b.first_index + b.count <= from_index:
            continue   # the reader is past it (a Kafka client skips records before its offset)
        data = b.data
        if not zstd and peek_kafka_batch(data).codec is KafkaCodec.ZSTD:
            data = without_compression(data)
        if (out or not at_least_one) and len(out) + len(data) > limit:
            return after
        out += _BASE.pack(part_offset + b.first_index)
        out += data[8:_EPOCH_AT]
        out += _NO_EPOCH
        out += data[_EPOCH_END:]
        after = b.first_index + b.count
    return max(after, part.count)
