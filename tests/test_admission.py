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


def test_a_write_goes_to_the_partition_it_names_and_a_compacted_topics_must_name_one() -> None:
    compacted = TopicConfig("c", cleanup_policy="compact", storage_group="")   # 3 read partitions
    a = admission(hosted={"c": compacted, "p": TopicConfig("p")})
    for topic in ("c", "p"):
        ticket = a.admit("alice", topic, 10, 1)
        assert isinstance(ticket, Ticket) and ticket.partition == 1
    ticket = a.admit("alice", "p", 10)   # names none: the processor puts it in its batch's partition
    assert isinstance(ticket, Ticket) and ticket.partition == -1
    refused = a.admit("alice", "c", 10)
    assert isinstance(refused, Refusal) and refused.code is AckCode.PROTOCOL and not refused.no_partition
    assert "compacted over 3 read partitions: a write names its partition (0..2, placed by key)" in refused.why
    for topic in ("c", "p"):   # one the topic has not: Kafka's UNKNOWN_TOPIC_OR_PARTITION
        refused = a.admit("alice", topic, 10, 3)
        assert refused == Refusal(AckCode.PROTOCOL, f"topic {topic} has 3 read partitions (0..2), not 3",
                                  no_partition=True)


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


async def kafka_produce(broker: Broker, topic: str, partition: int = 0) -> tuple[int, str | None]:
    """(error code, error message) of one acks=all Produce v8 through the Kafka door."""
    host, port = broker.kafka_address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        batch = record_batch([LogMessage(b"v", timestamp_ms=1)])
        writer.write(request(0, 8, 1, produce_body(topic, partition, batch)))
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
    assert await ws_produce(broker, "open-t", 1) == (True, "OK", "")     # stored where it names, any topic
    assert await kafka_produce(broker, "open-t", 2) == (ErrorCode.NONE, None)
    assert await kafka_produce(broker, "open-t", 3) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                                        "topic open-t has 3 read partitions (0..2), not 3")
    assert await ws_produce(broker, "placed-t", 2) == (True, "OK", "")   # a compacted topic's: where it names
    ok, code, why = await ws_produce(broker, "placed-t")
    assert (ok, code) == (False, "PROTOCOL") and "names its partition" in why
