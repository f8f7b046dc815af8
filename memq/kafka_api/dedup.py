"""Which Messages of a part a Kafka reader does not get: copies of a Message already announced (pure).

A producer's retry can be stored twice (the broker's recent-Message set forgot it, another
broker took the retry, or a notification whose publish timed out landed and was published
again). memq's Consumer drops such copies by (producer id, epoch, sequence) as it reads, but
what it drops depends on where it started; a Kafka reader's offsets must not. So the rule is a
function of the partition alone: a Message of the part at notification offset N is dropped
when the same id is in a part announced at N - `WINDOW_NOTES` .. N - 1 of the same notification
partition, or earlier in its own part. Every broker, every reader, every restart drops the same
records; their offsets are left as gaps, and every other record keeps its offset.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from memq.errors import CorruptDataError
from memq.format import decode_batch_header, decode_message_header

MessageId = tuple[int, int, int]   # (producer id, epoch, sequence)

#: How many earlier notifications of its partition a part's Messages are compared with. A
#: republished notification lands right after its first (same key: same partition); a retry
#: stored again is a few objects later. A reader starting cold loads the ids of this many parts.
WINDOW_NOTES = 16


class PartMessage(NamedTuple):
    """What a reader needs of one Message of a part without decoding it: its id, and for the
    audit its record count, digest (CRC32C of its body) and seal time."""

    id: MessageId
    records: int
    digest: int
    created_ms: int


def part_messages(part: bytes | memoryview) -> tuple[PartMessage, ...]:
    """A part's Messages, in order, from their headers (no body decoded)."""
    view = memoryview(part)
    header = decode_batch_header(view)
    out = []
    for start, end in header.message_ranges:
        if end > len(view):
            raise CorruptDataError(f"part of {len(view)} bytes has a Message ending at {end}")
        mh = decode_message_header(view[start:end])
        out.append(PartMessage((mh.producer_id, mh.epoch, mh.sequence), mh.count, mh.body_crc32c, mh.created_ms))
    return tuple(out)


def duplicates(earlier: Iterable[Sequence[MessageId]], ids: Sequence[MessageId]) -> frozenset[int]:
    """Indexes of the Messages of `ids` (a part) a reader does not get: those whose id is in one
    of the `earlier` parts (the window before it) or earlier in the part itself."""
    seen: set[MessageId] = set()
    for e in earlier:
        seen.update(e)
    dropped = []
    for i, mid in enumerate(ids):
        if mid in seen:
            dropped.append(i)
        else:
            seen.add(mid)
    return frozenset(dropped)
