"""The storage contract: where a batch lives, what a listing returns, and the handler protocol."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

T = TypeVar("T")
Chunks = bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview]


@dataclass(frozen=True, slots=True)
class ObjectLocation:
    """One stored batch. The file handler uses bucket "" and a key relative to its root_dir."""

    bucket: str
    key: str

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}" if self.bucket else self.key


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """A listing entry; `timestamp_ms` comes from the key, so listing needs no object reads."""

    location: ObjectLocation
    size: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class DeleteFailure:
    """An object a bulk delete could not remove, and why (the store's code and message)."""

    location: ObjectLocation
    reason: str


DELETE_CHUNK = 1000
"""Keys per bulk delete request: S3 DeleteObjects' limit."""


def delete_chunks(items: Sequence[T], size: int = DELETE_CHUNK) -> list[Sequence[T]]:
    """`items` cut into requests of at most `size` keys, in order."""
    return [items[i:i + size] for i in range(0, len(items), size)]


@runtime_checkable
class StorageHandler(Protocol):
    """Async batch storage, safe to share across tasks.

    Errors: `ObjectNotFoundError` for a missing object, `RetryBudgetExhaustedError` when
    transient failures outlast the retry budget, `StorageError` for anything else (naming
    the object and the cause). Time ranges are half-open: start_ms <= t < end_ms.
    """

    async def put_batch(self, topic: str, data: Chunks, *, first_request_id: int,
                        timestamp_ms: int, broker_id: str, group: str = "") -> ObjectLocation:
        """Store one object (the chunks in order, not copied by S3); each retry goes under its own key.
        Under the topic's key, or with `group` under that storage group's (the parts of many topics).
        The chunks must not change until this returns: obstore reads a bytearray or memoryview while
        the request runs, not when it is called (a change made meanwhile is what gets stored)."""
        ...

    async def get(self, loc: ObjectLocation) -> bytes:
        """The whole object."""
        ...

    async def get_range(self, loc: ObjectLocation, start: int, length: int) -> bytes:
        """Bytes [start, start + length), cut short at the end of the object."""
        ...

    async def list_topic(self, topic: str, start_ms: int, end_ms: int, *,
                         all_attempts: bool = False) -> list[ObjectInfo]:
        """Every batch of the topic (all 256 prefixes) with start_ms <= t < end_ms, by time.

        Of a batch whose put was retried, only the highest stored attempt is listed
        (see `memq.storage.listing`), unless `all_attempts` (the janitor: every object costs).
        """
        ...

    async def list_group(self, group: str, start_ms: int, end_ms: int, *,
                         all_attempts: bool = False) -> list[ObjectInfo]:
        """As `list_topic`, for the shared objects of a storage group."""
        ...

    async def delete(self, loc: ObjectLocation) -> None:
        """Remove the object; deleting a missing object is not an error."""
        ...

    async def delete_many(self, locs: Sequence[ObjectLocation]) -> list[DeleteFailure]:
        """Remove many objects, `DELETE_CHUNK` per request; the ones that failed, with why.

        Missing objects are not failures. A request that fails as a whole raises, like `delete`.
        """
        ...

    def pressure(self) -> float:
        """The share (0 to 1) of the store's recent answers that asked for fewer requests (S3's
        503 SlowDown); 0.0 for a store that never does. Writers seal fewer, larger batches on it."""
        ...

    async def close(self) -> None:
        """Release connections and threads."""
        ...
