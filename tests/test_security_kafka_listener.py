"""The Kafka listener behind security: TLS on its port, SASL/PLAIN with a memq token as the
password, ACLs on Produce and Metadata, through confluent-kafka against a running broker."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trustme
from confluent_kafka import Producer

from memq.config import BrokerConfig, SecurityConfig
from memq.devcluster import DevCluster
from memq.broker.doors.kafka import PRE_AUTH_MAX_FRAME
from tests.support.security import ALICE, ALICE_ENTRY, BOB, BOB_ENTRY, kafka_send, sasl
from tests.support.cluster import read_stored, running_broker, topic_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def test_kafka_producers_authenticate_with_tokens_and_obey_acls(
        devcluster: DevCluster, tmp_path: Path, unique_name: Callable[[str], str]) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    files = {"ca": ca.cert_pem, "cert": cert.cert_chain_pems[0], "key": cert.private_key_pem}
    for name, blob in files.items():
        blob.write_to_path(str(tmp_path / f"{name}.pem"))
    ca_file = str(tmp_path / "ca.pem")
    orders, secret = unique_name("korders"), unique_name("ksecret")
    config = dataclasses.replace(
        devcluster.config(topics=[topic_config(t, read_partitions=1) for t in (orders, secret)]),
        broker=BrokerConfig(kafka_port=0),
        security=SecurityConfig(enabled=True, tls_cert_file=str(tmp_path / "cert.pem"),
                                tls_key_file=str(tmp_path / "key.pem"), tokens=(str(ALICE_ENTRY), str(BOB_ENTRY)),
                                acls=(f"allow alice produce literal:{orders}", f"allow alice describe literal:{orders}",
                                      "allow bob describe prefix:")))
    async with running_broker(config) as broker:
        address = broker.kafka_address

        async def send(topic: str, value: bytes, **conf: Any) -> tuple[list[str], list[str]]:
            return await asyncio.to_thread(kafka_send, address, topic, value, **conf)

        async def refused(topic: str, value: bytes, **conf: Any) -> tuple[list[str], list[str]]:
            """A send expected to fail: its record times out in 2 s instead of the 8 s a success may need."""
            return await send(topic, value, **conf, **{"message.timeout.ms": 2_000})

        delivery, _ = await send(orders, b"alice-over-sasl-ssl", **sasl(ca_file, "alice", ALICE))
        assert delivery == []
        delivery, _ = await send(orders, b"bob", **sasl(ca_file, "bob", BOB))         # may describe, not produce
        assert delivery and "TOPIC_AUTHORIZATION_FAILED" in delivery[0]
        for user, password in (("alice", "memq_wrong"), ("bob", ALICE)):          # unknown / another's token
            delivery, client = await refused(orders, b"bad-password", **sasl(ca_file, user, password))
            assert delivery and any("SASL authentication" in e or "AUTHENTICATION" in e for e in client), client
        delivery, client = await refused(orders, b"no-sasl", **{"security.protocol": "SSL", "ssl.ca.location": ca_file})
        assert delivery
        delivery, client = await refused(orders, b"plaintext")                        # no TLS at all
        assert delivery

        def topics_seen(user: str, password: str) -> set[str]:
            p = Producer({"bootstrap.servers": address, **sasl(ca_file, user, password)})
            return set(p.list_topics(timeout=10).topics)
        assert await asyncio.to_thread(topics_seen, "alice", ALICE) == {orders}
        assert await asyncio.to_thread(topics_seen, "bob", BOB) == {orders, secret}
        metrics = broker.metrics.registry.get_sample_value("memq_broker_denials_total", {"operation": "produce"})
        assert metrics and metrics >= 1
    stored, _, _ = await read_stored(config, orders)
    assert sorted(v for _, v, _ in stored.values()) == [b"alice-over-sasl-ssl"]


async def test_unauthenticated_kafka_clients_cannot_make_the_broker_buffer(
        devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    """Before SASL, a frame larger than PRE_AUTH_MAX_FRAME or any request but the SASL ones
    closes the connection (plaintext listener: security without TLS)."""
    topic = unique_name("kguard")
    config = dataclasses.replace(devcluster.config(topics=[topic_config(topic, read_partitions=1)]),
                                 broker=BrokerConfig(kafka_port=0),
                                 security=SecurityConfig(enabled=True, tokens=(str(ALICE_ENTRY),),
                                                         acls=(f"allow alice produce literal:{topic}",)))
    async with running_broker(config) as broker:
        host, port = broker.kafka_address.rsplit(":", 1)
        for frame in ((PRE_AUTH_MAX_FRAME + 1).to_bytes(4, "big") + b"x" * 1000,
                      # Metadata v1 request header + empty topic list: not allowed before SASL
                      (14).to_bytes(4, "big") + b"\x00\x03\x00\x01\x00\x00\x00\x07\x00\x00\xff\xff\xff\xff"):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(frame)
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 10) == b""      # closed, nothing answered
            writer.close()
    stored, _, _ = await read_stored(config, topic)
    assert stored == {}
