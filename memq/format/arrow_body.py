"""Codec.ARROW Message bodies: a Message's LogMessages as one Arrow IPC stream of columns.

For topics that feed Spark (or any Arrow engine): a reader takes the columns as stored
instead of building Python objects per record and converting them back to columns (msgpack
decoding plus that Arrow build were most of a Spark read's CPU; docs/DECISIONS.md). Arrow
compresses the buffers with LZ4 (frame): reading them back costs ~0.05 s per 1M 100-byte
records, zstd's ~0.17 s (for ~12% fewer bytes), the read being what such a topic is for.
Arrow's own threads stay off: a decoder runs in one worker thread by design. The broker
still never decodes a body: it checks CRCs and lengths, whatever the codec. pyarrow is
needed only where such bodies are written or read (`pip install memq[arrow]`; Spark brings it).
"""

from __future__ import annotations

import importlib
from functools import cache
from itertools import repeat
from types import ModuleType
from typing import TYPE_CHECKING, Iterator, Sequence, overload

from memq.errors import CorruptDataError, InvalidInputError, UnsupportedCodecError
from memq.format.records import LogMessage

if TYPE_CHECKING:
    import pyarrow as pa

COLUMNS = LogMessage._fields     # value, key, headers, timestamp_ms, message_id
_NOT_NULL = ("value", "headers", "timestamp_ms")
_tuple_new = tuple.__new__


def _pyarrow() -> ModuleType:
    try:
        return importlib.import_module("pyarrow")
    except ImportError:
        raise UnsupportedCodecError("Codec.ARROW bodies need pyarrow (pip install memq[arrow])") from None


@cache
def body_schema() -> pa.Schema:
    """The one schema of a Codec.ARROW body: LogMessage's fields in order (built once: a
    reader asks for it per Message and column, and building it costs ~20 us)."""
    pa = _pyarrow()
    header = pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary(), nullable=False)])
    return pa.schema([pa.field("value", pa.binary(), nullable=False), pa.field("key", pa.binary()),
                      pa.field("headers", pa.list_(pa.field("item", header, nullable=False)), nullable=False),
                      pa.field("timestamp_ms", pa.int64(), nullable=False), pa.field("message_id", pa.binary())])


def encode_arrow_body(records: Sequence[LogMessage]) -> pa.Buffer:
    """The records (LogMessages or 5-tuples in their field order) as an Arrow IPC stream of one
    RecordBatch; InvalidInputError naming the field Arrow cannot take."""
    pa = _pyarrow()
    schema = body_schema()
    fields = list(zip(*records)) if records else [()] * len(COLUMNS)
    if len(fields) != len(COLUMNS):
        raise InvalidInputError(f"records must be LogMessages (or {len(COLUMNS)}-tuples)")
    arrays = []
    for field, values in zip(schema, fields):
        try:
            arrays.append(pa.array(values, field.type))
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            raise InvalidInputError(f"LogMessage field {field.name} cannot be encoded as Arrow "
                                    f"{field.type}: {exc}") from exc
        if not field.nullable and arrays[-1].null_count:
            raise InvalidInputError(f"LogMessage field {field.name} must not be None")
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=pa.ipc.IpcWriteOptions(compression="lz4", use_threads=False)) as w:
        w.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
    return sink.getvalue()


def decode_arrow_body(body: bytes | memoryview, count: int) -> pa.RecordBatch:
    """The body's one RecordBatch of exactly `count` rows in `body_schema()`, fully validated
    (offsets, UTF-8, nulls), without copying the buffers; CorruptDataError otherwise."""
    pa = _pyarrow()
    try:
        batches = list(pa.ipc.open_stream(pa.py_buffer(body), options=pa.ipc.IpcReadOptions(use_threads=False)))
        if len(batches) != 1:
            raise CorruptDataError(f"Codec.ARROW body holds {len(batches)} record batches, want 1")
        (batch,) = batches
        batch.validate(full=True)
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise CorruptDataError(f"Codec.ARROW body is not a valid Arrow IPC stream: {exc}") from exc
    if not batch.schema.equals(body_schema()):
        raise CorruptDataError(f"Codec.ARROW body has schema {batch.schema}, want {body_schema()}")
    if batch.num_rows != count:
        raise CorruptDataError(f"Codec.ARROW body holds {batch.num_rows} records, header says {count}")
    headers = batch.column("headers")
    if any(batch.column(c).null_count for c in _NOT_NULL) or headers.values.null_count or \
            any(f.null_count for f in headers.values.flatten()):
        raise CorruptDataError(f"Codec.ARROW body has nulls in a non-null column ({', '.join(_NOT_NULL)}, "
                               "header keys and values)")
    return batch


def to_log_messages(batch: pa.RecordBatch) -> list[LogMessage]:
    """A decoded body's rows as LogMessages (what every non-Arrow reader gets)."""
    value, key, headers, timestamp_ms, message_id = (batch.column(c) for c in COLUMNS)
    items = headers.values.flatten()
    pairs = list(zip(items[0].to_pylist(), items[1].to_pylist()))
    bounds = headers.offsets.to_pylist()
    header_tuples = [tuple(pairs[a:b]) for a, b in zip(bounds, bounds[1:])]
    return list(map(_tuple_new, repeat(LogMessage), zip(value.to_pylist(), key.to_pylist(), header_tuples,
                                                         timestamp_ms.to_pylist(), message_id.to_pylist())))


class ArrowRecords(Sequence[LogMessage]):
    """A Codec.ARROW Message's LogMessages: `batch` holds the columns, turned into LogMessage
    tuples only when first indexed or iterated, so an Arrow reader (Spark) never builds them.
    Equal to any sequence of the same LogMessages, as the list a msgpack body decodes to."""

    __slots__ = ("batch", "_logs")
    __hash__ = None  # type: ignore[assignment]   # mutable-equal like a list

    def __init__(self, batch: pa.RecordBatch) -> None:
        self.batch = batch
        self._logs: list[LogMessage] | None = None

    def _list(self) -> list[LogMessage]:
        if self._logs is None:
            self._logs = to_log_messages(self.batch)
        return self._logs

    def __len__(self) -> int:
        return int(self.batch.num_rows)

    @overload
    def __getitem__(self, i: int) -> LogMessage: ...
    @overload
    def __getitem__(self, i: slice) -> list[LogMessage]: ...

    def __getitem__(self, i: int | slice) -> LogMessage | list[LogMessage]:
        return self._list()[i]

    def __iter__(self) -> Iterator[LogMessage]:
        return iter(self._list())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and self._list() == list(other)
