"""The Kafka listener on bad and edge-case input, with raw frames against an in-process broker
(file storage, no Kafka): error responses or a logged close, and other clients keep being served."""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.inproc import NullAdmin, NullPublisher
from tests.support.kafka_frames import produce_body, record_batch, request
from memq.broker.server import Broker
from memq.config import AuditConfig, BrokerConfig, MemqConfig, StorageConfig, TopicConfig
from memq.format import LogMessage, decode_batch
from memq.kafka_api.protocol import ErrorCode, Reader
from memq.storage import make_storage

pytestmark = pytest.mark.timeout(120)

MAX_FRAME = 64 * 1024


@pytest.fixture
async def broker(tmp_path) -> AsyncIterator[Broker]:
    config = MemqConfig(storage=StorageConfig(kind="file", root_dir=str(tmp_path)),
                        broker=BrokerConfig(kafka_port=0, max_frame_bytes=MAX_FRAME),
                        audit=AuditConfig(enabled=False),   # no Kafka here for the broker's audit records
                        topics=(TopicConfig("t1", read_partitions=2, batch_ms=20, storage_group=""),  # `stored` lists it
                                TopicConfig("gone", batch_ms=20)))
    b = Broker(config, publisher=NullPublisher(), admin=NullAdmin())
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, broker: Broker) -> Client:
        host, port = broker.kafka_address.rsplit(":", 1)
        return cls(*await asyncio.open_connection(host, int(port)))

    async def send(self, frame: bytes) -> None:
        self.writer.write(frame)
        await self.writer.drain()

    async def response(self) -> Reader:
        async with asyncio.timeout(10):
            (size,) = struct.unpack(">i", await self.reader.readexactly(4))
            return Reader(await self.reader.readexactly(size))

    async def closed(self) -> bool:
        async with asyncio.timeout(10):
            return await self.reader.read(1) == b""

    async def produce(self, correlation_id: int, topic: str, partition: int, records: bytes,
                      acks: int = -1) -> tuple[int, int, str | None]:
        """(correlation id, error code, error message) of a Produce v8 with one partition."""
        await self.send(request(0, 8, correlation_id, produce_body(topic, partition, records, acks=acks)))
        r = await self.response()
        cid, _, _, _, _, error = r.i32(), r.count(), r.string(), r.count(), r.i32(), r.i16()
        r.pos += 24
        r.count()
        return cid, error, r.nullable_string()


async def api_versions_ok(broker: Broker) -> bool:
    c = await Client.connect(broker)
    await c.send(request(18, 2, 1, b""))
    r = await c.response()
    c.writer.close()
    return (r.i32(), r.i16()) == (1, ErrorCode.NONE)


async def stored(broker: Broker, topic: str) -> list[LogMessage]:
    storage = make_storage(broker.config)
    try:
        out = []
        for info in await storage.list_topic(topic, 0, 2**62):
            for _, records in decode_batch(await storage.get(info.location))[1]:
                out.extend(records)
        return out
    finally:
        await storage.close()


async def test_newer_api_versions_gets_unsupported_version_with_our_ranges(broker: Broker) -> None:
    c = await Client.connect(broker)
    await c.send(request(18, 3, 5, b""))
    r = await c.response()
    assert (r.i32(), r.i16()) == (5, ErrorCode.UNSUPPORTED_VERSION)
    assert await api_versions_ok(broker)


@pytest.mark.parametrize("frame,why", [
    (request(99, 0, 1, b""), "unknown API"),
    (request(0, 2, 1, b""), "PRODUCE (key 0) version 2 is not served"),
    (request(3, 1, 1, b"\x00\x00\x00\x05"), "malformed request"),
    (struct.pack(">i", MAX_FRAME + 1), f"request of {MAX_FRAME + 1} bytes"),
    (struct.pack(">i", -4), "request of -4 bytes"),
])
async def test_bad_frames_close_the_connection_with_the_reason_logged(broker: Broker, caplog: pytest.LogCaptureFixture,
                                                                      frame: bytes, why: str) -> None:
    c = await Client.connect(broker)
    with caplog.at_level(logging.WARNING, "memq.broker.doors.kafka"):
        await c.send(frame)
        assert await c.closed()
    assert why in caplog.text
    assert await api_versions_ok(broker)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.binary(min_size=1, max_size=120), api=st.sampled_from([0, 1, 2, 3, 18, 22]))
async def test_fuzzed_frames_get_a_response_or_a_close_and_the_broker_serves_on(broker: Broker, junk: bytes,
                                                                                api: int) -> None:
    c = await Client.connect(broker)
    await c.send(request(api, {0: 8, 1: 11, 2: 5, 3: 8, 18: 2, 22: 1}[api], 3, junk))
    async with asyncio.timeout(10):
        head = await c.reader.read(4)   # a response, or EOF: never a hang
    assert head == b"" or struct.unpack(">i", head)[0] > 0
    c.writer.close()
    assert await api_versions_ok(broker)


async def test_produce_errors_name_the_problem(broker: Broker) -> None:
    c = await Client.connect(broker)
    good = record_batch([LogMessage(b"v", timestamp_ms=1)])
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 1
    assert (await c.produce(1, "t1", 0, bytes(bad_crc)))[1:] == (ErrorCode.CORRUPT_MESSAGE,
                                                                 "Kafka record batch CRC32C mismatch")
    assert (await c.produce(2, "nope", 0, good))[1] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert (await c.produce(3, "t1", 2, good))[1:] == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                                       "topic t1 has 2 read partitions (0..1), not 2")
    big = record_batch([LogMessage(b"x" * 6_000, timestamp_ms=1)])
    await broker.add_topic(TopicConfig("small", batch_ms=20, max_message_bytes=4096, batch_bytes=8192))
    assert (await c.produce(4, "small", 0, big))[1] == ErrorCode.MESSAGE_TOO_LARGE
    await broker.remove_topic("gone", moved_to=("http://elsewhere:1",))
    assert (await c.produce(5, "gone", 0, good))[1] == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert (await c.produce(6, "t1", 0, good)) == (6, ErrorCode.NONE, None)


async def test_acks_0_gets_no_response_and_idempotent_resends_are_stored_once(broker: Broker) -> None:
    c = await Client.connect(broker)
    recs = [LogMessage(b"a", b"k", (("h", b"1"),), 10), LogMessage(b"b", None, (), 11)]
    idem = record_batch(recs, codec="gzip", producer_id=77, epoch=0, base_sequence=0)
    await c.send(request(0, 8, 1, produce_body("t1", 1, record_batch([LogMessage(b"zero", timestamp_ms=5)]), acks=0)))
    assert await c.produce(2, "t1", 1, idem) == (2, ErrorCode.NONE, None)   # the acks=0 request got none
    assert await c.produce(3, "t1", 1, idem) == (3, ErrorCode.NONE, None)   # a retry: same ids, same outcome
    assert (await c.produce(4, "t1", 0, idem))[1] == ErrorCode.NONE          # another partition: its own ids
    got = await stored(broker, "t1")
    assert sorted(got) == sorted([LogMessage(b"zero", timestamp_ms=5)] + recs + recs)


def fetch_v4(parts: list[tuple[str, int, int]], max_wait_ms: int = 100) -> bytes:
    """A Fetch v4 body asking for each (topic, partition, offset), one topic entry each."""
    body = struct.pack(">iiiib", -1, max_wait_ms, 1, 1 << 20, 0) + struct.pack(">i", len(parts))
    for topic, partition, offset in parts:
        body += struct.pack(">h", len(topic)) + topic.encode() + struct.pack(">i", 1) \
            + struct.pack(">iqi", partition, offset, 1 << 20)
    return body


async def test_fetch_answers_bad_places_per_partition_without_reading(broker: Broker) -> None:
    c = await Client.connect(broker)
    await c.send(request(1, 4, 8, fetch_v4([("nope", 0, 0), ("t1", 2, 0), ("t1", 0, -5)])))
    r = await c.response()
    assert (r.i32(), r.i32(), r.count()) == (8, 0, 3)
    errors = []
    for _ in range(3):
        name, _n, index, error = r.string(), r.count(), r.i32(), r.i16()
        r.i64(), r.i64(), r.count(nullable=True)   # high watermark, last stable offset, aborted txns
        assert r.nullable_bytes(r.i32()) == b""
        errors.append((name, index, error))
    r.done()
    assert errors == [("nope", 0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), ("t1", 2, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                      ("t1", 0, ErrorCode.OFFSET_OUT_OF_RANGE)]


async def test_a_request_split_across_an_idle_seal_timeout_is_read_whole(broker: Broker) -> None:
    """With acks=all pending the listener reads the next size under a kafka_idle_seal_ms timeout;
    a timed-out read must consume nothing, so a frame arriving in pieces is still parsed intact."""
    c = await Client.connect(broker)
    batch = record_batch([LogMessage(b"v", timestamp_ms=1)])
    first, second = (request(0, 8, cid, produce_body("t1", 0, batch, acks=-1)) for cid in (1, 2))
    await c.send(first + second[:2])    # half of the next size while the first one's ack waits
    await asyncio.sleep(0.1)            # longer than the 20 ms idle: that read times out
    await c.send(second[2:])
    assert [(await c.response()).i32() for _ in range(2)] == [1, 2]
    assert (await c.produce(3, "t1", 0, batch))[:2] == (3, ErrorCode.NONE)


async def test_a_frame_whose_body_stalls_closes_the_connection_with_the_reason_logged(
        broker: Broker, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("memq.broker.doors.kafka.FRAME_READ_TIMEOUT_S", 0.2)
    c = await Client.connect(broker)
    with caplog.at_level(logging.WARNING, "memq.broker.doors.kafka"):
        await c.send(struct.pack(">i", 100) + b"partial")
        assert await c.closed()
    assert "request of 100 bytes not received in full" in caplog.text
    assert await api_versions_ok(broker)
