"""Server-side fault regressions found by the outside fault test, each on the real path
(moto S3, tansu, ZooKeeper, in-process brokers): a broker must ride out a Kafka stall,
never leave a notification pointing at a deleted object, drop resent Messages it already
holds, and keep retrying S3 while its acks can still be on time."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import aiohttp
import pytest

from memq.broker.server import Broker
from memq.client.producer import Producer
from memq.config import KafkaConfig, MemqConfig
from memq.devcluster import DevCluster
from memq.errors import MemqError, NotifyError, ProduceError
from memq.format import Codec, LogMessage, Notification, encode_message
from memq.format.wire import AckLevel, decode_acks, encode_request
from memq.notify import NotificationPublisher
from memq.storage import ObjectLocation, make_storage
from tests.support.faultproxy import FaultPlan, FaultProxy
from tests.support.cluster import (producer_config, read_notifications, read_stored, running_broker,
                                     topic_config)

pytestmark = pytest.mark.integration

KAFKA_TIMEOUT_MS = 3_000


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[DevCluster]:
    """A tansu of this test's own, so stopping it cannot disturb other tests."""
    with DevCluster(tmp_path / "kafka", s3=False, zookeeper=False) as dc:
        yield dc


async def health(url: str) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
        async with s.get(url + "/healthz") as r:
            return r.status, await r.json()


async def acked_within(url: str, topic: str, timeout_s: float) -> float:
    """Seconds until an ack=all write succeeds, retrying fresh writes; fails after `timeout_s`."""
    t0 = time.monotonic()
    errors: list[str] = []
    async with Producer(producer_config(url, request_timeout_ms=5_000, retries=0)) as p:
        while time.monotonic() - t0 < timeout_s:
            try:
                await (await p.send(topic, b"after-%d" % len(errors)))
                return time.monotonic() - t0
            except MemqError as e:
                errors.append(str(e))
                await asyncio.sleep(0.2)
    raise AssertionError(f"no ack=all write succeeded within {timeout_s}s; last errors {errors[-3:]}")


async def test_broker_recovers_by_itself_after_a_kafka_stall_longer_than_its_request_timeout(
        devcluster: DevCluster, own_kafka: DevCluster, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("kstall")
    base = devcluster.config(topics=[topic_config(topic, batch_ms=20)])
    config: MemqConfig = dataclasses.replace(base, kafka=KafkaConfig(
        bootstrap_servers=own_kafka.kafka_bootstrap or "", request_timeout_ms=KAFKA_TIMEOUT_MS))
    tansu = own_kafka.pids["kafka"]
    async with running_broker(config) as broker:
        await acked_within(broker.url, topic, 10)
        assert (await health(broker.url))[0] == 200
        async with Producer(producer_config(broker.url, request_timeout_ms=4_000, retries=0)) as p:
            os.kill(tansu, signal.SIGSTOP)
            try:
                # publishes in flight during the stall time out: librdkafka bumps its epoch
                stalled = [await p.send(topic, b"stalled-%d" % i) for i in range(5)]
                await asyncio.sleep(2 * KAFKA_TIMEOUT_MS / 1000)
                status, body = await health(broker.url)
                assert status == 503 and body["status"] == "unhealthy", body
                assert "Kafka" in str(body["reason"]), body
            finally:
                os.kill(tansu, signal.SIGCONT)
                resumed = time.monotonic()
            await asyncio.gather(*stalled, return_exceptions=True)
        # fenced by the bump, the old producer fails every publish for good; the broker
        # replaces it by itself, without a restart
        await acked_within(broker.url, topic, 30)
        print(f"first ack=all write {time.monotonic() - resumed:.1f} s after Kafka resumed")
        status, body = await health(broker.url)
        assert status == 200, body
    # no Message stored twice, no pointer to a missing object (a notification published again
    # after its delivery was unknown may name an object twice: readers drop its Messages by id)
    notes = read_notifications(config.kafka.bootstrap_servers, f"memq.dev.{topic}")
    keys = {n.key for n in notes}
    assert len(keys) >= 2
    _stored, dups, objects = await read_stored(config, topic)
    assert keys <= set(objects) and dups == {}


class DeliveredButTimedOut:
    """The real publisher, whose every publish reaches Kafka and is then reported as timed out:
    what librdkafka does when a notification queued before a Kafka stall lands after it."""

    def __init__(self, kafka: KafkaConfig) -> None:
        self.inner = NotificationPublisher(kafka, client_id="delivered-but-timed-out")
        self.published = 0

    async def publish_many(self, notes: Sequence[tuple[str, Notification]],
                           partitions: Sequence[int] | None = None) -> list[tuple[int, int] | NotifyError]:
        for result in await self.inner.publish_many(notes, partitions):
            assert not isinstance(result, NotifyError), result
        self.published += len(notes)
        return [NotifyError(f"publishing to Kafka topic {t!r} failed: Local: Message timed out") for t, _ in notes]

    def close(self) -> None:
        self.inner.close()


async def test_a_publish_that_times_out_but_is_delivered_leaves_no_dangling_pointer(
        devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("ambig")
    base = devcluster.config(topics=[topic_config(topic, batch_ms=20)])
    config = dataclasses.replace(base, broker=dataclasses.replace(base.broker, notify_retry_ms=0))   # fail at once
    publisher = DeliveredButTimedOut(config.kafka)
    broker = Broker(config, publisher=publisher)
    await broker.start()
    try:
        async with Producer(producer_config(broker.url, retries=0)) as p:
            for i in range(3):
                with pytest.raises(ProduceError, match="NOTIFY"):
                    await (await p.send(topic, b"ambiguous-%d" % i))
        unannounced = broker.metrics.registry.get_sample_value("memq_broker_unannounced_batches_total",
                                                               {"topic": topic})
    finally:
        await broker.stop()
    assert publisher.published == 3
    notes = read_notifications(config.kafka.bootstrap_servers, f"memq.dev.{topic}")
    assert len(notes) == 3
    storage = make_storage(config)
    try:
        for n in notes:        # every pointer on Kafka names an object that exists
            assert await storage.get(ObjectLocation(n.bucket, n.key))
    finally:
        await storage.close()
    assert unannounced == 3    # kept, counted: orphans for the collector if never announced


async def test_a_message_resent_while_storage_is_slow_is_stored_once(
        devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("resend")
    base = devcluster.config(topics=[topic_config(topic, batch_ms=20)])
    frame = encode_message([LogMessage(b"only-once-%d" % i) for i in range(10)], producer_id=77, epoch=3,
                           sequence=5, codec=Codec.NONE)
    slow_puts = FaultPlan(mode="stall", fraction=1.0, methods=frozenset({"PUT"}), stall_s=1.5)
    with FaultProxy(devcluster.s3_endpoint or "", slow_puts) as proxy:
        config = dataclasses.replace(base, s3=dataclasses.replace(base.s3, endpoint_url=proxy.url))
        async with running_broker(config) as broker, aiohttp.ClientSession() as s:
            async with s.ws_connect(broker.url + "/v1/produce") as first, \
                    s.ws_connect(broker.url + "/v1/produce") as second:
                await first.send_bytes(encode_request(1, AckLevel.ALL, topic, frame))
                await asyncio.sleep(0.5)          # the batch is uploading: the producer gives up, resends
                await second.send_bytes(encode_request(2, AckLevel.ALL, topic, frame))
                acks = [*decode_acks(await first.receive_bytes(timeout=30)),
                        *decode_acks(await second.receive_bytes(timeout=30))]
            dropped = broker.metrics.registry.get_sample_value("memq_broker_duplicate_messages_total",
                                                               {"topic": topic})
    original, resent = sorted(acks, key=lambda a: a.id)
    assert original.ok and resent == dataclasses.replace(original, id=2)   # the original's outcome
    stored, dups, keys = await read_stored(base, topic)
    assert (len(stored), dups, len(keys)) == (10, {}, 1)
    assert [n.key for n in read_notifications(base.kafka.bootstrap_servers, f"memq.dev.{topic}")] == keys
    assert dropped == 1
