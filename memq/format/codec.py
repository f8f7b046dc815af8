"""Compression codecs of a Message body, with size-guarded decompression."""

from __future__ import annotations

import zlib
from enum import IntEnum

import msgpack
import zstandard

from memq.errors import CorruptDataError, UnsupportedCodecError

# Largest body (compressed or not) a Message may declare; bounds memory on hostile input.
MAX_BODY_BYTES = 256 * 1024 * 1024
ZSTD_LEVEL = 3
GZIP_LEVEL = 6
_GZIP_WBITS = 31  # gzip container
# Adaptive compression: a body is compressed only if a sample of it shrinks to at most
# PAYS_RATIO of its size; bodies up to 2 * SAMPLE_BYTES are compressed whole and judged so.
SAMPLE_BYTES = 16 * 1024
PAYS_RATIO = 0.95


class Codec(IntEnum):
    NONE = 0
    ZSTD = 1
    GZIP = 2
    KAFKA = 3   # the body is a Kafka RecordBatch v2, compressed inside (memq.format.kafka_records)
    ARROW = 4   # the body is an Arrow IPC stream of the LogMessages' columns (memq.format.arrow_body)


_CODECS = {int(c): c for c in Codec}   # by value: the enum call costs ~0.5 us, once per Message


def codec_of(value: int) -> Codec:
    codec = _CODECS.get(value)
    if codec is None:
        raise UnsupportedCodecError(f"unknown codec id {value}")
    return codec


class Compressors:
    """Reusable codec state (zstd contexts, a msgpack Packer) for one thread or event loop.

    Not thread-safe. Building zstd contexts costs about as much as decompressing a 100 KB
    body, and a reused Packer keeps its grown buffer (faster than `packb`), so
    producers and consumers keep one of these; one-off callers may let the functions make
    a fresh one.
    """

    __slots__ = ("_level", "_zc", "_zd", "packer")

    def __init__(self, zstd_level: int = ZSTD_LEVEL) -> None:
        self._level = zstd_level
        self.packer = msgpack.Packer(autoreset=False)  # see records.packed_records
        self._zc: zstandard.ZstdCompressor | None = None  # built on first use:
        self._zd: zstandard.ZstdDecompressor | None = None  # readers never need a compressor

    def compress(self, codec: Codec, raw: bytes | memoryview) -> bytes | memoryview:
        if codec is Codec.NONE:
            return raw
        if codec is Codec.ZSTD:
            if self._zc is None:
                self._zc = zstandard.ZstdCompressor(level=self._level)
            return self._zc.compress(raw)
        if codec is Codec.GZIP:
            return zlib.compress(raw, GZIP_LEVEL, wbits=_GZIP_WBITS)
        raise UnsupportedCodecError(f"unknown codec {codec!r}")

    def compress_if_pays(self, codec: Codec, raw: bytes | memoryview) -> tuple[Codec, bytes | memoryview]:
        """(codec used, body): `raw` itself with Codec.NONE when compressing would not save
        >= 5%. Random or already-compressed values (images, encrypted payloads) then skip the
        compressor: zstd was ~20% of the producer's CPU on such values and saved nothing.

        Large bodies are judged by compressing one SAMPLE_BYTES slice from their middle (past
        the msgpack framing at the start), ~1.5% of a 1 MiB body's compression work.
        """
        if codec is Codec.NONE:
            return codec, raw
        n = len(raw)
        if n > 2 * SAMPLE_BYTES:
            mid = (n - SAMPLE_BYTES) // 2
            sample = memoryview(raw)[mid:mid + SAMPLE_BYTES]
            if len(self.compress(codec, sample)) > PAYS_RATIO * SAMPLE_BYTES:
                return Codec.NONE, raw
        body = self.compress(codec, raw)
        return (codec, body) if len(body) <= PAYS_RATIO * n else (Codec.NONE, raw)

    def decompress(self, codec: Codec, body: bytes | memoryview,
                   raw_length: int) -> bytes | memoryview:
        """Decompress `body` to exactly `raw_length` bytes, else CorruptDataError."""
        if raw_length > MAX_BODY_BYTES:
            raise CorruptDataError(f"declared raw length {raw_length} exceeds {MAX_BODY_BYTES}")
        if codec is Codec.NONE:
            raw = body
        elif codec is Codec.ZSTD:
            raw = self._zstd(body, raw_length)
        elif codec is Codec.GZIP:
            raw = _gunzip(body, raw_length)
        else:
            raise UnsupportedCodecError(f"unknown codec {codec!r}")
        if len(raw) != raw_length:
            raise CorruptDataError(
                f"{codec.name} body decompressed to {len(raw)} bytes, header says {raw_length}")
        return raw

    def zstd_decompressor(self) -> zstandard.ZstdDecompressor:
        """The reused zstd context, also for the zstd frames inside Kafka batches."""
        if self._zd is None:
            self._zd = zstandard.ZstdDecompressor()
        return self._zd

    def _zstd(self, body: bytes | memoryview, raw_length: int) -> bytes:
        # The decompressor allocates a frame's declared content size whatever the output
        # cap, so the frame must declare exactly the header's size (memq always writes it).
        try:
            declared = zstandard.get_frame_parameters(body).content_size
            if declared != raw_length:
                raise CorruptDataError(
                    f"zstd frame declares {declared} bytes, header says {raw_length}")
            return self.zstd_decompressor().decompress(body, max_output_size=raw_length, allow_extra_data=False)
        except zstandard.ZstdError as exc:
            raise CorruptDataError(f"zstd body does not decompress: {exc}") from exc


def _gunzip(body: bytes | memoryview, raw_length: int) -> bytes:
    # Room for one byte more than declared: a longer stream shows up as a length mismatch.
    d = zlib.decompressobj(wbits=_GZIP_WBITS)
    try:
        raw = d.decompress(body, raw_length + 1)
    except zlib.error as exc:
        raise CorruptDataError(f"gzip body does not decompress: {exc}") from exc
    if not d.eof or d.unused_data:
        raise CorruptDataError(f"gzip body does not end after the declared {raw_length} bytes")
    return raw
