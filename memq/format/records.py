"""LogMessage and the bulk msgpack encoding of a Message body.

A body is one msgpack array of records, each record the 5-array
`[value, key, headers, timestamp_ms, message_id]` in `LogMessage` field order. Packing and
unpacking run inside msgpack's C code; the only per-record Python-visible step on decode is
re-typing each decoded tuple as a `LogMessage` (`tuple.__new__` via `map`, still C). Decoders
run under `gc_paused`. Decision and measurements: docs/DECISIONS.md.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from itertools import repeat
from operator import itemgetter
from typing import Iterator, NamedTuple, Sequence

import msgpack

from memq.errors import CorruptDataError, InvalidInputError

RECORD_FIELDS = 5
_timestamp_of = itemgetter(3)
_tuple_new = tuple.__new__


class LogMessage(NamedTuple):
    """What applications write and read. A NamedTuple: decoding builds them in bulk in C."""

    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = 0  # 0 = "stamp with now" at send time
    message_id: bytes | None = None


def timestamp_range(records: Sequence[LogMessage]) -> tuple[int, int]:
    """(min, max) timestamp_ms of `records`, (0, 0) when empty."""
    if not records:
        return 0, 0
    stamps = list(map(_timestamp_of, records))
    # Sorting is linear on the usual non-decreasing stamps and, with its int-only compare,
    # about twice as fast as min() plus max().
    stamps.sort()
    return stamps[0], stamps[-1]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Defer the cyclic GC for the block: the one place decoders pause it.

    Decoding builds thousands of tuples per Message (~10^5 per batch), each a counted GC
    allocation, so young collections keep scanning the fresh records (and, in a consumer,
    escalate to full collections over every live record). Decoded records hold only bytes,
    ints, str and tuples of them, so they form no reference cycles and deferring is safe.
    The enabled flag is process-wide: nested blocks, or a block entered while the GC is off,
    change nothing and the outermost block restores it. The trade-off is that other threads'
    garbage waits for the few ms of a decode, and a thread that turns the GC off during
    another thread's block finds it back on when that block ends.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def check_records(records: Sequence[LogMessage]) -> None:
    """InvalidInputError unless each record is a LogMessage or a 5-tuple in its field order.

    One `type` pass (in C) settles the usual all-LogMessage case; callers that built the
    tuples themselves (the producer) skip it.
    """
    kinds = set(map(type, records))
    if kinds and kinds != {LogMessage} and not (
            kinds <= {LogMessage, tuple} and set(map(len, records)) == {RECORD_FIELDS}):
        raise InvalidInputError(f"records must be LogMessages (or {RECORD_FIELDS}-tuples), "
                                f"got {sorted(map(str, kinds))}")


@contextmanager
def packed_records(records: Sequence[LogMessage], packer: msgpack.Packer
                   ) -> Iterator[memoryview]:
    """The records msgpacked as arrays, in one `pack` call: a view into `packer`'s buffer,
    valid in the block (viewing instead of taking `bytes` saves a body copy).

    Field types are left to msgpack; when it refuses one, a fallback scan (only then) names
    the first record it cannot pack in the InvalidInputError.
    """
    try:
        try:
            packer.pack(records if isinstance(records, list) else list(records))
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidInputError(f"LogMessage fields cannot be encoded: {_first_unpackable(records)}: "
                                    f"{exc}") from exc
        with packer.getbuffer() as raw:
            yield raw
    finally:
        packer.reset()


def _first_unpackable(records: Sequence[LogMessage]) -> str:
    for i, r in enumerate(records):
        try:
            msgpack.packb(r)
        except (TypeError, ValueError, OverflowError):
            return f"record {i}"
    return "a record"


def _unpack_body(raw: bytes | memoryview, count: int) -> tuple:
    """The body's `count` records as msgpack's tuples; CorruptDataError if it is not msgpack
    or holds another number of records."""
    try:
        rows = msgpack.unpackb(raw, use_list=False)
    except Exception as exc:  # msgpack raises several unrelated types on malformed input
        raise CorruptDataError(f"Message body is not valid msgpack: {exc!r}") from exc
    if type(rows) is not tuple or len(rows) != count:
        got = len(rows) if type(rows) is tuple else type(rows).__name__
        raise CorruptDataError(f"Message body holds {got} records, header says {count}")
    return rows


def unpack_records(raw: bytes | memoryview, count: int) -> list[LogMessage]:
    """Decode a body into exactly `count` LogMessages; CorruptDataError on any mismatch."""
    return list(map(_tuple_new, repeat(LogMessage), unpack_rows(raw, count)))


def unpack_rows(raw: bytes | memoryview, count: int) -> tuple[tuple, ...]:
    """As `unpack_records`, but the records are plain tuples in LogMessage's field order: for a
    reader that builds its own record type from them (the Consumer's ConsumerRecord), the
    LogMessage copy of each was an allocation it threw away (and a tuple subclass that every GC
    collection traverses, where a plain tuple of atoms is untracked by the first)."""
    rows = _unpack_body(raw, count)
    # Shape only: field types are trusted once the body CRC matched (checking them would
    # cost more per record than the decode itself).
    if rows and set(map(type, rows)) != {tuple}:
        raise CorruptDataError(f"Message body records are not arrays (each a {RECORD_FIELDS}-field array)")
    if rows and set(map(len, rows)) != {RECORD_FIELDS}:
        raise CorruptDataError(f"Message body records are not {RECORD_FIELDS}-field arrays")
    return rows


def unpack_columns(raw: bytes | memoryview, count: int) -> list[tuple]:
    """Decode a body into its `RECORD_FIELDS` columns (values, keys, headers, timestamps,
    message ids), each a tuple of `count` items; CorruptDataError on any shape mismatch.

    For column readers (Spark): msgpack's C loop builds the records' tuples and `zip`
    transposes them in C, with no LogMessage and no Python step per record."""
    rows = _unpack_body(raw, count)
    if not rows:
        return [()] * RECORD_FIELDS
    try:
        columns = list(zip(*rows, strict=True))   # checks every record's length on the way
    except TypeError as exc:
        raise CorruptDataError(f"Message body records are not arrays: {exc}") from exc
    except ValueError:
        columns = []
    if len(columns) != RECORD_FIELDS:
        raise CorruptDataError(f"Message body records are not {RECORD_FIELDS}-field arrays")
    return columns
