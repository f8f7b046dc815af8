"""Produce quotas on a running broker (in this process, on the dev cluster's moto S3 and tansu),
through the real Producer and a confluent-kafka producer on the Kafka listener: a producer over
its quota is delayed to its rate and told so in its acks, never failed; a producer of another
topic or principal is not delayed at all."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer as KafkaProducer

from memq.broker.server import Broker
from memq.client.producer import Producer
from memq.config import BrokerConfig, MemqConfig, ProducerConfig, QuotaConfig, SecurityConfig
from memq.devcluster import DevCluster
from tests.support.security import ALICE, ALICE_ENTRY, BOB, BOB_ENTRY
from tests.support.cluster import read_stored, running_broker, topic_config

pytestmark = pytest.mark.integration

RATE = 200_000         # bytes/s: the quota under test
BURST_S = 0.2
MESSAGE = 32 * 1024    # producer.max_message_bytes: the broker pauses after each Message
TOTAL = 700_000        # bytes the throttled producer sends: about 3.5 s at RATE


def client(url: str, **kw: Any) -> ProducerConfig:
    return ProducerConfig(brokers=url, **{"codec": "none", "linger_ms": 5, "max_message_bytes": MESSAGE,
                                          "request_timeout_ms": 20_000, **kw})


async def produce(config: ProducerConfig, topic: str, total: int, tag: bytes) -> tuple[Producer, float]:
    """Send `total` bytes of 1000-byte values and wait for every ack; the producer and the seconds."""
    values = [tag + b"-%06d-" % i + b"x" * 990 for i in range(total // 1000)]
    t0 = time.monotonic()
    async with Producer(config) as p:
        futures = [await p.send_many(topic, values[i:i + 50]) for i in range(0, len(values), 50)]
        await p.flush(60)
        for f in futures:
            await f          # each resolves: a quota delays, it never fails a request
    return p, time.monotonic() - t0


def sample(broker: Broker, name: str, **labels: str) -> float:
    return broker.metrics.registry.get_sample_value(name, labels) or 0.0


async def stored_count(config: MemqConfig, topic: str) -> int:
    stored, duplicates, _ = await read_stored(config, topic)
    assert not duplicates
    return len(stored)


async def test_a_topic_quota_holds_its_producer_to_the_rate_and_leaves_another_topic_alone(
        devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    noisy, quiet = unique_name("noisy"), unique_name("quiet")
    config = dataclasses.replace(devcluster.config(topics=[topic_config(noisy), topic_config(quiet)]),
                                 quota=QuotaConfig(topics=(f"{noisy}={RATE}",), burst_s=BURST_S))
    async with running_broker(config) as broker:
        url = broker.url
        (p_noisy, noisy_s), (p_quiet, _) = await asyncio.gather(produce(client(url), noisy, TOTAL, b"n"),
                                                                produce(client(url), quiet, TOTAL, b"q"))
        accepted = sample(broker, "memq_broker_message_bytes_total", topic=noisy)
        throttled_s = sample(broker, "memq_broker_throttle_seconds_total", principal="anonymous", topic=noisy)
        quiet_throttled_s = sample(broker, "memq_broker_throttle_seconds_total", principal="anonymous", topic=quiet)
    # Tolerance: at most the model's bound (rate x time + one burst + one Message), which holds
    # however slow the machine is; at least half the rate (a loaded machine adds time of its own).
    assert accepted <= RATE * noisy_s + RATE * BURST_S + MESSAGE
    assert accepted >= 0.5 * RATE * noisy_s
    # the pauses paid for the bytes over the burst, and the producer was told about them
    debt_s = (accepted - RATE * BURST_S) / RATE
    assert 0.5 * debt_s <= throttled_s <= debt_s
    m = p_noisy.metrics
    assert m.throttled_acks > 0 and m.throttle_ms_max <= config.quota.max_throttle_ms
    assert m.throttle_ms_total == pytest.approx(throttled_s * 1000, rel=0.05, abs=m.throttled_acks)
    # the other topic: never delayed
    assert p_quiet.metrics.throttled_acks == 0 and quiet_throttled_s == 0
    assert await stored_count(config, noisy) == TOTAL // 1000
    assert await stored_count(config, quiet) == TOTAL // 1000


async def test_a_principal_quota_delays_that_principal_only_on_a_shared_topic(
        devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("shared")
    config = dataclasses.replace(
        devcluster.config(topics=[topic_config(topic)]),
        security=SecurityConfig(enabled=True, tokens=(str(ALICE_ENTRY), str(BOB_ENTRY)),
                                acls=(f"allow * produce literal:{topic}", f"allow * describe literal:{topic}")),
        quota=QuotaConfig(principal_byte_rate=RATE, principals=("bob=0",), burst_s=BURST_S))
    async with running_broker(config) as broker:
        url = broker.url
        (p_alice, _), (p_bob, _) = await asyncio.gather(produce(client(url, token=ALICE), topic, TOTAL // 2, b"a"),
                                                        produce(client(url, token=BOB), topic, TOTAL // 2, b"b"))
        alice_s = sample(broker, "memq_broker_throttle_seconds_total", principal="alice", topic=topic)
        bob_s = sample(broker, "memq_broker_throttle_seconds_total", principal="bob", topic=topic)
    assert alice_s > 0 and p_alice.metrics.throttled_acks > 0
    assert bob_s == 0 and p_bob.metrics.throttled_acks == 0      # exempt (bob=0), on the same topic
    assert await stored_count(config, topic) == TOTAL // 1000


def kafka_send(address: str, topic: str, total: int) -> tuple[float, int]:
    """A confluent-kafka producer sends `total` bytes of 1000-byte values (acks=all); the seconds it
    took and the largest throttle time librdkafka reported in its statistics."""
    throttle_max = 0

    def stats(raw: str) -> None:
        nonlocal throttle_max
        for b in json.loads(raw).get("brokers", {}).values():
            throttle_max = max(throttle_max, b.get("throttle", {}).get("max", 0))

    p = KafkaProducer({"bootstrap.servers": address, "linger.ms": 5, "batch.size": MESSAGE, "acks": "all",
                       "statistics.interval.ms": 200, "stats_cb": stats, "message.timeout.ms": 30_000})
    t0 = time.monotonic()
    for i in range(total // 1000):
        p.produce(topic, b"k-%06d-" % i + b"x" * 991)
        p.poll(0)
    assert p.flush(60) == 0
    elapsed = time.monotonic() - t0
    p.poll(0.5)   # one more statistics report
    return elapsed, throttle_max


async def test_a_topic_quota_holds_a_kafka_producer_on_the_kafka_listener(
        devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("kafka-noisy")
    config = dataclasses.replace(devcluster.config(topics=[topic_config(topic)]), broker=BrokerConfig(kafka_port=0),
                                 quota=QuotaConfig(topics=(f"{topic}={RATE}",), burst_s=BURST_S))
    async with running_broker(config) as broker:
        elapsed, client_throttle_ms = await asyncio.to_thread(kafka_send, broker.kafka_address, topic, TOTAL)
        accepted = sample(broker, "memq_broker_message_bytes_total", topic=topic)
        throttled_s = sample(broker, "memq_broker_throttle_seconds_total", principal="anonymous", topic=topic)
    # the bound of the first test; 1% more for memq's Message header around each Kafka RecordBatch
    assert accepted <= 1.01 * (RATE * elapsed + RATE * BURST_S + MESSAGE)
    assert accepted >= 0.5 * RATE * elapsed
    assert throttled_s > 0 and client_throttle_ms > 0   # the ProduceResponse said so (throttle_time_ms)
    assert await stored_count(config, topic) == TOTAL // 1000
