"""Argument checks shared by the handlers: one concatenation of a batch's chunks, byte ranges."""

from __future__ import annotations

from memq.errors import InvalidInputError
from memq.storage.base import Chunks


def join_chunks(data: Chunks) -> bytes:
    """The object body; a sequence of chunks is concatenated exactly once."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    try:
        return b"".join(data)
    except TypeError:
        raise InvalidInputError(f"batch data must be bytes or a sequence of bytes-like chunks, "
                                f"not {type(data).__name__}") from None


def check_range(start: int, length: int) -> None:
    """A byte range must start at >= 0 and hold at least one byte (HTTP Range cannot say zero)."""
    if start < 0 or length < 1:
        raise InvalidInputError(f"byte range start={start} length={length}: need start >= 0, length >= 1")
