"""Reading compacted parts with ranged GETs: from a Kafka offset, or one key by the part's index.

A part's Batch header and trailer are read once and kept (`PartReader` caches them by object
key, bounded); a record read then GETs only the Messages it needs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Protocol

from memq.format.batch import BatchHeader, decode_batch_header
from memq.storage.base import ObjectLocation

from .manifest import Manifest
from .parts import PartIndex, PartRef, Survivor, decode_index, find_key, kafka_batch, message_survivors


class RangeReader(Protocol):
    """What reading parts needs of storage (any `StorageHandler`)."""

    async def get_range(self, loc: ObjectLocation, start: int, length: int) -> bytes: ...


class PartReader:
    """Reads compacted parts; keeps up to `size` parts' headers and indexes."""

    def __init__(self, storage: RangeReader, size: int = 4096) -> None:
        self.storage = storage
        self.size = size
        self._meta: OrderedDict[str, tuple[BatchHeader, PartIndex]] = OrderedDict()

    async def meta(self, part: PartRef) -> tuple[BatchHeader, PartIndex]:
        """The part's Batch header and trailer (cached)."""
        got = self._meta.get(part.key)
        if got is not None:
            self._meta.move_to_end(part.key)
            return got
        header = decode_batch_header(await self.storage.get_range(part.location, 0, part.header_size))
        index = decode_index(await self.storage.get_range(part.location, part.index_offset, part.index_size))
        self._meta[part.key] = (header, index)
        while len(self._meta) > self.size:
            self._meta.popitem(last=False)
        return header, index

    async def message(self, part: PartRef, n: int) -> bytes:
        """Message `n` of the part (one ranged GET)."""
        header, _ = await self.meta(part)
        lo, hi = header.message_ranges[n]
        return await self.storage.get_range(part.location, lo, hi - lo)

    async def messages_from(self, part: PartRef, offset: int) -> AsyncIterator[bytes]:
        """The part's Messages from the one holding the first survivor at or after Kafka `offset`."""
        header, index = await self.meta(part)
        for n in range(index.message_for(offset), header.message_count):
            yield await self.message(part, n)

    async def batches_from(self, part: PartRef, offset: int) -> AsyncIterator[memoryview]:
        """Its Kafka RecordBatches as stored (original offsets: a Kafka reader skips those below its own)."""
        async for msg in self.messages_from(part, offset):
            yield kafka_batch(msg)

    async def survivors_from(self, part: PartRef, offset: int) -> AsyncIterator[list[Survivor]]:
        """Its survivors at or after Kafka `offset`, a Message's worth at a time. The Messages
        from there to the part's end come in one ranged GET (a reader of survivors reads them
        all: a GET per Message cost more than decoding it)."""
        header, index = await self.meta(part)
        ranges = header.message_ranges[index.message_for(offset):]
        if not ranges:
            return
        start = ranges[0][0]
        body = memoryview(await self.storage.get_range(part.location, start, ranges[-1][1] - start))
        for lo, hi in ranges:
            got = [s for s in message_survivors(body[lo - start:hi - start]) if s.offset >= offset]
            if got:
                yield got

    async def lookup(self, part: PartRef, key: bytes) -> Survivor | None:
        """`key`'s survivor in the part, by its key index (None: not in it)."""
        _, index = await self.meta(part)
        found = None
        for n in index.messages_for_key(key):
            hit = find_key(await self.message(part, n), key)
            if hit is not None and (found is None or hit.offset > found.offset):
                found = hit
        return found

    async def get(self, manifest: Manifest, key: bytes) -> Survivor | None:
        """`key`'s latest survivor in a manifest's parts (newest part first); None: not compacted in."""
        for part in reversed(manifest.parts):
            hit = await self.lookup(part, key)
            if hit is not None:
                return hit
        return None
