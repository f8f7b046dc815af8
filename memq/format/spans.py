"""Byte spans of decoded buffers to Arrow arrays, no Python object per span.

A columnar decoder (Kafka RecordBatches, msgpack bodies) locates each record's fields as
(start, length) in the decompressed buffer (`SpanColumns`); an Arrow binary array needs the
bytes back to back. One compiled call per buffer sums the lengths into the array's offsets
and copies each span with one memcpy: 1000 spans of 12 / 100 bytes took ~9 / ~11 ns each,
where an array over the whole buffer whose items alternate span / gap and an Arrow `take` of
the spans took ~37 / ~44 ns. A column over many Messages (a Spark read's batch object) is
gathered from every Message's buffer straight into one array: building an array per Message
and concatenating them copied every byte twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from memq.errors import CorruptDataError
from memq.format.arrow_body import _pyarrow, body_schema

if TYPE_CHECKING:
    import pyarrow as pa

_MAX_OFFSET = 2**31 - 1     # an Arrow binary array's int32 offsets


@dataclass(frozen=True, slots=True)
class Spans:
    """Byte ranges [start, start + length) of a buffer; length -1 = null."""

    start: np.ndarray     # int64
    length: np.ndarray    # int64

    def __len__(self) -> int:
        return len(self.start)

    def __getitem__(self, rows: slice) -> Spans:
        return Spans(self.start[rows], self.length[rows])


@dataclass(frozen=True, slots=True)
class SpanColumns:
    """One Message's records as located fields over its decompressed bytes (what the msgpack
    and Kafka walks find): no field is an array until asked for (`column`, or `span_column`
    over many Messages)."""

    data: bytes | memoryview
    values: Spans                   # never null
    keys: Spans
    timestamps: np.ndarray          # int64
    message_ids: Spans
    header_offsets: np.ndarray      # int32, records + 1: record i's headers are items [o[i], o[i+1])
    header_keys: Spans              # never null
    header_values: Spans            # never null
    header_keys_utf8: bool          # whether the walk checked that header keys are UTF-8

    def __len__(self) -> int:
        return len(self.timestamps)

    def column(self, name: str) -> pa.Array:
        return span_column([self], name)


def span_column(parts: Sequence[SpanColumns], name: str) -> pa.Array:
    """LogMessage field `name` of the records of `parts`, one after the other, as one array
    (`arrow_body.body_schema()`'s type); CorruptDataError if a header key is not UTF-8."""
    pa = _pyarrow()
    if name in _BINARY_FIELDS:
        return binary_array_parts([(getattr(p, _BINARY_FIELDS[name]), p.data) for p in parts], pa.binary())
    if name == "timestamp_ms":
        return pa.array(parts[0].timestamps if len(parts) == 1 else np.concatenate([p.timestamps for p in parts]))
    if name != "headers":
        raise KeyError(name)
    keys = binary_array_parts([(p.header_keys, p.data) for p in parts], pa.string())
    if not all(p.header_keys_utf8 for p in parts):
        try:
            keys.validate(full=True)
        except pa.ArrowInvalid as exc:
            raise CorruptDataError(f"record header key is not UTF-8: {exc}") from exc
    values = binary_array_parts([(p.header_values, p.data) for p in parts], pa.binary())
    typ = body_schema().field("headers").type
    items = pa.StructArray.from_arrays([keys, values], fields=list(typ.value_type))
    return pa.ListArray.from_arrays(pa.array(_concat_offsets([p.header_offsets for p in parts])), items, type=typ)


_BINARY_FIELDS = {"value": "values", "key": "keys", "message_id": "message_ids"}


def _concat_offsets(offsets: Sequence[np.ndarray]) -> np.ndarray:
    """List offsets of the parts' lists one after the other."""
    if len(offsets) == 1:
        return offsets[0]
    out = np.empty(sum(len(o) - 1 for o in offsets) + 1, np.int32)
    out[0] = row = base = 0
    for o in offsets:
        out[row + 1:row + len(o)] = o[1:] + base
        row += len(o) - 1
        base += int(o[-1])
    return out


def binary_array_parts(parts: Sequence[tuple[Spans, bytes | memoryview]], typ: pa.DataType) -> pa.Array:
    """The spans of every part, each over its own buffer, one after the other, as one Arrow
    array of `typ` (binary or string: a string array is not UTF-8-checked here); a null span
    is a null item. Every span must lie inside its buffer. Each span's bytes are copied once,
    straight to their place (an array per part, then concatenated, copied them twice)."""
    pa = _pyarrow()
    lengths = parts[0][0].length if len(parts) == 1 else np.concatenate([s.length for s, _ in parts])
    total, nulls = _measure(lengths)
    checked_size(total)
    offsets = np.empty(len(lengths) + 1, np.int32)
    offsets[0] = 0
    out = np.empty(total, np.uint8)
    row = 0
    for spans, data in parts:
        _gather(byte_array(data), spans.start, spans.length, out, offsets[row:])
        row += len(spans)
    validity = pa.py_buffer(np.packbits(lengths >= 0, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(typ, len(lengths), [validity, pa.py_buffer(offsets), pa.py_buffer(out)])


def checked_size(total: int) -> int:
    """`total` bytes of items, if an Arrow binary array's int32 offsets reach that far."""
    if total > _MAX_OFFSET:
        raise CorruptDataError(f"fields of {total} bytes exceed an Arrow binary array ({_MAX_OFFSET})")
    return total


def byte_array(data: bytes | memoryview) -> np.ndarray:
    """`data` as a read-only uint8 array, whether it is bytes or a writable buffer: numba
    compiles (seconds, then cached) one variant of a kernel per argument type."""
    return np.frombuffer(memoryview(data).toreadonly(), np.uint8)


@njit(cache=True, nogil=True)
def _measure(length: np.ndarray) -> tuple[int, bool]:   # pragma: no cover - compiled
    """(bytes of the spans, any null)."""
    total = 0
    nulls = False
    for i in range(len(length)):
        nulls |= length[i] < 0
        total += max(length[i], 0)
    return total, nulls


@njit(cache=True, nogil=True)
def _gather(data: np.ndarray, start: np.ndarray, length: np.ndarray, out: np.ndarray,
            offsets: np.ndarray) -> None:   # pragma: no cover - compiled
    """Copy each span to `out` from offsets[0] on, one memcpy a span, and write offsets[1:]
    (a null adding 0)."""
    at = offsets[0]
    for i in range(len(start)):
        if length[i] > 0:
            _memcpy(out, at, data, start[i], length[i])   # type: ignore[call-arg]  # typed by numba
            at += length[i]
        offsets[i + 1] = at


@intrinsic
def _memcpy(typingctx, dst, dst_at, src, src_at, n):  # type: ignore[no-untyped-def]  # pragma: no cover
    """`dst[dst_at:dst_at + n] = src[src_at:src_at + n]` as one memcpy (uint8 arrays): numba's
    slice copy and byte loop both ran ~2x slower than Arrow's `take` on 100-byte items."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        d, d_at, s, s_at, length = args
        d_ptr = builder.gep(context.make_array(signature.args[0])(context, builder, d).data, [d_at])
        s_ptr = builder.gep(context.make_array(signature.args[2])(context, builder, s).data, [s_at])
        cgutils.raw_memcpy(builder, d_ptr, s_ptr, length, 1)
    return types.void(dst, types.intp, src, types.intp, types.intp), codegen
