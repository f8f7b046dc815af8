"""The one batch reader: fetch a batch object, verify it, decode it (Consumer and Spark alike).

A batch is named by a `BatchPointer` (from a notification, or from a storage listing, which
knows the size but no checksum). A batch is a part of its object, at bytes [start, start +
size): the whole object when the object is a topic's own, one topic's range of a storage
group's shared object otherwise. `BatchReader.submit` downloads the part (a ranged GET; a
whole GET when the size is unknown) on its `FetchLoop`, checks its size and CRC32C against the
pointer (whatever of them it carries),
decodes it and hands the header and Messages to the caller's `build` function, all in the
loop's CPU worker, so the caller gets finished rows. A missing or corrupt object becomes a
`DataLossError` (built here only); a storage failure stays a `StorageError` (never skipped).
`DataLossPolicy` is the one way to raise or skip such a loss.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from memq.config import MemqConfig
from memq.errors import DataLossError, FormatError, InvalidInputError, ObjectNotFoundError, StorageError
from memq.format import (BatchHeader, Compressors, LogMessage, MessageHeader, decode_batch, decode_batch_header,
                         decode_message, object_crc32c)
from memq.format.records import gc_paused
from memq.storage import ObjectLocation, make_storage

T = TypeVar("T")

Decoded = tuple[BatchHeader, list[tuple[MessageHeader, Sequence[LogMessage]]]]
# How a batch object is decoded: `decode_batch` (LogMessages) unless a reader wants columns.
BatchDecoder = Callable[..., tuple[BatchHeader, list[tuple[MessageHeader, Any]]]]


@dataclass(frozen=True, slots=True)
class BatchPointer:
    """Where a batch is and what it must look like: bytes [start, start + size) of the object.
    `size`/`crc32c` are None when unknown (a listing has no checksum; the batch is then the
    whole object); `partition`/`offset` (of its notification) are None when no notification names it;
    `created_ms` and `writer` (the broker that stored it) are 0 and "" then too."""

    topic: str
    location: ObjectLocation
    size: int | None = None
    crc32c: int | None = None
    partition: int | None = None
    offset: int | None = None
    start: int = 0
    created_ms: int = 0
    writer: str = ""

    def describe(self) -> str:
        obj = f"{self.location.bucket}/{self.location.key}" if self.location.bucket else self.location.key
        if self.start:
            obj += f" bytes {self.start}..{self.start + (self.size or 0) - 1}"
        if self.partition is None:
            return f"batch {obj} (topic {self.topic})"
        return f"batch {obj} (topic {self.topic}, read partition {self.partition}, offset {self.offset})"

    def lost(self, why: str) -> DataLossError:
        """The DataLossError for this batch: the only place one is built for a batch."""
        return DataLossError(f"{self.describe()} {why}", topic=self.topic,
                             partition=-1 if self.partition is None else self.partition,
                             offset=-1 if self.offset is None else self.offset, location=self.location.key)


@dataclass(frozen=True)
class DataLossPolicy:
    """Raise a DataLossError (`skip=False`), or log it as a warning on `logger` and go on.
    `hint` tells the user how to skip instead (named after the client's own setting)."""

    skip: bool
    logger: logging.Logger
    hint: str

    def handle(self, e: DataLossError) -> None:
        if not self.skip:
            if self.hint:
                e.add_note(self.hint)
            raise e
        self.logger.warning("%s; skipped", e)


class ObjectSource(Protocol):
    """What the reader downloads through (a StorageHandler fits)."""

    async def get(self, loc: ObjectLocation) -> bytes: ...
    async def get_range(self, loc: ObjectLocation, start: int, length: int) -> bytes: ...
    async def close(self) -> None: ...


class PartSource(Protocol):
    """Which way a notified part is read (the Consumer's: `broker_source.BrokerParts`, through a
    broker's read cache near the tail); `storage()` reads it from storage directly. Whatever it
    returns is verified against the pointer as a storage read is."""

    async def part(self, ptr: BatchPointer, storage: Callable[[], Awaitable[bytes]]) -> bytes: ...
    async def close(self) -> None: ...


class FetchLoop:
    """An event loop thread with one ObjectSource and at most `concurrency` GETs at a time,
    plus one worker thread for CPU work (checksums, decompression, decoding): one is enough
    under the GIL, and it lets the caller keep non-thread-safe codec state in it.

    The storage handlers are async while the Consumer and Spark tasks are blocking: callers
    submit coroutines and get `concurrent.futures.Future`s back, so several batches are
    downloaded and decoded while the application works on the current one.
    """

    def __init__(self, open_source: Callable[[], ObjectSource], concurrency: int) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="memq-fetch", daemon=True)
        self._thread.start()
        self._concurrency = concurrency
        self._sem: asyncio.Semaphore | None = None
        self._source: ObjectSource | None = None
        self._cpu = ThreadPoolExecutor(1, thread_name_prefix="memq-decode")
        try:
            self.run(self._open(open_source), timeout_s=30)
        except BaseException:
            self.close()
            raise

    async def _open(self, open_source: Callable[[], ObjectSource]) -> None:
        # Created on the loop: aiohttp-style clients bind to the loop that creates them.
        self._sem = asyncio.Semaphore(self._concurrency)
        self._source = open_source()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run `coro` on the loop and wait for its result from the calling thread."""
        fut = self.submit(coro)
        try:
            return fut.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise

    async def get(self, loc: ObjectLocation) -> bytes:
        assert self._sem is not None and self._source is not None
        async with self._sem:
            return await self._source.get(loc)

    async def get_range(self, loc: ObjectLocation, start: int, length: int) -> bytes:
        assert self._sem is not None and self._source is not None
        async with self._sem:
            return await self._source.get_range(loc, start, length)

    async def cpu(self, fn: Callable[..., T], *args: object) -> T:
        """Run `fn(*args)` in the CPU worker, keeping the loop free for I/O meanwhile."""
        return await self._loop.run_in_executor(self._cpu, fn, *args)

    def close(self, timeout_s: float = 10) -> None:
        if not self._thread.is_alive():
            return
        try:
            if self._source is not None:
                self.run(self._source.close(), timeout_s=timeout_s)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
            if not self._thread.is_alive():
                self._loop.close()
            self._cpu.shutdown(wait=False, cancel_futures=True)


def verify(ptr: BatchPointer, obj: bytes) -> None:
    """DataLossError unless `obj` has the size and CRC32C the pointer names."""
    if ptr.size is not None and len(obj) != ptr.size:
        raise ptr.lost(f"is corrupt: {len(obj)} bytes, expected {ptr.size}")
    if ptr.crc32c is not None and object_crc32c((obj,)) != ptr.crc32c:
        raise ptr.lost("is corrupt: CRC32C of the batch does not match its notification")


def decode_verified(ptr: BatchPointer, obj: bytes, build: Callable[[Any], T],
                    compressors: Compressors | None = None, decode: BatchDecoder = decode_batch) -> T:
    """Verify, decode and `build` under one GC pause: the decoded tuples stay alive (or die)
    within it, and with the GC on, collections rescanning them took most of the CPU.
    A FormatError from `build` is a corrupt batch too: a column decoder converts lazily."""
    verify(ptr, obj)
    with gc_paused():
        try:
            return build(decode(obj, compressors=compressors))
        except FormatError as e:
            raise ptr.lost(f"is corrupt: {e}") from e


class BatchReader:
    """Reads whole batches ahead (`submit`) or one LogMessage by ranged GETs (`read_one`)."""

    def __init__(self, config: MemqConfig, concurrency: int, *,
                 source: Callable[[], ObjectSource] | None = None, decode: BatchDecoder = decode_batch,
                 parts: PartSource | None = None) -> None:
        self._fetch = FetchLoop(source or (lambda: make_storage(config)), concurrency)
        self._compressors = Compressors()   # used only in the CPU worker
        self._decode = decode
        self._parts = parts

    @property
    def fetch_loop(self) -> FetchLoop:
        """Its loop: GETs and CPU work of other readers of the same objects (compacted parts, by key)."""
        return self._fetch

    def submit(self, ptr: BatchPointer, build: Callable[[Any], T]) -> concurrent.futures.Future[T]:
        """Start fetching `ptr`; the future holds `build(decoded batch)` (`Decoded` unless the
        reader was given another `decode`) or raises DataLossError."""
        return self._fetch.submit(self._read(ptr, build))

    async def _read(self, ptr: BatchPointer, build: Callable[[Any], T]) -> T:
        try:
            if ptr.size is None:
                obj = await self._fetch.get(ptr.location)
            elif ptr.size == 0:
                obj = b""   # corrupt (no batch is empty); verify says so, no request needed
            else:
                size = ptr.size

                async def stored() -> bytes:
                    return await self._fetch.get_range(ptr.location, ptr.start, size)
                obj = await (stored() if self._parts is None else self._parts.part(ptr, stored))
        except ObjectNotFoundError as e:
            raise ptr.lost(f"is missing: {e}") from e
        except StorageError as e:   # not data loss: the store failed; never skipped
            raise type(e)(f"reading {ptr.describe()}: {e}") from e
        return await self._fetch.cpu(decode_verified, ptr, obj, build, self._compressors, self._decode)

    def read_one(self, ptr: BatchPointer, header_size: int, index: int,
                 timeout_s: float) -> tuple[MessageHeader, LogMessage]:
        """LogMessage `index` of the batch, with two ranged GETs: the batch header, then its Message.
        The caller checks `index` against the notification's count: a header counting fewer is corrupt."""
        return self._fetch.run(self._read_one(ptr, header_size, index), timeout_s=timeout_s)

    async def _read_one(self, ptr: BatchPointer, header_size: int, index: int) -> tuple[MessageHeader, LogMessage]:
        try:
            bh = decode_batch_header(await self._fetch.get_range(ptr.location, ptr.start, header_size))
            first = 0
            for (start, end), count in zip(bh.message_ranges, bh.message_counts):   # within the batch
                if index < first + count:
                    header, logs = decode_message(await self._fetch.get_range(ptr.location, ptr.start + start,
                                                                              end - start))
                    return header, logs[index - first]
                first += count
        except ObjectNotFoundError as e:
            raise ptr.lost(f"is missing: {e}") from e
        except FormatError as e:
            raise ptr.lost(f"is corrupt: {e}") from e
        if index < 0:
            raise InvalidInputError(f"index {index} of {ptr.describe()} is negative")
        raise ptr.lost(f"is corrupt: its header counts {first} LogMessages, none at index {index}")

    def close(self, timeout_s: float = 10) -> None:
        try:
            if self._parts is not None:
                self._fetch.run(self._parts.close(), timeout_s=timeout_s)
        finally:
            self._fetch.close(timeout_s)


def read_in_order(reader: BatchReader, batches: Iterable[tuple[BatchPointer, Callable[[Any], T]]],
                  ahead: int, policy: DataLossPolicy) -> Iterator[T]:
    """`build(batch)` for each (pointer, build), in order, with up to `ahead` batches fetched
    ahead; lost batches raised or skipped by `policy`."""
    queue: deque[concurrent.futures.Future[T]] = deque()
    todo = iter(batches)
    for ptr, build in todo:
        queue.append(reader.submit(ptr, build))
        if len(queue) >= ahead:
            break
    while queue:
        fut = queue.popleft()
        nxt = next(todo, None)
        if nxt is not None:
            queue.append(reader.submit(*nxt))
        try:
            value = fut.result()
        except DataLossError as e:
            policy.handle(e)
            continue
        yield value


def notifications_expired(topic: str, kafka_topic: str, partition: int, start: int, low: int) -> DataLossError:
    """The DataLossError for notifications that expired from Kafka before they were read."""
    return DataLossError(f"topic {topic}: notifications {start}..{low - 1} of partition {partition} "
                         f"expired from {kafka_topic} before they were read", topic=topic,
                         partition=partition, offset=start)
