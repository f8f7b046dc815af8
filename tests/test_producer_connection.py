"""The producer's connection to one broker, against in-process WebSocket servers that record
the frames they read: small frames handed over together go as one bundle only to a broker
that chose the bundle subprotocol, in the order they were handed over."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from memq.client._connection import BUNDLE_FRAME_BYTES, BrokerConnection
from memq.errors import BrokerUnavailableError
from memq.format.wire import BUNDLE_SUBPROTOCOL, AckLevel, decode_request, encode_request, is_bundle, split_bundle


@asynccontextmanager
async def recording_broker(protocols: tuple[str, ...]) -> AsyncIterator[tuple[str, list[bytes], list[web.WebSocketResponse]]]:
    """A WebSocket endpoint at /v1/produce that keeps every binary frame it reads (acks none)."""
    frames: list[bytes] = []
    sockets: list[web.WebSocketResponse] = []

    async def produce(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=protocols)
        await ws.prepare(request)
        sockets.append(ws)
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY:
                frames.append(msg.data)
        return ws

    app = web.Application()
    app.router.add_get("/v1/produce", produce)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}", frames, sockets
    finally:
        await runner.cleanup()


@asynccontextmanager
async def connection(url: str, on_lost: Callable[[BrokerConnection, str], None] = lambda c, why: None,
                     broker_frame_limit: int = 0) -> AsyncIterator[BrokerConnection]:
    async with aiohttp.ClientSession() as session:
        conn = BrokerConnection(url, session, on_ack=lambda a: None, on_lost=on_lost, timeout_s=5.0,
                                max_frame_bytes=1 << 20, broker_frame_limit=broker_frame_limit)
        await conn.connect()
        try:
            yield conn
        finally:
            await conn.close()


def request(i: int, size: int = 10) -> bytes:
    return encode_request(i, AckLevel.LEADER, f"t{i % 3}", bytes([i]) * size)


def request_ids(frames: list[bytes]) -> list[list[int]]:
    """Per frame read, the request ids it held (a plain frame: one)."""
    return [[decode_request(v).request_id for v in (split_bundle(f) if is_bundle(f) else [f])] for f in frames]


async def until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_frames_handed_over_together_go_as_bundles_in_order_a_large_one_alone() -> None:
    big = BUNDLE_FRAME_BYTES + 1
    sizes = {6: big}   # handed over after 1..5, before 7..8
    async with recording_broker((BUNDLE_SUBPROTOCOL,)) as (url, frames, _), connection(url) as conn:
        await asyncio.gather(*(conn.send(request(i, sizes.get(i, 10))) for i in range(1, 9)))
        await conn.send(request(9))                       # alone in its turn: a plain frame
        await until(lambda: sum(map(len, request_ids(frames))) == 9)
    assert request_ids(frames) == [[1, 2, 3, 4, 5], [6], [7, 8], [9]]
    assert [is_bundle(f) for f in frames] == [True, False, True, False]


async def test_a_broker_that_did_not_choose_bundles_gets_one_frame_per_request() -> None:
    async with recording_broker(()) as (url, frames, _), connection(url) as conn:
        await asyncio.gather(*(conn.send(request(i)) for i in range(1, 6)))
        await until(lambda: len(frames) == 5)
    assert request_ids(frames) == [[1], [2], [3], [4], [5]] and not any(map(is_bundle, frames))


async def test_a_bundle_stays_under_the_broker_s_frame_limit() -> None:
    limit = BUNDLE_FRAME_BYTES + 2000
    async with recording_broker((BUNDLE_SUBPROTOCOL,)) as (url, frames, _), \
            connection(url, broker_frame_limit=limit) as conn:
        await asyncio.gather(*(conn.send(request(i, 300)) for i in range(1, 41)))
        await until(lambda: sum(map(len, request_ids(frames))) == 40)
    assert max(map(len, frames)) <= limit and len(frames) > 1
    assert [i for ids in request_ids(frames) for i in ids] == list(range(1, 41))


async def test_everyone_in_a_bundle_that_cannot_be_written_fails_as_the_connection_is_lost() -> None:
    lost: list[str] = []
    async with recording_broker((BUNDLE_SUBPROTOCOL,)) as (url, frames, sockets), \
            connection(url, on_lost=lambda c, why: lost.append(why)) as conn:
        await until(lambda: bool(sockets))
        await sockets[0].close()
        await until(lambda: conn.closed)
        results = await asyncio.gather(*(conn.send(request(i)) for i in range(1, 5)), return_exceptions=True)
    assert all(isinstance(r, BrokerUnavailableError) for r in results), results
    assert lost and not frames


@pytest.mark.parametrize("limit", [BUNDLE_FRAME_BYTES, 1000])
async def test_no_bundles_to_a_broker_whose_frame_limit_leaves_no_room_for_them(limit: int) -> None:
    async with recording_broker((BUNDLE_SUBPROTOCOL,)) as (url, frames, _), \
            connection(url, broker_frame_limit=limit) as conn:
        await asyncio.gather(*(conn.send(request(i)) for i in range(1, 4)))
        await until(lambda: len(frames) == 3)
    assert not any(map(is_bundle, frames))
