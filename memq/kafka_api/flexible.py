"""Sans-I/O primitives of Kafka's flexible versions (KIP-482), beside `protocol`'s fixed-width ones.

A flexible message writes lengths as unsigned varints (compact strings, bytes and arrays store
length + 1 so that 0 means null), ends every struct with a tagged-field section, and uses
request header v2 (header v1 + tags) and response header v1 (correlation id + tags). memq
writes no tagged fields and skips any it is sent; every read past the frame is a ProtocolError.
"""

from __future__ import annotations

import struct
import uuid

from memq.errors import ProtocolError

from .protocol import Reader

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
MAX_VARINT_BYTES = 5   # an unsigned 32-bit varint


class FlexReader(Reader):
    """A `Reader` that also reads compact fields, uuids and tagged-field sections."""

    __slots__ = ()

    def uvarint(self) -> int:
        value = shift = 0
        for _ in range(MAX_VARINT_BYTES):
            if self.pos >= len(self.buf):
                raise ProtocolError(f"Kafka request truncated in a varint at byte {self.pos}")
            b = self.buf[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
        raise ProtocolError(f"Kafka request varint longer than {MAX_VARINT_BYTES} bytes at byte {self.pos}")

    def compact_bytes(self) -> memoryview | None:
        return self.nullable_bytes(self.uvarint() - 1)

    def compact_nullable_string(self) -> str | None:
        raw = self.compact_bytes()
        if raw is None:
            return None
        try:
            return bytes(raw).decode()
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"Kafka request string before byte {self.pos} is not UTF-8") from exc

    def compact_string(self) -> str:
        s = self.compact_nullable_string()
        if s is None:
            raise ProtocolError(f"Kafka request has a null string before byte {self.pos}")
        return s

    def compact_count(self, nullable: bool = False) -> int:
        """A compact array's length (-1: null, only where allowed); never more than bytes left."""
        n = self.uvarint() - 1
        if n == -1 and nullable:
            return -1
        if n < 0 or n > len(self.buf) - self.pos:
            raise ProtocolError(f"Kafka request array of {n} items at byte {self.pos} is impossible here")
        return n

    def uuid(self) -> uuid.UUID:
        raw = self.nullable_bytes(16)
        assert raw is not None
        return uuid.UUID(bytes=bytes(raw))

    def skip_tags(self) -> None:
        """Skip a tagged-field section: memq knows no tags, so every one is ignorable."""
        n = self.uvarint()   # a plain count, not length + 1
        if n > len(self.buf) - self.pos:
            raise ProtocolError(f"Kafka request has {n} tagged fields at byte {self.pos}: impossible here")
        for _ in range(n):
            self.uvarint()                      # tag
            self.nullable_bytes(self.uvarint())  # its value


def flex_body(body: Reader) -> FlexReader:
    """The body of a flexible request after `protocol.decode_request_header`: the header's
    tagged fields (request header v2) are skipped."""
    r = FlexReader(body.buf, body.pos)
    r.skip_tags()
    return r


def uvarint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


class FlexWriter:
    """Builds a flexible response: size prefix, correlation id, empty header tags (response
    header v1), then the body; `frame()` fills in the size."""

    __slots__ = ("out",)

    def __init__(self, correlation_id: int) -> None:
        self.out = bytearray(8)
        _I32.pack_into(self.out, 4, correlation_id)
        self.out.append(0)   # header tags

    def i8(self, v: int) -> FlexWriter:
        self.out += _I8.pack(v)
        return self

    def i16(self, v: int) -> FlexWriter:
        self.out += _I16.pack(v)
        return self

    def i32(self, v: int) -> FlexWriter:
        self.out += _I32.pack(v)
        return self

    def i64(self, v: int) -> FlexWriter:
        self.out += _I64.pack(v)
        return self

    def uuid(self, v: uuid.UUID) -> FlexWriter:
        self.out += v.bytes
        return self

    def count(self, n: int | None) -> FlexWriter:
        """A compact array length (None: a null array)."""
        self.out += uvarint(0 if n is None else n + 1)
        return self

    def string(self, s: str | None) -> FlexWriter:
        """A compact (nullable) string."""
        return self.blob(None if s is None else s.encode())

    def blob(self, b: bytes | bytearray | memoryview | None) -> FlexWriter:
        """Compact (nullable) bytes, also Kafka's `records`."""
        if b is None:
            self.out.append(0)
            return self
        self.out += uvarint(len(b) + 1)
        self.out += b
        return self

    def tags(self) -> FlexWriter:
        """An empty tagged-field section, ending a struct."""
        self.out.append(0)
        return self

    def frame(self) -> bytes:
        _I32.pack_into(self.out, 0, len(self.out) - 4)
        return bytes(self.out)
