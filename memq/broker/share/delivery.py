"""What a share fetch takes from a part and what an acknowledgement applies, pure: no I/O.

The share service (`service.Shares`) reads notifications and framed parts through the broker's
read path; these functions decide, given a part in memory, which of its records a member
acquires and which RecordBatches carry them, how an acknowledgement's batches apply to a
share-partition, and what an archived record looks like in the group's dead-letter topic.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from memq.format import LogMessage
from memq.format.kafka_records import decode_kafka_records
from memq.kafka_api.records import FramedBatch, FramedPart, place
from memq.kafka_api.share import AckBatch, AckType, SharePartitionData
from memq.log.model import OffsetScheme

from .partition import AckOutcome, Archived, SharePartition


@dataclass(slots=True)
class Budget:
    """What a ShareFetch may still take: records and bytes (both best effort: whole batches go)."""

    records: int
    nbytes: int


def ack_runs(batches: Iterable[AckBatch]) -> list[tuple[int, int, AckOutcome]]:
    """An acknowledgement's batches as (first, last, outcome) runs; gaps (no record) are dropped."""
    runs: list[tuple[int, int, AckType]] = []
    for b in batches:
        if len(b.types) == 1:
            runs.append((b.first, b.last, b.types[0]))
        else:
            runs += [(b.first + i, b.first + i, t) for i, t in enumerate(b.types)]
    return [(first, last, AckOutcome(int(t))) for first, last, t in runs if t is not AckType.GAP]


def acknowledge(sp: SharePartition, member: str, batches: Iterable[AckBatch]) -> tuple[bool, list[Archived]]:
    """Apply `member`'s acknowledgement: False if a record of it was not acquired by `member`
    (the others still apply); the records it archived."""
    ok, archived = True, []
    for first, last, outcome in ack_runs(batches):
        good, gone = sp.acknowledge(member, first, last, outcome)
        ok = ok and good
        archived += gone
    return ok, archived


def whole_batches(part: FramedPart, start: int, records: int, nbytes: int) -> tuple[FramedBatch, ...]:
    """The part's batches from record `start` on, whole, until `records` records or `nbytes` bytes
    are reached (a ShareFetch's max_records is best effort in Kafka too: whole batches go, so a
    client never parses a batch to use a slice of it)."""
    out: list[FramedBatch] = []
    for b in part.batches:
        if b.first_index + b.count <= start:
            continue
        if out and (records <= 0 or nbytes <= 0):
            break
        out.append(b)
        records -= b.first_index + b.count - max(start, b.first_index)
        nbytes -= len(b.data)
    return tuple(out)


def take(sp: SharePartition, member: str, out: SharePartitionData, buf: bytearray, offsets: list[int],
         budget: Budget) -> None:
    """Acquire `offsets` for `member`; what it got goes into `out` with `buf` (its batches)."""
    ranges = sp.acquire(member, offsets)
    if not ranges:
        return
    out.records += buf
    out.acquired += ranges
    budget.records -= sum(last - first + 1 for first, last, _ in ranges)
    budget.nbytes -= len(buf)


def take_new(sp: SharePartition, member: str, out: SharePartitionData, budget: Budget, scheme: OffsetScheme,
             note: int, count: int, part: FramedPart) -> bool:
    """Acquire new records of the part at notification `note` (`count` records) from the window's
    end; True when the part is done with (the window's end moved past it), so the next is read."""
    at, index = scheme.position_of(sp.end)
    start = index if note == at else 0
    buf = bytearray()
    wanted = FramedPart(whole_batches(part, start, min(budget.records, sp.room()), budget.nbytes))
    base = scheme.start_of(note)
    after = place(wanted, base, start, buf, budget.nbytes, at_least_one=not out.records)
    if after > start:
        take(sp, member, out, buf, list(range(base + start, base + after)), budget)
    if sp.end < scheme.end_of(note, count):
        return False   # stopped inside the part (a limit, or the window is full)
    sp.skip_to(scheme.start_of(note + 1))
    return True


def take_again(sp: SharePartition, member: str, out: SharePartitionData, budget: Budget, scheme: OffsetScheme,
               note: int, offsets: list[int], part: FramedPart) -> None:
    """Acquire again the redeliverable `offsets` of the part at notification `note` (ascending)."""
    buf = bytearray()
    base = scheme.start_of(note)
    place(part, base, offsets[0] - base, buf, max(budget.nbytes, 1), at_least_one=True)
    take(sp, member, out, buf, offsets, budget)


def by_note(offsets: Iterable[int], scheme: OffsetScheme) -> dict[int, list[int]]:
    """Offsets grouped by the notification (the part) holding them, in order."""
    out: dict[int, list[int]] = {}
    for off in offsets:
        out.setdefault(scheme.position_of(off)[0], []).append(off)
    return out


def record_at(part: FramedPart, index: int) -> LogMessage | None:
    """The part's record at `index` (None: not in its batches)."""
    for b in part.batches:
        if b.first_index <= index < b.first_index + b.count:
            return decode_kafka_records(b.data)[index - b.first_index]
    return None


def dead_letter(a: Archived, rec: LogMessage | None, group: str, topic: str, partition: int) -> LogMessage:
    """Archived record `a` (`rec`: its record, None when it could not be read) as it goes to the
    dead-letter topic: its key, value and headers, and headers saying why and from where."""
    headers = (("reason", a.reason.encode()), ("topic", topic.encode()), ("partition", b"%d" % partition),
               ("offset", b"%d" % a.offset), ("group", group.encode()), ("delivery_count", b"%d" % a.deliveries))
    return LogMessage(rec.value if rec else b"", rec.key if rec else None,
                      (rec.headers if rec else ()) + headers, rec.timestamp_ms if rec else 0)
