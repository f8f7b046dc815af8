"""Which way the Consumer reads a part (`memq.client.read_path`, pure) and `BrokerParts` against a
fake broker on loopback (aiohttp): damaged bytes from a broker are caught and read from storage,
a refusal is raised, a broker that does not answer falls back. The real cluster:
`test_consumer_broker_reads.py`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from aiohttp import web
from crc32c import crc32c
from tests.support.clock import FakeClock
from tests.support.consumer_fakes import CountingSource, MemorySource, batch

from memq.broker.metrics import BrokerMetrics
from memq.broker.read_cache import ReadCache
from memq.broker.reads import Reads
from memq.client._auth import NO_AUTH
from memq.client.broker_source import RELIST_S, BrokerParts
from memq.client.metrics import ConsumerMetrics
from memq.client.read_path import PathRule, broker_order
from memq.client.reader import BatchPointer, BatchReader
from memq.config import KafkaConfig, MemqConfig
from memq.errors import AuthorizationError, CorruptDataError, DataLossError
from memq.format import LogMessage
from memq.format.metadata import BrokerMetadata, ClusterMetadata, StorageMetadata
from memq.storage import ObjectLocation

NOW_MS = 1_800_000_000_000
PART = b"the part's bytes, as stored"
KEY = "ab/c/groups/shared/0000000000001-b1-ff-a0"


def brokers(*specs: tuple[str, str]) -> list[BrokerMetadata]:
    return [BrokerMetadata(id=i, url=f"http://{i}", rack=rack) for i, rack in specs]


# --- the path rule (pure) ----------------------------------------------------------------------


def test_auto_reads_through_a_broker_near_the_tail_and_from_storage_far_behind() -> None:
    rule = PathRule("auto", max_age_ms=30_000)
    assert rule.way(NOW_MS - 30_000, NOW_MS) == "broker"
    assert rule.way(NOW_MS - 30_001, NOW_MS) == "s3"
    assert rule.way(NOW_MS + 5, NOW_MS) == "broker"   # a writer's clock ahead of ours
    assert PathRule("broker", 0).way(0, NOW_MS) == "broker"
    assert PathRule("s3", 10**12).way(NOW_MS, NOW_MS) == "s3"


def test_brokers_are_ordered_writer_first_then_alike_for_every_reader() -> None:
    cluster = brokers(("b1", "r1"), ("b2", "r2"), ("b3", "r3"))
    assert broker_order(cluster, KEY, "b2", "")[0].id == "b2"
    # no writer among them: the same order from every reader, whatever order the metadata listed
    first = broker_order(cluster, KEY, "gone", "")
    assert broker_order(list(reversed(cluster)), KEY, "gone", "") == first
    # and different parts spread over the brokers
    assert {broker_order(cluster, f"{KEY}{i}", "gone", "")[0].id for i in range(60)} == {"b1", "b2", "b3"}


def test_a_broker_in_the_readers_rack_comes_before_the_writer_elsewhere() -> None:
    cluster = brokers(("b1", "r1"), ("b2", "r2"), ("b3", "r2"))
    assert broker_order(cluster, KEY, "b1", "r2")[0].id in {"b2", "b3"}
    assert [b.id for b in broker_order(cluster, KEY, "b3", "r2")][:2] == ["b3", "b2"]
    assert broker_order(cluster, KEY, "b1", "r9")[0].id == "b1"   # no broker in our rack: as without one


# --- BrokerParts against a fake broker ---------------------------------------------------------


@dataclass
class FakeBroker:
    """Answers /v1/read with `status` and `body`; counts the requests."""

    status: int = 200
    body: bytes = PART
    asked: int = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.asked += 1
        return web.Response(status=self.status, body=self.body)


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeBroker, str]]:
    broker = FakeBroker()
    app = web.Application()
    app.add_routes([web.get("/v1/read", broker.handle)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]   # type: ignore[union-attr]
    yield broker, f"http://127.0.0.1:{port}"
    await runner.cleanup()


def pointer(data: bytes = PART, created_ms: int = NOW_MS) -> BatchPointer:
    return BatchPointer("t", ObjectLocation("bucket", KEY), len(data), crc32c(data), 0, 0, 0, created_ms, "b1")


def parts(url: str, metrics: ConsumerMetrics, mode: str = "auto") -> BrokerParts:
    return BrokerParts([BrokerMetadata(id="b1", url=url)], PathRule(mode, 30_000), NO_AUTH,  # type: ignore[arg-type]
                       metrics, FakeClock(NOW_MS / 1000), timeout_s=2.0, concurrency=2)


def storage(data: bytes = PART) -> tuple[list[int], Callable[[], object]]:
    calls: list[int] = []

    async def read() -> bytes:
        calls.append(1)
        return data
    return calls, read


async def test_a_part_near_the_tail_comes_from_the_broker(fake: tuple[FakeBroker, str]) -> None:
    broker, url = fake
    m = ConsumerMetrics()
    calls, read = storage()
    src = parts(url, m)
    try:
        assert await src.part(pointer(), read) == PART   # type: ignore[arg-type]
    finally:
        await src.close()
    assert broker.asked == 1 and not calls
    assert (m.parts_via_broker, m.parts_via_s3, m.broker_bytes) == (1, 0, len(PART))


async def test_damaged_bytes_from_a_broker_are_caught_and_read_from_storage(fake: tuple[FakeBroker, str]) -> None:
    broker, url = fake
    broker.body = PART[:-1] + b"?"   # same size, another CRC32C
    m = ConsumerMetrics()
    calls, read = storage()
    src = parts(url, m)
    try:
        assert await src.part(pointer(), read) == PART   # type: ignore[arg-type]
        broker.body = PART[:-3]   # short
        assert await src.part(pointer(), read) == PART   # type: ignore[arg-type]
    finally:
        await src.close()
    assert (m.broker_corrupt, m.broker_fallbacks, m.parts_via_s3, m.parts_via_broker) == (2, 2, 2, 0)
    assert len(calls) == 2


async def test_a_refusal_is_raised_never_read_from_storage(fake: tuple[FakeBroker, str]) -> None:
    broker, url = fake
    broker.status, broker.body = 403, b"principal bob may not consume topic t"
    m = ConsumerMetrics()
    calls, read = storage()
    src = parts(url, m)
    try:
        with pytest.raises(AuthorizationError, match="may not consume topic t"):
            await src.part(pointer(), read)   # type: ignore[arg-type]
    finally:
        await src.close()
    assert not calls and m.parts_via_s3 == 0


async def test_no_broker_answering_or_a_busy_one_or_an_old_part_goes_to_storage(fake: tuple[FakeBroker, str]) -> None:
    broker, url = fake
    m = ConsumerMetrics()
    calls, read = storage()
    dead = parts("http://127.0.0.1:9", m)          # nothing listens there
    busy = parts(url, m)
    broker.status = 503
    try:
        assert await dead.part(pointer(), read) == PART   # type: ignore[arg-type]
        assert await busy.part(pointer(), read) == PART   # type: ignore[arg-type]
        assert await busy.part(pointer(), read) == PART   # type: ignore[arg-type]  # marked down: not asked
        assert broker.asked == 1
        broker.status = 200
        assert await parts(url, m).part(pointer(created_ms=NOW_MS - 60_000), read) == PART   # type: ignore[arg-type]
        assert await parts(url, m, "s3").part(pointer(), read) == PART   # type: ignore[arg-type]
    finally:
        await dead.close()
        await busy.close()
    assert broker.asked == 1   # far behind, or read_path s3: no broker asked
    assert (m.broker_fallbacks, m.parts_via_s3, m.parts_via_broker) == (3, 5, 0) and len(calls) == 5


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"   # type: ignore[union-attr]


async def test_the_broker_list_is_asked_again_so_a_broker_added_later_serves(fake: tuple[FakeBroker, str]) -> None:
    """Started knowing b1 only; b1 lists b1 and b2 when asked again (RELIST_S later): once b1
    is busy, b2 serves instead of storage."""
    first, url1 = fake
    second = FakeBroker()
    app = web.Application()
    app.add_routes([web.get("/v1/read", second.handle)])
    runner, url2 = await serve(app)
    listed = ClusterMetadata("c", "b1", "", StorageMetadata(), brokers=(BrokerMetadata(id="b1", url=url1),
                                                                          BrokerMetadata(id="b2", url=url2)))
    meta = web.Application()
    meta.add_routes([web.get("/v1/metadata", lambda _: web.json_response(listed.to_dict()))])
    meta.add_routes([web.get("/v1/read", first.handle)])
    meta_runner, meta_url = await serve(meta)
    m = ConsumerMetrics()
    clock = FakeClock(NOW_MS / 1000)
    src = BrokerParts([BrokerMetadata(id="b1", url=meta_url)], PathRule("auto", 10**12), NO_AUTH, m, clock,
                      timeout_s=2.0, concurrency=2)
    calls, read = storage()
    try:
        assert await src.part(pointer(), read) == PART   # type: ignore[arg-type]   # b1, as listed at the start
        clock.advance(RELIST_S)
        assert await src.part(pointer(), read) == PART   # type: ignore[arg-type]   # and the list is asked again
        await asyncio.sleep(0.2)
        first.status = 503                                # b1 busy: b2, learnt from the new list, serves
        assert await src.part(pointer(), read) == PART   # type: ignore[arg-type]
    finally:
        await src.close()
        await runner.cleanup()
        await meta_runner.cleanup()
    assert second.asked == 1 and not calls and m.parts_via_broker == 3


class DamagedParts:
    """A PartSource whose every answer is damaged (a broker and storage both wrong)."""

    async def part(self, ptr: BatchPointer, storage: Callable[[], object]) -> bytes:
        return b"\x00" * (ptr.size or 0)

    async def close(self) -> None:
        pass


def test_the_reader_verifies_whatever_way_a_part_came() -> None:
    reader = BatchReader(MemqConfig(), 2, source=lambda: MemorySource({}), parts=DamagedParts())
    try:
        fut = reader.submit(pointer(), lambda decoded: decoded)
        with pytest.raises(DataLossError, match="CRC32C"):
            fut.result(10)
    finally:
        reader.close()


# --- the broker's side: Reads.part_range -------------------------------------------------------



async def test_a_broker_gets_a_part_once_for_every_reader_and_a_wrong_size_poisons_nothing() -> None:
    obj = b"head" + PART + b"tail"
    storage = CountingSource({KEY: obj}, delay_s=0.01)   # every reader below joins the load
    metrics = BrokerMetrics("b1")
    reads = Reads(KafkaConfig(), storage, ReadCache(1 << 20, metrics), metrics, broker_id="b1")  # type: ignore[arg-type]
    loc = ObjectLocation("", KEY)
    try:
        got = await asyncio.gather(*[reads.part_range("t", loc, 4, len(PART)) for _ in range(3)])   # three groups at once
        assert got == [PART] * 3 and storage.gets == 1
        assert await reads.part_range("t", loc, 4, 3) == PART[:3]           # a wrong size: its own answer, its own entry
        assert await reads.part_range("t", loc, 4, len(PART)) == PART and storage.gets == 2
        assert reads.wants("t") and not reads.wants("unread")          # only topics read here keep their parts
        reads.stored(ObjectLocation("", "stored"), 0, b"hot")          # what this broker just wrote: no GET at all
        assert await reads.part_range("t", ObjectLocation("", "stored"), 0, 3) == b"hot" and storage.gets == 2
    finally:
        await reads.close()


async def test_a_part_both_kinds_of_reader_want_costs_no_second_get() -> None:
    """A topic memq Consumers read through the broker: a part framed for a Kafka reader keeps its
    stored bytes, so the Consumers still read it from memory."""
    objects: dict[str, bytes] = {}
    n = batch("k0", [(7, 0, [LogMessage(b"v", b"k")])], 0, objects).notification
    loc = ObjectLocation(n.bucket, n.key)
    storage = CountingSource(objects)
    metrics = BrokerMetrics("b1")
    reads = Reads(KafkaConfig(), storage, ReadCache(1 << 20, metrics), metrics, broker_id="b1")  # type: ignore[arg-type]
    try:
        reads.stored(loc, 0, objects["k0"])                                        # kept on write
        assert await reads.part_range(n.topic, loc, 0, n.size) == objects["k0"]   # a memq Consumer's group
        await reads.part(n)                                                        # a Kafka reader frames it
        assert await reads.part_range(n.topic, loc, 0, n.size) == objects["k0"]   # another group
        assert storage.gets == 0
    finally:
        await reads.close()


async def test_the_compactors_dirty_part_comes_from_the_cache_when_hot_and_is_not_kept_when_not() -> None:
    """`Reads.part_bytes` (the broker's compactor): a part this broker just stored costs no GET; an
    old one is one GET whose bytes do not stay (read once: hot parts keep their room); damage is caught."""
    objects: dict[str, bytes] = {}
    hot = batch("hot", [(7, 0, [LogMessage(b"v", b"k")])], 0, objects).notification
    old = batch("old", [(7, 1, [LogMessage(b"w", b"k")])], 1, objects).notification
    storage = CountingSource(objects)
    metrics = BrokerMetrics("b1")
    reads = Reads(KafkaConfig(), storage, ReadCache(1 << 20, metrics), metrics, broker_id="b1")  # type: ignore[arg-type]
    try:
        reads.stored(ObjectLocation(hot.bucket, hot.key), 0, objects["hot"])
        assert await reads.part_bytes(hot) == objects["hot"] and storage.gets == 0
        assert reads.cache.peek(("part", hot.bucket, hot.key, 0)) is not None    # still there for readers
        assert await reads.part_bytes(old) == objects["old"] and storage.gets == 1
        assert reads.cache.peek(("part", old.bucket, old.key, 0)) is None         # not kept
        objects["old"] = b"x" * len(objects["old"])
        with pytest.raises(CorruptDataError):
            await reads.part_bytes(old)
    finally:
        await reads.close()
