"""Security against running brokers (in this process, on the real dev cluster's moto S3 and
tansu) through the real Producer, metadata clients and CLI: tokens, client certificates, TLS
trust and per-topic ACLs. Every refused client gets a clear error and nothing is stored."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from click.testing import CliRunner, Result

from memq.cli import main
from memq.client._auth import BrokerAuth
from memq.client.cluster import fetch_metadata, resolve_topic
from memq.client.producer import Producer
from memq.config import AuditConfig, MemqConfig, ProducerConfig, SecurityConfig, load_config
from memq.devcluster import DevCluster
from memq.devcluster.broker_process import config_toml
from memq.errors import AuthenticationError, AuthorizationError, BrokerUnavailableError, ProduceError
from memq.security.tokens import new_token
from tests.support.security import ALICE, ALICE_ENTRY, BOB, BOB_ENTRY
from tests.support.cluster import read_stored, running_broker, topic_config

pytestmark = pytest.mark.integration

REVOKED, _ = new_token("alice")          # issued, then its entry removed from the config


def client(url: str, **kw: Any) -> ProducerConfig:
    return ProducerConfig(brokers=url, **{"linger_ms": 1, "request_timeout_ms": 5_000, "retries": 1,
                                          "delivery_timeout_ms": 10_000, **kw})


async def stored_values(config: MemqConfig, topic: str) -> list[bytes]:
    stored, _, _ = await read_stored(config, topic)
    return sorted(v for _, v, _ in stored.values())


def secured(config: MemqConfig, acls: list[str], **tls: str) -> MemqConfig:
    return dataclasses.replace(config, security=SecurityConfig(
        enabled=True, tokens=(str(ALICE_ENTRY), str(BOB_ENTRY)), acls=tuple(acls), **tls))


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, str]:
    """A CA, the broker's certificate for 127.0.0.1, a client certificate with CN alice, and an
    unrelated CA (the 'wrong CA'), as files."""
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    alice = ca.issue_cert("alice.clients.memq.test", common_name="alice")
    files = {"ca": ca.cert_pem, "other_ca": other.cert_pem, "cert": server.cert_chain_pems[0],
             "key": server.private_key_pem, "alice_cert": alice.cert_chain_pems[0],
             "alice_key": alice.private_key_pem}
    out = {}
    for name, blob in files.items():
        path = tmp_path / f"{name}.pem"
        blob.write_to_path(str(path))
        out[name] = str(path)
    return out


async def test_tokens_and_acls_on_produce_and_metadata(devcluster: DevCluster,
                                                       unique_name: Callable[[str], str]) -> None:
    orders, secret, other = unique_name("orders"), unique_name("orders-secret"), unique_name("other")
    config = secured(devcluster.config(topics=[topic_config(t) for t in (orders, secret, other)]), [
        f"allow alice produce prefix:{orders[:6]}",          # every orders* topic...
        f"deny alice produce literal:{secret}",              # ...but this one: deny wins
        "allow alice describe prefix:",
        f"allow bob describe literal:{orders}",
    ])
    async with running_broker(config) as broker:
        url = broker.url
        async with Producer(client(url, token=ALICE)) as p:
            assert (await (await p.send(orders, b"alice-ok"))).key
            with pytest.raises(AuthorizationError, match=f"principal alice may not produce to topic {secret}"):
                await (await p.send(secret, b"denied"))
            with pytest.raises(AuthorizationError, match=f"principal alice may not produce to topic {other}"):
                await (await p.send(other, b"no allow rule"))
        async with Producer(client(url, token=BOB)) as p:
            with pytest.raises(AuthorizationError, match=f"principal bob may not produce to topic {orders}"):
                await (await p.send(orders, b"bob"))
        for token, match in (("", "requires a token and none is set"), ("memq_wrong", "rejected the token"),
                             (REVOKED, "rejected the token")):
            async with Producer(client(url, token=token)) as p:
                with pytest.raises(AuthenticationError, match=f"broker {url} {match}"):
                    await (await p.send(orders, b"unauthenticated"))
            with pytest.raises(AuthenticationError, match=match):
                await asyncio.to_thread(fetch_metadata, url, 5, BrokerAuth(token))
        # describe: a principal sees only the topics it may describe
        seen_by_bob = await asyncio.to_thread(fetch_metadata, url, 5, BrokerAuth(BOB))
        seen_by_alice = await asyncio.to_thread(fetch_metadata, url, 5, BrokerAuth(ALICE))
        assert set(seen_by_bob.topics) == {orders}
        assert set(seen_by_alice.topics) == {orders, secret, other}
        # the Consumer's and Spark's resolver: credentials from the config, no silent fallback without them
        as_bob = dataclasses.replace(config, producer=client(url, token=BOB))
        assert (await asyncio.to_thread(resolve_topic, as_bob, orders)).source == "metadata"
        with pytest.raises(AuthenticationError, match="requires a token"):
            await asyncio.to_thread(resolve_topic, dataclasses.replace(config, producer=client(url)), orders)
        # TLS client to this plaintext broker
        with pytest.raises(AuthenticationError, match="does not speak TLS"):
            await asyncio.to_thread(fetch_metadata, url.replace("http://", "https://"), 5, BrokerAuth(ALICE))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            metrics = await (await s.get(url + "/metrics")).text()
    assert 'memq_broker_denials_total{operation="produce"} 3.0' in metrics
    assert 'memq_broker_denials_total{operation="authenticate"}' in metrics
    assert await stored_values(config, orders) == [b"alice-ok"]
    assert await stored_values(config, secret) == [] and await stored_values(config, other) == []


async def test_tls_trust_and_client_certificates(devcluster: DevCluster, unique_name: Callable[[str], str],
                                                 pki: dict[str, str]) -> None:
    topic = unique_name("tls")
    config = secured(devcluster.config(topics=[topic_config(topic)]), [f"allow alice produce literal:{topic}",
                                                                       f"allow alice describe literal:{topic}"],
                     tls_cert_file=pki["cert"], tls_key_file=pki["key"], tls_client_ca_file=pki["ca"])
    async with running_broker(config) as broker:
        url = broker.url
        assert url.startswith("https://")
        async with Producer(client(url, token=ALICE, tls_ca_file=pki["ca"])) as p:
            assert (await (await p.send(topic, b"token-over-tls"))).key
        # no token: the client certificate's CN is the principal
        async with Producer(client(url, tls_ca_file=pki["ca"], tls_cert_file=pki["alice_cert"],
                                   tls_key_file=pki["alice_key"])) as p:
            assert (await (await p.send(topic, b"client-cert"))).key
        async with Producer(client(url, token=ALICE, tls_ca_file=pki["other_ca"])) as p:
            with pytest.raises(AuthenticationError, match=f"certificate verify failed for broker {url}"):
                await (await p.send(topic, b"wrong-ca"))
        with pytest.raises(AuthenticationError, match="certificate verify failed"):
            await asyncio.to_thread(fetch_metadata, url, 5, BrokerAuth.of(client(url, tls_ca_file=pki["other_ca"])))
        plain = url.replace("https://", "http://")
        async with Producer(client(plain, token=ALICE)) as p:
            with pytest.raises((ProduceError, BrokerUnavailableError), match="https://"):
                await (await p.send(topic, b"plaintext"))
        with pytest.raises(BrokerUnavailableError, match="as a TLS broker does to a plaintext client"):
            await asyncio.to_thread(fetch_metadata, plain, 5, BrokerAuth(ALICE))
    assert await stored_values(config, topic) == [b"client-cert", b"token-over-tls"]


async def test_unauthenticated_garbage_is_closed_unbuffered(devcluster: DevCluster,
                                                            unique_name: Callable[[str], str]) -> None:
    topic = unique_name("garbage")
    config = secured(devcluster.config(topics=[topic_config(topic)]), [f"allow alice produce literal:{topic}"])
    async with running_broker(config) as broker:
        host, port = broker.url.removeprefix("http://").split(":")
        # the produce upgrade without credentials: 401 before any frame
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            with pytest.raises(aiohttp.WSServerHandshakeError) as e:
                await s.ws_connect(broker.url + "/v1/produce")
            assert e.value.status == 401

        def raw(payload: bytes) -> bytes:
            """What the broker answers before closing the connection (it must close it)."""
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                try:
                    sock.sendall(payload)
                    sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass          # the broker closed first
                got = b""
                try:
                    while chunk := sock.recv(65536):
                        got += chunk
                except TimeoutError:
                    raise AssertionError("the broker kept an unauthenticated connection open") from None
                except OSError:
                    pass          # reset: closed without reading the rest
                return got

        assert not (await asyncio.to_thread(raw, b"\x00\xffMQ garbage " * 1000)).startswith(b"HTTP/1.1 2")
        # an upgrade request without a token followed by a huge frame: refused, connection closed
        upgrade = (f"GET /v1/produce HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").encode()
        answer = await asyncio.to_thread(raw, upgrade + b"\x82\x7f" + (64 * 1024 * 1024).to_bytes(8, "big")
                                         + b"x" * 1_000_000)
        assert answer.startswith(b"HTTP/1.1 401")
        assert broker.metrics.connections._value.get() == 0
    assert await stored_values(config, topic) == []


async def test_cli_token_and_acl_commands_secure_a_broker(devcluster: DevCluster, unique_name: Callable[[str], str],
                                                          tmp_path: Path) -> None:
    """`memq token create --write` and `memq acl add` edit the config file a broker then starts
    with; `memq produce` takes the token from MEMQ_PRODUCER_TOKEN; `memq token revoke` ends it."""
    topic, other = unique_name("cli"), unique_name("cli-other")
    base = dataclasses.replace(devcluster.config(topics=[topic_config(topic), topic_config(other)]),
                               audit=AuditConfig(enabled=False), security=SecurityConfig(enabled=True))
    path = tmp_path / "memq.toml"
    path.write_text(config_toml(base))
    runner = CliRunner()

    def memq(*args: str, **kw: Any) -> Result:
        return runner.invoke(main, ["--config", str(path), *args], catch_exceptions=False, **kw)

    created = memq("token", "create", "carol", "--write")
    assert created.exit_code == 0, created.output
    token = created.output.splitlines()[1]
    assert token not in path.read_text()                    # only its hash is stored
    for rule in (f"allow carol produce literal:{topic}", "allow carol describe prefix:"):
        assert memq("acl", "add", *rule.split()).exit_code == 0
    assert memq("acl", "add", "allow", "carol", "write", "literal:x").exit_code == 2   # names the bad rule
    assert memq("acl", "list").output.splitlines() == [f"allow carol produce literal:{topic}",
                                                       "allow carol describe prefix:"]

    async def produce(config: MemqConfig, url: str, name: str, env: dict[str, str]) -> Result:
        return await asyncio.to_thread(memq, "produce", name, "--brokers", url, "--generate", "2", "--size", "5",
                                       env={"MEMQ_PRODUCER_TOKEN": "", "MEMQ_PRODUCER_RETRIES": "1", **env})

    config = load_config(path, env={})
    async with running_broker(config) as broker:
        ok = await produce(config, broker.url, topic, {"MEMQ_PRODUCER_TOKEN": token})
        assert ok.exit_code == 0, ok.output
        denied = await produce(config, broker.url, other, {"MEMQ_PRODUCER_TOKEN": token})
        assert denied.exit_code == 1 and f"principal carol may not produce to topic {other}" in denied.output
        anonymous = await produce(config, broker.url, topic, {})
        assert anonymous.exit_code == 1 and "requires a token and none is set" in anonymous.output
    assert memq("token", "revoke", "carol").exit_code == 0
    async with running_broker(load_config(path, env={})) as broker:
        revoked = await produce(config, broker.url, topic, {"MEMQ_PRODUCER_TOKEN": token})
        assert revoked.exit_code == 1 and "rejected the token" in revoked.output
    assert len(await stored_values(config, topic)) == 2      # the one authorized run, nothing else
    assert await stored_values(config, other) == []
