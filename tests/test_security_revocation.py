"""An open produce connection (WebSocket or Kafka) whose token is revoked, or whose principal loses the right to a
topic it wrote on, is closed when the change reaches the broker (the ZooKeeper watch calls
`Guard.use_stored` from its own thread), not only refused at its next connect. Real broker
in process on the dev cluster, a raw WebSocket as the client."""

from __future__ import annotations

import asyncio
import dataclasses
import struct
from collections.abc import Callable

import aiohttp
import pytest

from memq.config import SecurityConfig
from memq.devcluster import DevCluster
from memq.format import Codec, LogMessage, encode_message
from memq.format.wire import AckLevel, decode_acks, encode_request
from memq.security.stored import StoredSecurity
from memq.security.tokens import new_token
from tests.support.cluster import running_broker, topic_config
from tests.support.kafka_frames import produce_body, record_batch, request

pytestmark = pytest.mark.integration

CAROL, CAROL_ENTRY = new_token("carol")


@pytest.mark.parametrize("change, why", [
    (StoredSecurity((), ("allow carol produce prefix:",)), "credentials of principal carol were revoked"),
    (StoredSecurity((str(CAROL_ENTRY),), ()), "carol may no longer produce to"),
], ids=["token-revoked", "acl-removed"])
async def test_an_open_connection_is_closed_when_its_rights_go(
        devcluster: DevCluster, unique_name: Callable[[str], str], change: StoredSecurity, why: str) -> None:
    topic = unique_name("revoke")
    base = devcluster.config(topics=[topic_config(topic, batch_ms=20)])
    config = dataclasses.replace(base, security=SecurityConfig(enabled=True))
    frame = encode_message([LogMessage(b"before")], producer_id=5, epoch=0, sequence=0, codec=Codec.NONE)
    async with running_broker(config) as broker, aiohttp.ClientSession() as s:
        guard = broker.guard
        guard.use_stored(StoredSecurity((str(CAROL_ENTRY),), ("allow carol produce prefix:",)))
        async with s.ws_connect(broker.url + "/v1/produce", headers={"Authorization": f"Bearer {CAROL}"}) as ws:
            await ws.send_bytes(encode_request(1, AckLevel.ALL, topic, frame))
            (ack,) = decode_acks(await ws.receive_bytes(timeout=30))
            assert ack.ok
            await asyncio.to_thread(guard.use_stored, change)        # as the ZooKeeper watch does
            msg = await ws.receive(timeout=5)
            assert msg.type is aiohttp.WSMsgType.CLOSE and msg.data == 1008, msg   # the close frame's code
            assert why in msg.extra
        if "revoked" in why:          # and it cannot come back
            with pytest.raises(aiohttp.WSServerHandshakeError, match="401"):
                await s.ws_connect(broker.url + "/v1/produce", headers={"Authorization": f"Bearer {CAROL}"})
            return
        async with s.ws_connect(broker.url + "/v1/produce", headers={"Authorization": f"Bearer {CAROL}"}) as ws:
            await ws.send_bytes(encode_request(2, AckLevel.ALL, topic, frame))
            (ack,) = decode_acks(await ws.receive_bytes(timeout=30))
            assert ack.code == "DENIED"


async def test_an_open_kafka_connection_is_closed_when_its_token_is_revoked(
        devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    """The same on the Kafka door: a SASL/PLAIN connection (the token as password) that produced
    is closed when the token goes; until then it is served."""
    topic = unique_name("revoke-kafka")
    base = devcluster.config(topics=[topic_config(topic, batch_ms=20)])
    config = dataclasses.replace(base, security=SecurityConfig(enabled=True),
                                 broker=dataclasses.replace(base.broker, kafka_port=0))
    async with running_broker(config) as broker:
        broker.guard.use_stored(StoredSecurity((str(CAROL_ENTRY),), ("allow carol produce prefix:",)))
        host, port = broker.kafka_address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))

        async def call(frame: bytes) -> bytes:
            writer.write(frame)
            async with asyncio.timeout(30):
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                return await reader.readexactly(size)

        try:
            await call(request(17, 1, 1, struct.pack(">h", 5) + b"PLAIN"))              # SaslHandshake
            auth = b"\0carol\0" + CAROL.encode()
            answer = await call(request(36, 1, 2, struct.pack(">i", len(auth)) + auth))  # SaslAuthenticate
            assert struct.unpack_from(">h", answer, 4)[0] == 0, answer                   # NONE: authenticated
            batch = record_batch([LogMessage(b"before", timestamp_ms=1)])
            answer = await call(request(0, 8, 3, produce_body(topic, 0, batch)))
            assert struct.pack(">h", 0) in answer[4:]                                     # produced (no error)
            await asyncio.to_thread(broker.guard.use_stored,                              # as the ZooKeeper watch does
                                    StoredSecurity((), ("allow carol produce prefix:",)))
            async with asyncio.timeout(5):
                assert await reader.read(1) == b""                                        # closed by the broker
        finally:
            writer.close()
