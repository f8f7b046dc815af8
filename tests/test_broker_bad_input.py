"""Bad input against a running broker: each gets an error ack naming it (or a clean close),
and the broker keeps serving the same and other connections."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from tests.support.processor import good_message

from memq.broker.server import Broker
from memq.config import MemqConfig
from memq.devcluster import DevCluster
from memq.format.wire import (BUNDLE_SUBPROTOCOL, NO_REQUEST_ID, Ack, AckLevel, decode_acks, encode_bundle,
                              encode_request)
from tests.support.cluster import running_broker, topic_config

pytestmark = pytest.mark.integration


async def next_acks(ws: aiohttp.ClientWebSocketResponse, n: int = 1) -> list[Ack]:
    acks: list[Ack] = []
    async with asyncio.timeout(10):
        while len(acks) < n:
            msg = await ws.receive()
            assert msg.type == aiohttp.WSMsgType.BINARY, msg
            acks += decode_acks(msg.data)
    return acks


@pytest.fixture
async def broker(devcluster: DevCluster, unique_name: Callable[[str], str]) -> AsyncIterator[Broker]:
    config = devcluster.config(topics=[topic_config(unique_name("bad"), max_message_bytes=4096)])
    config = dataclasses.replace(config, broker=dataclasses.replace(
        config.broker, max_frame_bytes=64 * 1024, ack_write_timeout_ms=500, max_pending_acks=200))
    async with running_broker(config) as b:
        yield b


async def test_each_bad_frame_gets_a_named_error_and_the_connection_goes_on(broker: Broker) -> None:
    topic = next(iter(broker.metadata().topics))
    corrupt = bytearray(good_message(3))
    corrupt[-1] ^= 0xFF
    async with aiohttp.ClientSession() as s, s.ws_connect(broker.url + "/v1/produce") as ws:
        cases = [
            (b"\x01\x02", NO_REQUEST_ID, "PROTOCOL", "shorter than"),
            (encode_request(11, AckLevel.ALL, topic, bytes(corrupt)), 11, "CORRUPT", "CRC32C"),
            (encode_request(12, AckLevel.ALL, "nope", good_message(1)), 12, "UNKNOWN_TOPIC", "'nope'"),
            (encode_request(13, AckLevel.ALL, topic, good_message(2, size=5000)), 13, "TOO_LARGE", "max_message_bytes=4096"),
            (encode_request(14, AckLevel.ALL, topic, b"MQMS\x01short"), 14, "CORRUPT", "truncated"),
        ]
        for frame, rid, code, words in cases:
            await ws.send_bytes(frame)
            [ack] = await next_acks(ws)
            assert (ack.id, ack.ok, ack.code) == (rid, False, code) and words in ack.error, ack
        await ws.send_str("hello")
        [ack] = await next_acks(ws)
        assert ack.code == "PROTOCOL" and "text frame" in ack.error
        await ws.send_bytes(encode_request(20, AckLevel.ALL, topic, good_message(20)))   # still served
        [ack] = await next_acks(ws)
        assert (ack.id, ack.ok) == (20, True) and ack.key


async def test_a_bundle_s_requests_are_each_answered_and_a_malformed_bundle_is_refused_whole(broker: Broker) -> None:
    topic = next(iter(broker.metadata().topics))
    corrupt = bytearray(good_message(2))
    corrupt[-1] ^= 0xFF
    m = broker.metrics.registry.get_sample_value
    async with aiohttp.ClientSession() as s, s.ws_connect(broker.url + "/v1/produce",
                                                          protocols=(BUNDLE_SUBPROTOCOL,)) as ws:
        assert ws.protocol == BUNDLE_SUBPROTOCOL          # the broker says it reads bundles
        await ws.send_bytes(encode_bundle([
            encode_request(1, AckLevel.ALL, topic, good_message(1)),
            encode_request(2, AckLevel.ALL, topic, bytes(corrupt)),     # fails alone
            encode_request(3, AckLevel.ALL, "nope", good_message(3)),
            encode_request(4, AckLevel.NONE, topic, good_message(4)),   # quiet, as in its own frame
            encode_request(5, AckLevel.ALL, topic, good_message(5)),
        ]))
        acks = {a.id: a for a in await next_acks(ws, 4)}
        assert {i: (a.ok, a.code) for i, a in acks.items()} == \
            {1: (True, "OK"), 2: (False, "CORRUPT"), 3: (False, "UNKNOWN_TOPIC"), 5: (True, "OK")}
        assert acks[1].key and acks[1].key == acks[5].key and (acks[1].index, acks[5].index) == (0, 2)
        assert (m("memq_broker_bundles_total"), m("memq_broker_bundled_requests_total")) == (1, 5)

        bad = encode_bundle([encode_request(6, AckLevel.ALL, topic, good_message(6))])[:-1]
        await ws.send_bytes(bad)
        [ack] = await next_acks(ws)
        assert (ack.id, ack.code) == (NO_REQUEST_ID, "PROTOCOL") and "does not fit" in ack.error
        await ws.send_bytes(encode_request(7, AckLevel.ALL, topic, good_message(7)))   # still served
        [ack] = await next_acks(ws)
        assert (ack.id, ack.ok) == (7, True)
    async with aiohttp.ClientSession() as s, s.ws_connect(broker.url + "/v1/produce") as ws:
        assert ws.protocol is None   # a client that asks for no subprotocol gets plain frames as before


async def test_oversized_frame_closes_cleanly_others_unaffected(broker: Broker) -> None:
    topic = next(iter(broker.metadata().topics))
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(broker.url + "/v1/produce") as other, s.ws_connect(broker.url + "/v1/produce") as ws:
            await ws.send_bytes(b"x" * (128 * 1024))                  # over max_frame_bytes=64 KiB
            msg = await asyncio.wait_for(ws.receive(), 10)
            assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            assert ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
            await other.send_bytes(encode_request(1, AckLevel.LEADER, topic, good_message(1)))
            [ack] = await next_acks(other)
            assert ack.ok


async def test_client_not_reading_acks_is_closed_others_served(broker: Broker) -> None:
    topic = next(iter(broker.metadata().topics))
    long_topic = "x" * 250      # big error acks fill the socket buffers fast
    async with aiohttp.ClientSession() as s:
        slow = await s.ws_connect(broker.url + "/v1/produce")
        frame = encode_request(1, AckLevel.LEADER, long_topic, good_message(1))
        closed = False
        async with asyncio.timeout(60):
            for i in range(200_000):          # never reads: the broker must give up on it
                try:
                    await slow.send_bytes(frame)
                except (ConnectionError, aiohttp.ClientError):
                    closed = True
                    break
                if i % 500 == 0:
                    await asyncio.sleep(0)
                    if broker.metrics.registry.get_sample_value("memq_broker_slow_client_closes_total") >= 1:
                        closed = True
                        break
        assert closed and broker.metrics.registry.get_sample_value("memq_broker_slow_client_closes_total") == 1
        async with s.ws_connect(broker.url + "/v1/produce") as ok:
            await ok.send_bytes(encode_request(2, AckLevel.LEADER, topic, good_message(2)))
            [ack] = await next_acks(ok)
            assert ack.ok
        await slow.close()


async def test_draining_broker_refuses_new_connections_and_answers_closing(devcluster: DevCluster,
                                                                          unique_name: Callable[[str], str]) -> None:
    topic = unique_name("drain")
    config: MemqConfig = devcluster.config(topics=[topic_config(topic, batch_ms=2000)])
    broker = Broker(config)
    await broker.start()
    async with aiohttp.ClientSession() as s, s.ws_connect(broker.url + "/v1/produce") as ws:
        await ws.send_bytes(encode_request(1, AckLevel.ALL, topic, good_message(1)))
        await asyncio.sleep(0.2)
        stopping = asyncio.create_task(broker.stop())
        [ack] = await next_acks(ws)          # the filling batch is stored and acked, not lost
        assert ack.ok and ack.key
        await stopping
        with pytest.raises(aiohttp.ClientError):
            async with s.ws_connect(broker.url + "/v1/produce"):
                pass
