"""Argument checks shared by the handlers: a batch's body as chunks, byte ranges."""

from __future__ import annotations

from memq.errors import InvalidInputError
from memq.storage.base import Chunks


def body_chunks(data: Chunks) -> tuple[bytes | list[bytes | bytearray | memoryview], int]:
    """The object body as given (one buffer, or the list of its chunks, uncopied) and its size.

    obstore sends a list of buffers as one body without joining them: concatenating a broker's
    8 MiB batch first was ~1.5 ms of CPU per PUT (a tenth of the broker's cost per byte)."""
    if isinstance(data, bytes):
        return data, len(data)
    try:
        chunks: list[bytes | bytearray | memoryview] = (
            [data] if isinstance(data, (bytearray, memoryview)) else list(data))
        return chunks, sum(memoryview(c).nbytes for c in chunks)
    except TypeError:
        raise InvalidInputError(f"batch data must be bytes or a sequence of bytes-like chunks, "
                                f"not {type(data).__name__}") from None


def check_range(start: int, length: int) -> None:
    """A byte range must start at >= 0 and hold at least one byte (HTTP Range cannot say zero)."""
    if start < 0 or length < 1:
        raise InvalidInputError(f"byte range start={start} length={length}: need start >= 0, length >= 1")
