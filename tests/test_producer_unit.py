"""The Producer's halves without a server: the Accumulator (no event loop at all) and the
Sender/Producer over an in-process fake broker connection."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from kafka.partitioner.default import murmur2 as kafka_murmur2

from memq.client.accumulator import Accumulator, record_size
from memq.client.placement import key_partition, murmur2, runs
from memq.client.producer import Producer
from memq.config import ProducerConfig
from memq.errors import ConfigError, MessageTooLargeError, ProduceError, ProducerClosedError, ProducerTimeoutError, UnknownTopicError
from memq.format import Codec, decode_message
from memq.format.wire import Ack, AckCode, decode_request

from tests.support.producer import FakeBroker, FakeRouter, producer

pytestmark = pytest.mark.timeout(30)


@dataclass
class W:
    name: str
    position: int = -1


def rec(value: bytes, ts: int = 10) -> tuple:
    return (value, None, (), ts, None)


def acc(seal_bytes: int = 100, clock: Callable[[], int] = lambda: 1234) -> Accumulator[W]:
    return Accumulator(seal_bytes=seal_bytes, producer_id=7, epoch=2, codec=Codec.NONE, clock_ms=clock)


T, U = ("t", -1), ("u", -1)   # lanes: (topic, partition), -1 where the broker picks


def test_accumulator_seals_by_size_and_numbers_messages_per_topic() -> None:
    a = acc(seal_bytes=100)
    a.register("t")
    a.register("u")
    r = rec(b"x" * 30)
    n = record_size(r)
    assert a.add(T, [r], n, 10, 10, W("a")) == (True, False)           # opened: start linger
    assert a.add(T, [r, r], 2 * n, 5, 20, W("b")) == (False, True)     # full: seal now
    assert a.room(T) == 1                                                # full: at least 1
    m = a.seal(T)
    assert m is not None and m.error is None
    assert (m.topic, m.sequence, m.count, m.nbytes, m.created_ms) == ("t", 0, 3, 3 * n, 1234)
    assert m.waiters == [W("a", 0), W("b", 1)]                           # each knows where its run starts
    header, logs = decode_message(bytes(m.frame[m.message_at:]))
    assert (header.producer_id, header.epoch, header.sequence, header.count) == (7, 2, 0, 3)
    assert (header.min_timestamp_ms, header.max_timestamp_ms) == (5, 20)
    assert [bytes(x.value) for x in logs] == [b"x" * 30] * 3
    assert a.seal(T) is None and a.room(T) == 100
    a.add(U, [r], n, 1, 1, W("c"))
    a.add(T, [r], n, 1, 1, W("d"))
    assert sorted(a.lanes()) == [T, U]
    assert (a.seal(U).sequence, a.seal(T).sequence) == (0, 1)    # type: ignore[union-attr]


def test_accumulator_reports_an_encoding_failure_with_its_waiters() -> None:
    a: Accumulator[W] = Accumulator(seal_bytes=100, producer_id=1, epoch=2 ** 32, codec=Codec.NONE)  # epoch > u32
    a.register("t")
    a.add(T, [rec(b"v")], 10, 1, 1, W("w"))
    m = a.seal(T)
    assert m is not None and m.error is not None and m.waiters == [W("w", 0)] and not m.frame


# Kafka's own murmur2 vectors (clients/src/test/.../UtilsTest.testMurmur2), signed as Java's int
JAVA_MURMUR2 = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
                b"a-little-bit-longer-string": -1486304829,
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, b"abc": 479470107}


def test_a_key_goes_to_the_partition_kafkas_default_partitioner_picks() -> None:
    for key, java in JAVA_MURMUR2.items():
        assert murmur2(key) == java & 0xFFFFFFFF
        for n in (1, 3, 7, 100):
            assert key_partition(key, n) == (java & 0x7FFFFFFF) % n   # Utils.toPositive(murmur2(key)) % n
    rng = random.Random(46)   # memq's murmur2 against kafka-python's, every length up to 64 bytes
    for key in [rng.randbytes(n % 65) for n in range(2_000)]:
        assert murmur2(key) == kafka_murmur2(key)
    keys = [b"k%d" % i for i in range(40)]
    got = list(runs(keys, 3))
    assert got[0][0] == 0 and got[-1][1] == 40 and all(a[1] == b[0] for a, b in zip(got, got[1:]))
    assert all(key_partition(k, 3) == p for s, e, p in got for k in keys[s:e])
    assert all(a[2] != b[2] for a, b in zip(got, got[1:]))   # maximal runs


@pytest.mark.parametrize("compacted", [frozenset({"t"}), frozenset()])
async def test_keyed_records_go_one_message_per_partition_each_naming_it(compacted: frozenset[str]) -> None:
    """Compacted or not, a topic of several partitions gets its keyed records placed by key."""
    broker = FakeBroker([AckCode.OK])
    keys = [b"key-%d" % i for i in range(30)]
    async with producer(broker, partitions={"t": 3}, compacted=compacted) as p:
        many = await p.send_many("t", [b"v" + k for k in keys], keys=keys)
        one = await p.send("t", b"one", key=b"foobar")
        await p.flush()
        deliveries = await many
        assert (await one).count == 1
    placed: dict[bytes, int] = {}
    for frame in broker.frames:
        req = decode_request(frame)
        for r in decode_message(bytes(req.message))[1]:
            assert r.key is not None
            placed[r.key] = req.partition
    assert placed == {k: key_partition(k, 3) for k in [*keys, b"foobar"]}
    assert len(broker.frames) == len(set(placed.values())) == 3   # one Message per partition, sealed by flush
    assert sum(d.count for d in deliveries) == 30                 # one Delivery per run, in record order
    assert [d.count for d in deliveries] == [e - s for s, e, _ in runs(keys, 3)]


async def test_records_without_a_key_name_no_partition_and_keyed_ones_of_one_partition_topics_neither() -> None:
    """Records without a key go where the broker puts its batch (one Message, no per-record
    work), beside keyed ones placed by key; a topic of one partition names none at all."""
    broker = FakeBroker([AckCode.OK])
    async with producer(broker, partitions={"t": 3}) as p:
        deliveries = await p.send_many("t", [b"a", b"b", b"c", b"d"], keys=[None, None, b"x", None])
        await p.send_many("t", [b"e"] * 10)
        await p.flush()
        assert [(d.count, d.position) for d in await deliveries] == [(2, 0), (1, 0), (1, 2)]   # in record order
    requests = [decode_request(f) for f in broker.frames]
    assert sorted(r.partition for r in requests) == [-1, key_partition(b"x", 3)]
    unkeyed = next(r for r in requests if r.partition < 0)
    assert [r.value for r in decode_message(bytes(unkeyed.message))[1]] == [b"a", b"b", b"d", *[b"e"] * 10]
    broker = FakeBroker([AckCode.OK])
    async with producer(broker, partitions={"other": 3}) as p:
        await p.send_many("t", [b"a", b"b"], keys=[b"x", b"y"])
        await p.flush()
    assert [decode_request(f).partition for f in broker.frames] == [-1]


# --- the Sender through its seams --------------------------------------------------------------


async def test_a_message_over_the_brokers_frame_limit_fails_at_once_naming_both_sizes() -> None:
    broker = FakeBroker([AckCode.OK])
    async with producer(broker, frame_limit=4096, retries=5) as p:
        small = await p.send("t", b"s" * 100)
        await p.flush()
        big = await p.send("t", os.urandom(10_000))   # incompressible
        await p.flush()
        with pytest.raises(MessageTooLargeError, match=r"Message of 10\d{3} bytes is over .*max_frame_bytes=4096"):
            await big
    assert (await small).sequence == 0
    assert len(broker.frames) == 1                    # the big one was never sent, nor retried


async def test_a_retriable_failure_resends_the_same_message_then_delivers() -> None:
    broker = FakeBroker([AckCode.BUSY, AckCode.OK])
    async with producer(broker) as p:
        one = await p.send("t", b"a")
        many = await p.send_many("t", [b"b", b"c"])
        await p.flush()
    delivered = [await one, *(await many)]
    assert [(d.sequence, d.position, d.count) for d in delivered] == [(0, 0, 1), (0, 1, 2)]
    assert len(broker.frames) == 2 and broker.closed
    first, retry = (decode_request(f) for f in broker.frames)
    assert first.request_id != retry.request_id and bytes(first.message) == bytes(retry.message)   # same bytes


async def test_exhausted_retries_fail_every_waiter_and_unknown_topics_fail_after_max_block_ms() -> None:
    broker = FakeBroker([AckCode.BUSY])
    p = producer(broker, retries=2, max_block_ms=200)
    fut = await p.send("t", b"a")
    await p.flush()
    with pytest.raises(ProduceError, match="after 3 attempts"):
        await fut
    assert len(broker.frames) == 3
    with pytest.raises(UnknownTopicError, match="nope.*still unknown after 0.2 s .producer.max_block_ms"):
        await p.send("nope", b"a")
    await p.close()


class LateRouter(FakeRouter):
    """Knows topic "late" only from its `after`-th metadata request on (a broker still starting)."""

    def __init__(self, url: str, after: int) -> None:
        super().__init__({"t": [url]})
        self.url, self.after, self.asked = url, after, 0

    async def brokers_for(self, topic: str) -> list[str]:
        if topic == "late":
            self.asked += 1
            if self.asked >= self.after:
                self.topics["late"] = [self.url]
        return await super().brokers_for(topic)


async def test_send_waits_for_a_topic_that_is_not_hosted_yet_asking_again() -> None:
    broker = FakeBroker([AckCode.OK])
    router = LateRouter(broker.url, after=4)
    p = Producer(ProducerConfig(brokers="http://fake", linger_ms=1, retry_backoff_ms=1, max_block_ms=5_000),
                 router=router, connector=broker.connect)
    assert (await (await p.send("late", b"a"))).topic == "late"
    assert router.asked >= 4
    await p.close()


async def test_a_broker_answering_unknown_topic_is_retried_past_retries_until_the_delivery_deadline() -> None:
    broker = FakeBroker([AckCode.UNKNOWN_TOPIC] * 4 + [AckCode.OK])   # more refusals than `retries`
    p = producer(broker, retries=1)
    assert (await (await p.send("t", b"a"))).topic == "t"
    assert len(broker.frames) == 5
    await p.close()

    broker = FakeBroker([AckCode.UNKNOWN_TOPIC])                         # never hosted
    p = producer(broker, retries=1, request_timeout_ms=100, delivery_timeout_ms=300)
    fut = await p.send("t", b"a")
    await p.flush()
    with pytest.raises(UnknownTopicError, match="topic t .*delivery_timeout_ms=300.*stayed unknown.*UNKNOWN_TOPIC"):
        await fut
    assert len(broker.frames) > 2
    await p.close()


async def test_the_delivery_deadline_bounds_retries_of_a_message_never_acked() -> None:
    broker = FakeBroker([None])
    p = producer(broker, request_timeout_ms=100, delivery_timeout_ms=350, retries=1000)
    fut = await p.send("t", b"a")
    await p.flush()                                    # returns: the deadline finished the Message
    with pytest.raises(ProducerTimeoutError, match="delivery_timeout_ms=350"):
        await fut
    assert 2 <= len(broker.frames) <= 4                # retried after each 100 ms request timeout, then stopped
    await p.close()


async def test_flush_and_close_are_bounded_by_their_timeout() -> None:
    broker = FakeBroker([None])
    p = producer(broker, request_timeout_ms=60_000, delivery_timeout_ms=120_000)
    fut = await p.send("t", b"a")
    with pytest.raises(ProducerTimeoutError, match="flush"):
        await p.flush(timeout=0.1)
    assert not fut.done()                              # still under way after a timed-out flush
    await asyncio.wait_for(p.close(timeout=0.1), 5)
    with pytest.raises(ProducerClosedError, match="closed before"):
        await fut
    assert broker.closed


def test_a_delivery_deadline_shorter_than_one_request_is_refused() -> None:
    with pytest.raises(ConfigError, match="delivery_timeout_ms"):
        Producer(ProducerConfig(brokers="http://x", request_timeout_ms=1000, delivery_timeout_ms=999))


async def test_arrow_messages_stay_within_max_message_bytes_and_decode() -> None:
    """Codec "arrow": the worst case for the size estimate (empty values) still seals in time."""
    broker = FakeBroker([AckCode.OK])
    limit = 64 * 1024
    async with producer(broker, codec="arrow", max_message_bytes=limit) as p:
        sent = await p.send_many("t", [b""] * 20_000, keys=[b"k"] * 20_000)
        await p.flush()
    assert sum(d.count for d in await sent) == 20_000
    messages = [decode_message(decode_request(f).message) for f in broker.frames]
    assert all(h.codec is Codec.ARROW and h.total_size <= limit for h, _ in messages)
    assert [r.key for _, recs in messages for r in recs] == [b"k"] * 20_000


class SlowBroker(FakeBroker):
    """Acks every frame OK after `delay_s` (storage slower than the producer's request timeout)."""

    def __init__(self, url: str, delay_s: float) -> None:
        super().__init__([AckCode.OK])
        self.url, self.delay_s = url, delay_s

    async def send(self, frame: bytes | bytearray) -> None:
        self.frames.append(bytes(frame))
        ack = Ack(decode_request(self.frames[-1]).request_id, True)
        asyncio.get_running_loop().call_later(self.delay_s, self.on_ack, ack)


class RoundRobin(FakeRouter):
    def __init__(self, urls: list[str]) -> None:
        super().__init__({"t": urls})
        self.turn = 0

    async def next_broker(self, topic: str) -> str:
        self.turn += 1
        return self.topics[topic][self.turn % len(self.topics[topic])]


async def test_a_timed_out_message_is_resent_to_the_broker_holding_it_and_its_late_ack_counts() -> None:
    """The broker still holds the first attempt (it drops a resend of a Message it holds): a
    resend to another broker would store a second copy. The first attempt's late ack finishes it."""
    slow, other = SlowBroker("http://slow", 0.35), SlowBroker("http://other", 0.0)
    brokers = {b.url: b for b in (slow, other)}

    async def connect(url: str, on_ack: Callable[[Ack], None], on_lost: object) -> FakeBroker:
        return await brokers[url].connect(url, on_ack, on_lost)

    router = RoundRobin([slow.url, other.url])
    router.turn = -1                                     # the first attempt goes to the slow one
    pc = ProducerConfig(brokers=slow.url, linger_ms=1, retry_backoff_ms=1, request_timeout_ms=100, retries=10)
    async with Producer(pc, router=router, connector=connect) as p:
        fut = await p.send("t", b"a")
        delivery = await asyncio.wait_for(fut, 5)
    assert delivery.sequence == 0
    assert other.frames == [] and len(slow.frames) >= 2             # resent, always to the broker holding it
    first = decode_request(slow.frames[0])
    assert all(bytes(decode_request(f).message) == bytes(first.message) for f in slow.frames)
