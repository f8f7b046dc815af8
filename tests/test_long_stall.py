"""Stalls longer than memq's timeouts, on the real path (moto S3, tansu, in-process brokers).

A Kafka frozen past the brokers' delivery-report timeout while a producer streams to two
brokers: every acked record is delivered once by the default Consumer. An S3 whose PUTs take
longer than the producers' request timeout (overload): each Message is stored about once, and
every producer's close() returns within its deadline with every send resolved.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memq.config import KafkaConfig, MemqConfig
from memq.devcluster import DevCluster
from tests.support.faultproxy import FaultPlan, FaultProxy
from memq.client.producer import Producer
from tests.support.cluster import producer_config, read_stored, running_broker, topic_config
from memq.notify import NotificationPublisher
from memq.notify import publisher as publisher_module
from tests.support.spark import connection
from tests.support.waiting import wait_for
from tests.support.dedup import check_no_duplicates_delivered, stream

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

KAFKA_TIMEOUT_MS = 2_000    # the brokers' delivery-report timeout (librdkafka message.timeout.ms)


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[DevCluster]:
    """A tansu of this test's own, so freezing it cannot disturb other tests."""
    with DevCluster(tmp_path / "kafka", s3=False, zookeeper=False) as dc:
        yield dc


@pytest.mark.slow   # a soak: 60-75 s of a frozen Kafka; `python -m bench soak` runs it
async def test_a_kafka_frozen_past_the_notify_timeout_delivers_no_duplicates(
        devcluster: DevCluster, own_kafka: DevCluster, unique_name: Callable[[str], str], spark: Any) -> None:
    topic = unique_name("freeze")
    base = devcluster.config(topics=[topic_config(topic, batch_ms=50)])
    config = dataclasses.replace(base, kafka=KafkaConfig(bootstrap_servers=own_kafka.kafka_bootstrap or "",
                                                         request_timeout_ms=KAFKA_TIMEOUT_MS))
    other = dataclasses.replace(config, broker=dataclasses.replace(config.broker, broker_id="b2"))
    tansu = own_kafka.pids["kafka"]
    async with running_broker(config) as a, running_broker(other) as b:
        acked = await stream(config, f"{a.url},{b.url}", topic, lambda: os.kill(tansu, signal.SIGSTOP),
                             lambda: os.kill(tansu, signal.SIGCONT), run_s=20, fault_at_s=3, fault_s=10)
    await check_no_duplicates_delivered(dataclasses.replace(config, kafka=dataclasses.replace(
        config.kafka, request_timeout_ms=10_000)), topic, acked)
    stored, dups, _ = await read_stored(config, topic)
    assert (len(stored) + sum(dups.values())) / len(acked) <= 1.05   # the resends were not stored again
    spark_values = await asyncio.to_thread(read_with_spark, spark, config, topic)
    assert acked <= set(spark_values) and len(spark_values) == len(set(spark_values))   # Spark's defaults: once


def read_with_spark(spark: Any, config: MemqConfig, topic: str) -> list[bytes]:
    """Every value of `topic` as the Spark source reads it with its defaults (de-duplicated)."""
    df = spark.read.format("memq").options(**connection(config)).option("topic", topic).load()
    return [bytes(r.value) for r in df.select("value").collect()]


async def test_an_s3_slower_than_the_request_timeout_stores_each_message_about_once(
        devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("overload")
    base = devcluster.config(topics=[topic_config(topic, batch_ms=50, ring_slots=2)])
    slow_puts = FaultPlan(mode="stall", fraction=1.0, methods=frozenset({"PUT"}), stall_s=1.5)
    close_s = 20.0
    with FaultProxy(devcluster.s3_endpoint or "", slow_puts) as proxy:
        config = dataclasses.replace(base, s3=dataclasses.replace(base.s3, endpoint_url=proxy.url))
        other = dataclasses.replace(config, broker=dataclasses.replace(config.broker, broker_id="b2"))
        async with running_broker(config) as a, running_broker(other) as b:
            pc = producer_config(f"{a.url},{b.url}", request_timeout_ms=1_000, delivery_timeout_ms=15_000,
                                 max_block_ms=15_000, max_in_flight_bytes=8 * 1024 * 1024)

            async def produce(k: int) -> tuple[list[asyncio.Future[object]], float]:
                p = Producer(pc)
                futures: list[asyncio.Future[object]] = []
                t0 = time.monotonic()
                while time.monotonic() - t0 < 6:
                    futures.append(await p.send(topic, b"%d-%06d-" % (k, len(futures)) + b"x" * 65_536))
                t1 = time.monotonic()
                await p.close(timeout=close_s)
                return futures, time.monotonic() - t1

            runs = await asyncio.gather(*(produce(k) for k in range(3)))
    futures = [f for fs, _ in runs for f in fs]
    assert all(f.done() for f in futures)                               # every send resolved
    assert all(closed_s < close_s + 5 for _, closed_s in runs), [c for _, c in runs]
    acked = sum(1 for f in futures if not f.cancelled() and f.exception() is None)
    stored, dups, _ = await read_stored(base, topic)
    copies = sum(dups.values())
    print(f"sent {len(futures)}, acked {acked}, stored {len(stored)} + {copies} copies: "
          f"write amplification {(len(stored) + copies) / max(acked, 1):.3f}")
    assert acked > 20
    assert (len(stored) + copies) / acked <= 1.05


def test_an_idle_publisher_reports_a_kafka_that_stopped_answering(own_kafka: DevCluster,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle broker is no safe harbour while Kafka is down: its publisher, with nothing to
    publish, asks Kafka for metadata now and then and reports the silence (the governor then
    sees every broker unhealthy and moves no topic), and recovers when Kafka answers again."""
    monkeypatch.setattr(publisher_module, "IDLE_PROBE_S", 0.5)
    monkeypatch.setattr(publisher_module, "IDLE_PROBE_TIMEOUT_S", 2.0)
    tansu = own_kafka.pids["kafka"]
    publisher = NotificationPublisher(KafkaConfig(bootstrap_servers=own_kafka.kafka_bootstrap or ""),
                                      client_id="idle-probe-test")
    try:
        assert publisher.health() is None
        os.kill(tansu, signal.SIGSTOP)
        try:
            why = wait_for(publisher.health, 15, "the idle publisher to notice Kafka's silence")
            assert "did not answer a metadata request" in why
        finally:
            os.kill(tansu, signal.SIGCONT)
        wait_for(lambda: publisher.health() is None, 20, "health back once Kafka answers")
    finally:
        publisher.close()
