"""Message bodies decoded to Arrow columns instead of LogMessages: the Spark reader's decode.

Every codec ends as the columns of `arrow_body.body_schema()` without a LogMessage per
record: a Codec.ARROW body is those columns already; a Kafka RecordBatch is located field by
field in bulk, all of an object's at once (`kafka_columns`); a msgpack body is located field
by field by a compiled walk (`msgpack_columns`), or, when it is not in memq's own layout,
unpacked by msgpack's C loop and transposed in C (`records.unpack_columns`), each column one
`pa.array` call when first asked for, so a query that reads no headers never converts them.
Located fields (`spans.SpanColumns`) stay byte spans until a column over all of an object's
Messages is asked for (`concat_column`), then are copied once, straight into it.
A body that does not decode, or a column that does not convert, is a CorruptDataError, as
on the LogMessage path. Needs pyarrow (imported on first use, as in `arrow_body`), numpy
and, for msgpack bodies, numba.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Collection, Protocol, Sequence

from memq.errors import CorruptDataError
from memq.format.arrow_body import COLUMNS, _pyarrow, body_schema, decode_arrow_body
from memq.format.batch import BatchHeader, decode_batch_as
from memq.format.codec import Codec, Compressors
from memq.format.kafka_columns import KafkaRecords, locate_kafka_columns, split_kafka_records
from memq.format.message import Buffer, MessageHeader, verify_message
from memq.format.records import unpack_columns

if TYPE_CHECKING:
    import pyarrow as pa

_NOT_NULL = ("value", "headers", "timestamp_ms")


class Columns(Protocol):
    """One Message's records as Arrow columns, named as LogMessage's fields."""

    def __len__(self) -> int: ...
    def column(self, name: str) -> pa.Array: ...


@dataclass(frozen=True, slots=True)
class ArrowColumns:
    """A Codec.ARROW body: its stored columns as they are."""

    batch: pa.RecordBatch

    def __len__(self) -> int:
        return int(self.batch.num_rows)

    def column(self, name: str) -> pa.Array:
        return self.batch.column(name)


@dataclass(frozen=True, slots=True)
class MsgpackColumns:
    """A msgpack body's fields, one tuple each (LogMessage field order), converted on first use;
    `keep` converts some now and lets every field's Python objects go."""

    fields: list[tuple | None]
    count: int
    _built: dict[str, pa.Array] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.count

    def column(self, name: str) -> pa.Array:
        if name not in self._built:
            values = self.fields[COLUMNS.index(name)]
            if values is None:
                raise KeyError(f"Message body field {name} was not kept")
            pa = _pyarrow()
            typ = body_schema().field(name).type
            try:
                array = pa.array(values, typ)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                raise CorruptDataError(f"Message body field {name} is not {typ}: {exc}") from exc
            if name in _NOT_NULL and array.null_count:
                raise CorruptDataError(f"Message body field {name} holds nulls")
            self._built[name] = array
        return self._built[name]

    def keep(self, names: Collection[str]) -> None:
        """Convert `names` now and drop the decoded objects: converting Message by Message,
        while its objects are still in the CPU cache, made a Spark read's decode ~12% cheaper
        than converting after a whole object's Messages were unpacked."""
        for name in names:
            self.column(name)
        self.fields[:] = [None] * len(self.fields)


def concat_column(parts: Sequence[Columns], name: str) -> pa.Array:
    """LogMessage field `name` of the records of `parts`, one after the other, as one array.
    When every part is located spans, each field's bytes are gathered from every Message's
    buffer straight into the one array (an array per Message, then concatenated, copied every
    byte twice: the concatenation was ~11% of a Spark read's CPU); otherwise the parts' arrays
    are concatenated (a batch object may mix codecs)."""
    if parts and not any(isinstance(p, (ArrowColumns, MsgpackColumns)) for p in parts):
        from memq.format.spans import SpanColumns, span_column   # numba: loaded already, by the walk that found them

        if all(isinstance(p, SpanColumns) for p in parts):
            return span_column(parts, name)   # type: ignore[arg-type]  # checked just above
    pa = _pyarrow()
    arrays = [p.column(name) for p in parts]
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays) if arrays \
        else pa.array([], body_schema().field(name).type)


def decode_message_columns(buf: Buffer, compressors: Compressors) -> tuple[MessageHeader, Columns]:
    """Verify and decode one Message to columns: `decode_message`'s checks, no LogMessages."""
    header, columns = _decode(buf, compressors)
    if isinstance(columns, KafkaRecords):
        return header, locate_kafka_columns([columns])[0]
    return header, columns


def decode_batch_columns(obj: Buffer, *, compressors: Compressors | None = None,
                         fields: Collection[str] | None = None
                         ) -> tuple[BatchHeader, list[tuple[MessageHeader, Columns]]]:
    """`decode_batch` with each Message as columns; the fields of all its Kafka batches are
    located in one pass. Given `fields` (LogMessage field names), a msgpack body the walk does
    not take keeps only those columns, built as each Message is decoded, while its objects
    are in the CPU cache."""
    header, messages = decode_batch_as(obj, partial(_decode, fields=fields), compressors=compressors)
    located = iter(locate_kafka_columns([c for _, c in messages if isinstance(c, KafkaRecords)]))
    return header, [(h, next(located) if isinstance(c, KafkaRecords) else c) for h, c in messages]


def _decode(buf: Buffer, compressors: Compressors, fields: Collection[str] | None = None
            ) -> tuple[MessageHeader, Columns | KafkaRecords]:
    """A Message's columns, or for Codec.KAFKA its records' bounds (fields located by the caller)."""
    header = verify_message(buf)
    body = memoryview(buf)[header.header_size:]
    columns: Columns | KafkaRecords
    if header.codec is Codec.KAFKA:
        columns = split_kafka_records(body, compressors.zstd_decompressor())
    elif header.codec is Codec.ARROW:
        if header.raw_length != header.body_length:
            raise CorruptDataError(f"Codec.ARROW raw length {header.raw_length}, body length {header.body_length}")
        columns = ArrowColumns(decode_arrow_body(body, header.count))
    else:
        columns = _msgpack_columns(compressors.decompress(header.codec, body, header.raw_length), header.count,
                                   fields)
    if len(columns) != header.count:
        raise CorruptDataError(f"Message body holds {len(columns)} records, header says {header.count}")
    return header, columns


def _msgpack_columns(raw: bytes | memoryview, count: int, fields: Collection[str] | None) -> Columns:
    """Located by the compiled walk (`msgpack_columns`, imported here: numba loads in ~0.2 s
    and only a column reader needs it); a body it does not take is unpacked by msgpack, so
    its rows, and its errors, are what they were before the walk."""
    from memq.format.msgpack_columns import locate_msgpack_columns

    located = locate_msgpack_columns(raw, count)
    if located is not None:
        return located
    values: list[tuple | None] = list(unpack_columns(raw, count))
    columns = MsgpackColumns(values, count)
    if fields is not None:
        columns.keep(fields)
    return columns
