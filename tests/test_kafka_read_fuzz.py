"""Fuzzed Fetch, ListOffsets, group and admin frames against a broker's Kafka listener on the real dev
cluster (moto S3, tansu: the group APIs are relayed to its coordinator): each gets a response
or a close, never a hang, while another client on the same listener goes on reading. Mutations
of well-formed requests (truncated, bytes flipped, fields set to extremes, junk appended or
instead), seeded and bounded in count and time."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import struct
import time
from collections.abc import Iterator

import pytest
from tests.support.kafka_clients import Running, broker_thread, kafka_produce, rows
from tests.support.kafka_frames import fetch_body, group_bodies, list_offsets_body, request

from memq.config import BrokerConfig
from memq.devcluster import DevCluster
from memq.kafka_api.protocol import ErrorCode, Reader

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FRAMES = 160          # fuzzed frames in all
AT_ONCE = 8           # on as many connections at a time
ANSWER_S = 40.0       # a response or a close within this (a Fetch waits at most 30 s)
EXTREMES = (-1, 0, 0x7FFFFFFF, -0x80000000, 1 << 20)


@pytest.fixture(scope="module")
def running(devcluster: DevCluster) -> Iterator[Running]:
    with broker_thread(dataclasses.replace(devcluster.config(cluster="kafkafuzz"),
                                           broker=BrokerConfig(kafka_port=0))) as r:
        yield r


def mutate(rng: random.Random, body: bytes) -> bytes:
    kind = rng.randrange(5)
    if kind == 0 or not body:
        return rng.randbytes(rng.randrange(0, 64))
    if kind == 1:
        return body[:rng.randrange(len(body))]
    if kind == 2:
        out = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return bytes(out)
    if kind == 3 and len(body) >= 4:
        at = rng.randrange(len(body) - 3)
        return body[:at] + struct.pack(">i", rng.choice(EXTREMES)) + body[at + 4:]
    return body + rng.randbytes(rng.randint(1, 16))


async def answer_or_close(address: str, frame: bytes) -> str:
    """'answered' or 'closed'; fails on a hang."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(frame)
        async with asyncio.timeout(ANSWER_S):
            head = await reader.read(4)
            if len(head) < 4:
                return "closed"
            (size,) = struct.unpack(">i", head)
            assert size > 0
            await reader.readexactly(size)
            return "answered"
    except ConnectionError:
        return "closed"
    finally:
        writer.close()


async def answer_of(address: str, frame: bytes) -> bytes:
    """The response body (after the correlation id) the listener answers `frame` with."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(frame)
        async with asyncio.timeout(ANSWER_S):
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            return (await reader.readexactly(size))[4:]
    finally:
        writer.close()


async def fetch_records(address: str, topic: str, correlation_id: int) -> int:
    """Bytes of records a Fetch v11 of partition 0 from offset 0 returns; fails on any error."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request(1, 11, correlation_id, fetch_body(11, [(topic, 0, 0, 1 << 20)])))
        async with asyncio.timeout(ANSWER_S):
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            r = Reader(await reader.readexactly(size))
        assert r.i32() == correlation_id
        r.i32()
        assert r.i16() == ErrorCode.NONE
        r.i32()
        assert (r.count(), r.string(), r.count(), r.i32()) == (1, topic, 1, 0)
        assert r.i16() == ErrorCode.NONE
        r.pos += 24   # high watermark, last stable offset, log start
        r.count(nullable=True)   # aborted transactions (null)
        r.i32()       # preferred read replica
        return r.i32()
    finally:
        writer.close()


async def fuzz_beside_a_reader(address: str, topic: str, valid: dict[tuple[int, int], bytes], seed: int) -> list[str]:
    """Every valid frame is answered; then FRAMES seeded mutations of them, AT_ONCE at a time, each
    get an answer or a close while another client keeps reading `topic`; their outcomes."""
    for (key, version), body in valid.items():   # the unfuzzed frames are served
        assert await answer_or_close(address, request(key, version, 1, body)) == "answered", (key, version)
    served: list[int] = []
    stop = asyncio.Event()

    async def bystander() -> None:
        while not stop.is_set():
            assert await fetch_records(address, topic, len(served) + 1) > 0
            served.append(1)

    reading = asyncio.ensure_future(bystander())
    rng = random.Random(seed)
    frames = [(key, version, mutate(rng, valid[key, version]))
              for key, version in (rng.choice(list(valid)) for _ in range(FRAMES))]
    gate = asyncio.Semaphore(AT_ONCE)

    async def one(key: int, version: int, body: bytes) -> str:
        async with gate:
            return await answer_or_close(address, request(key, version, 7, body))

    outcomes = await asyncio.gather(*(one(*f) for f in frames))
    stop.set()
    await reading
    assert served, "the other client was not served while the fuzzing went on"
    assert await fetch_records(address, topic, 9999) > 0
    return list(outcomes)


async def test_fuzzed_read_and_group_frames_get_an_answer_or_a_close_while_another_client_reads(
        running: Running) -> None:
    topic = running.add_topic(partitions=1)
    address = running.broker.kafka_address
    await asyncio.to_thread(kafka_produce, address, topic, rows(50, "fuzz"), acks="all")
    valid = {(1, 4): fetch_body(4, [(topic, 0, 0, 1 << 20)], max_wait_ms=500),
             (1, 11): fetch_body(11, [(topic, 0, 0, 1 << 20)], max_wait_ms=500),
             (2, 1): list_offsets_body(1, topic, [(0, -2)]),
             (2, 5): list_offsets_body(5, topic, [(0, -1)]),
             **group_bodies("fuzzed", topic)}
    t0 = time.monotonic()
    outcomes = await fuzz_beside_a_reader(address, topic, valid, 27)
    assert len(outcomes) == FRAMES and set(outcomes) == {"answered", "closed"}   # error responses and closes
    assert time.monotonic() - t0 < 120


# --- the admin families ---------------------------------------------------------------------

#: The families whose frames the admin fuzzing sends (the read and group ones are fuzzed above).
ADMIN_FAMILIES = ("topics", "configs", "acls", "cluster", "records", "transactions")


def admin_bodies() -> dict[tuple[int, int], bytes]:
    """A well-formed request body (kafka-python's encoding of the request with its defaults: empty
    lists, no topic created or deleted) for every version of every admin API the listener serves."""
    import kafka.protocol.admin as admin
    import kafka.protocol.consumer as consumer
    import kafka.protocol.metadata as metadata
    import kafka.protocol.producer as producer
    from kafka.protocol.api_key import ApiKey as KafkaApiKey

    from memq.broker.doors.kafka import FAMILIES

    out = {}
    for family in FAMILIES:
        if family.name not in ADMIN_FAMILIES:
            continue
        for key, (lo, hi) in family.versions.items():
            name = KafkaApiKey(key).name + "Request"
            cls = next(getattr(m, name) for m in (admin, consumer, metadata, producer) if hasattr(m, name))
            for v in range(lo, hi + 1):
                out[key, v] = (b"\0" if cls.flexible_version_q(v) else b"") + bytes(cls[v]().encode())
    return out


async def test_fuzzed_admin_frames_get_an_answer_or_a_close_while_another_client_reads(running: Running) -> None:
    topic = running.add_topic(partitions=1)
    address = running.broker.kafka_address
    await asyncio.to_thread(kafka_produce, address, topic, rows(20, "admin-fuzz"), acks="all")
    valid = admin_bodies()
    assert valid, "no admin family is served"
    outcomes = await fuzz_beside_a_reader(address, topic, valid, 38)
    assert len(outcomes) == FRAMES and "answered" in outcomes


async def test_a_null_transactional_id_is_answered_invalid_request(running: Running) -> None:
    """As Kafka answers it (not a closed connection): AddPartitionsToTxn and EndTxn v0 whose
    transactional id is null."""
    topic = running.add_topic(partitions=1)
    address = running.broker.kafka_address
    null_id, ids = struct.pack(">h", -1), struct.pack(">qh", 1, 0)
    name = struct.pack(">h", len(topic)) + topic.encode()
    add = await answer_of(address, request(24, 0, 3, null_id + ids + struct.pack(">i", 1) + name
                                           + struct.pack(">ii", 1, 0)))
    # throttle, [topic, [partition, error]]
    assert add[:4] == b"\0\0\0\0" and add[4:8] == struct.pack(">i", 1) and add[8:8 + len(name)] == name
    assert struct.unpack(">iih", add[8 + len(name):]) == (1, 0, 42)
    end = await answer_of(address, request(26, 0, 4, null_id + ids + b"\1"))
    assert struct.unpack(">ih", end) == (0, 42)
