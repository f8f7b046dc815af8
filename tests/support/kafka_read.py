"""Parts as memq stores them, read back as Kafka-placed records, and notifications to point at them: the Kafka read path under test."""

from __future__ import annotations

from memq.format import Codec, LogMessage, encode_batch, encode_message, verify_message
from memq.format.kafka_records import decode_kafka_records, split_kafka_batches, verify_kafka_batch
from memq.format.message import encode_kafka_message
from tests.support.kafka_frames import record_batch
from memq.format import Notification
from memq.errors import CorruptDataError
from memq.notify.consumer import NotificationRecord


def part_of(groups: list[tuple[str, list[LogMessage]]]) -> bytes:
    """A part (one Batch) of Messages: ("memq", records) as memq's Producer writes them (zstd),
    ("kafka", records) as the listener stores a Kafka producer's batch."""
    msgs, headers = [], []
    for seq, (kind, recs) in enumerate(groups):
        if kind == "memq":
            m = encode_message(recs, producer_id=1, epoch=0, sequence=seq, codec=Codec.ZSTD)
            msgs.append(m)
            headers.append(verify_message(m))
        else:
            b = record_batch(recs, codec="lz4", producer_id=9, base_sequence=seq)
            m, h = encode_kafka_message(b, verify_kafka_batch(b), producer_id=2, epoch=0, sequence=seq)
            msgs.append(bytes(m))
            headers.append(h)
    return b"".join(bytes(c) for c in encode_batch(msgs, headers, broker_id="b1", created_ms=1))


def recs(tag: str, n: int) -> list[LogMessage]:
    return [LogMessage(b"%s%d" % (tag.encode(), i), b"k" if i % 2 else None, (("h", b"%d" % i),), 100 + i)
            for i in range(n)]


def read_placed(buf: bytes) -> list[tuple[int, LogMessage]]:
    """(offset, record) of every record in a Fetch response's records field, as a client reads them."""
    out = []
    for b in split_kafka_batches(buf):
        base = verify_kafka_batch(b).base_offset
        out += [(base + i, r) for i, r in enumerate(decode_kafka_records(b))]
    return out


def note(offset: int, count: int) -> NotificationRecord:
    n = Notification(v=2, topic="t", bucket="b", key=f"k{offset}", size=1, header_size=1, message_count=1,
                     logmessage_count=count, min_timestamp_ms=1000 * offset, max_timestamp_ms=1000 * offset + 999,
                     crc32c=0, broker_id="b1",
                     attempt=1, created_ms=0)
    return NotificationRecord(0, offset, 0, n)


class ListedNotes:
    """One notification partition as a list (what a tail's consumer reads); the `bad` offsets are
    not parseable; counts how often it is polled."""

    def __init__(self, records: list[NotificationRecord], bad: frozenset[int] = frozenset()) -> None:
        self.records = records
        self.bad = bad
        self.position = 0
        self.polls = 0

    def assign(self, offsets: dict[int, int]) -> None:
        (self.position,) = offsets.values()

    def poll(self, timeout_s: float, max_records: int) -> list[NotificationRecord]:
        self.polls += 1
        out: list[NotificationRecord] = []
        for r in self.records[self.position:self.position + max_records]:
            if r.offset in self.bad:
                if out:
                    break
                raise CorruptDataError(f"notification at offset {r.offset}: not JSON")
            out.append(r)
        self.position += len(out)
        return out

    def cached_watermarks(self, partition: int) -> tuple[int, int]:
        return 0, len(self.records)

    def close(self) -> None:
        pass
