"""The one admission path: its checks run in one order, and a check added there applies to every
produce door (memq's WebSocket and Kafka's Produce) of a running broker."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from tests.support.inproc import NullAdmin, NullPublisher
from tests.support.kafka_frames import produce_body, record_batch, request
from memq.broker.admission import Admission, Entry, Refusal, Ticket
from memq.broker.guard import Guard
from memq.broker.placed import PlacedTopic
from memq.broker.metrics import BrokerMetrics
from memq.broker.server import Broker
from memq.clock import SystemClock
from memq.config import AuditConfig, BrokerConfig, MemqConfig, SecurityConfig, StorageConfig, TopicConfig
from memq.format import Codec, LogMessage, encode_message
from memq.format.wire import AckCode, AckLevel, decode_acks, encode_request
from memq.kafka_api.protocol import ErrorCode, Reader
from memq.security.quota import QuotaTable, Throttler

pytestmark = pytest.mark.timeout(60)


def frozen(entry: Entry, topic: TopicConfig) -> Refusal | None:
    """An extra rule for the tests: nothing is written to a topic named "frozen-*"."""
    if entry.topic.startswith("frozen-"):
        return Refusal(AckCode.DENIED, f"topic {entry.topic} is frozen for {entry.principal or 'anyone'}")
    return None


def admission(*, hosted: dict[str, TopicConfig], allow: bool = True, checks: tuple[Any, ...] = ()) -> Admission:
    metrics = BrokerMetrics("b1")
    security = SecurityConfig(enabled=True, acls=() if not allow else ("allow alice produce prefix:",))
    procs = {name: SimpleNamespace(config=cfg) for name, cfg in hosted.items()}
    return Admission(guard=Guard(security, metrics.denials),
                     quotas=Throttler(QuotaTable(), burst_s=1.0, max_delay_s=1.0),
                     metrics=metrics, clock=SystemClock(), processor=procs.get,  # type: ignore[arg-type]
                     where_is=lambda t: (AckCode.UNKNOWN_TOPIC, f"topic {t!r} is not known", ()), checks=checks)


def test_checks_run_in_order_acl_hosted_size_then_extra_checks() -> None:
    small = TopicConfig("frozen-a", max_message_bytes=100)
    denied = admission(hosted={"frozen-a": small}, allow=False, checks=(frozen,))
    assert denied.admit("alice", "frozen-a", 10_000) == Refusal(
        AckCode.DENIED, "principal alice may not produce to topic frozen-a")
    a = admission(hosted={"frozen-a": small}, checks=(frozen,))
    refused = a.admit("alice", "nope", 10_000)
    assert isinstance(refused, Refusal) and refused.code is AckCode.UNKNOWN_TOPIC
    refused = a.admit("alice", "frozen-a", 101)
    assert isinstance(refused, Refusal) and refused.code is AckCode.TOO_LARGE and "max_message_bytes=100" in refused.why
    assert a.admit("alice", "frozen-a", 100) == Refusal(AckCode.DENIED, "topic frozen-a is frozen for alice")
    ticket = admission(hosted={"frozen-a": small}).admit("alice", "frozen-a", 100)
    assert isinstance(ticket, Ticket) and ticket.config is small


def test_a_compacted_topic_of_several_partitions_admits_a_write_to_the_partition_it_names() -> None:
    cfg = TopicConfig("c", cleanup_policy="compact", storage_group="")   # 3 read partitions
    lanes = [SimpleNamespace(config=cfg, partition=p) for p in range(3)]
    metrics = BrokerMetrics("b1")
    a = Admission(guard=Guard(SecurityConfig(), metrics.denials), quotas=Throttler(QuotaTable(), burst_s=1.0, max_delay_s=1.0),
                  metrics=metrics, clock=SystemClock(), processor={"c": PlacedTopic(lanes)}.get,  # type: ignore[arg-type, dict-item]
                  where_is=lambda t: (AckCode.UNKNOWN_TOPIC, t, ()))
    ticket = a.admit(None, "c", 10, 1)
    assert isinstance(ticket, Ticket) and ticket.partition == 1 and ticket.config is cfg
    for partition in (-1, 3):   # a write that names no partition, or one the topic has not
        refused = a.admit(None, "c", 10, partition)
        assert isinstance(refused, Refusal) and refused.code is AckCode.PROTOCOL
        assert f"compacted over 3 read partitions: a write names its partition (0..2, placed by key), not {partition}" \
            in refused.why


@pytest.fixture
async def broker(tmp_path) -> AsyncIterator[Broker]:
    config = MemqConfig(storage=StorageConfig(kind="file", root_dir=str(tmp_path)),
                        broker=BrokerConfig(kafka_port=0), audit=AuditConfig(enabled=False),
                        topics=(TopicConfig("frozen-t", batch_ms=20), TopicConfig("open-t", batch_ms=20),
                                TopicConfig("placed-t", batch_ms=20, cleanup_policy="compact", storage_group="")))
    b = Broker(config, publisher=NullPublisher(), admin=NullAdmin(), checks=(frozen,))
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


async def ws_produce(broker: Broker, topic: str, partition: int = -1) -> tuple[bool, str, str]:
    """(ok, code, error) of one ack=all Message through memq's WebSocket door (to `partition`, if >= 0:
    the ack must say it went there)."""
    msg = encode_message([LogMessage(b"v", key=b"k")], producer_id=1, epoch=0, sequence=(hash(topic) + partition) & 0xFFFF,
                         codec=Codec.NONE)
    async with aiohttp.ClientSession() as s, s.ws_connect(broker.url + "/v1/produce") as ws:
        await ws.send_bytes(encode_request(5, AckLevel.ALL, topic, bytes(msg), partition=partition))
        async with asyncio.timeout(10):
            reply = await ws.receive()
    [ack] = decode_acks(reply.data)
    assert not ack.ok or partition < 0 or ack.partition == partition
    return ack.ok, str(ack.code), ack.error


async def kafka_produce(broker: Broker, topic: str) -> tuple[int, str | None]:
    """(error code, error message) of one acks=all Produce v8 through the Kafka door."""
    host, port = broker.kafka_address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        batch = record_batch([LogMessage(b"v", timestamp_ms=1)])
        writer.write(request(0, 8, 1, produce_body(topic, 0, batch)))
        async with asyncio.timeout(10):
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            r = Reader(await reader.readexactly(size))
    finally:
        writer.close()
    r.i32(), r.count(), r.string(), r.count(), r.i32()
    error = r.i16()
    r.pos += 24
    r.count()
    return error, r.nullable_string()


async def test_a_check_added_to_the_admission_path_applies_to_both_produce_doors(broker: Broker) -> None:
    assert await ws_produce(broker, "frozen-t") == (False, "DENIED", "topic frozen-t is frozen for anyone")
    assert await kafka_produce(broker, "frozen-t") == (ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                                       "topic frozen-t is frozen for anyone")
    ok, code, _ = await ws_produce(broker, "open-t")
    assert (ok, code) == (True, "OK")
    assert await kafka_produce(broker, "open-t") == (ErrorCode.NONE, None)
    assert await ws_produce(broker, "placed-t", 2) == (True, "OK", "")   # a compacted topic's: where it names
    ok, code, why = await ws_produce(broker, "placed-t")
    assert (ok, code) == (False, "PROTOCOL") and "names its partition" in why
