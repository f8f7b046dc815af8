"""A transaction's commit publishes through the broker's publish path, on the real path (moto S3,
tansu, an in-process broker with its Kafka listener): a commit whose first publish fails (one that
landed all the same but reported a timeout, the ambiguous case) is published again on the path
before EndTxn answers, not left to the periodic scan, and a read_committed reader gets each of
its records exactly once."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence

import pytest
from confluent_kafka import Producer

from memq.broker.server import Broker
from memq.config import KafkaConfig
from memq.devcluster import DevCluster
from memq.errors import NotifyError
from memq.format import Notification
from memq.notify import NotificationPublisher
from tests.support.cluster import read_notifications, topic_config
from tests.support.kafka_clients import read_committed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PARTITIONS = 2
TIMEOUT_S = 30.0


class FirstPublishTimesOut:
    """The broker's publisher; once `armed`, its next publish is delivered but reported timed out."""

    def __init__(self, kafka: KafkaConfig) -> None:
        self.inner = NotificationPublisher(kafka, client_id="txn-publish-test")
        self.armed = False
        self.calls = 0

    async def publish_many(self, notes: Sequence[tuple[str, Notification]],
                           partitions: Sequence[int] | None = None) -> list[tuple[int, int] | NotifyError]:
        self.calls += 1
        results = await self.inner.publish_many(notes, partitions)
        if not self.armed:
            return results
        self.armed = False
        assert not any(isinstance(r, NotifyError) for r in results), results
        return [NotifyError(f"publishing to Kafka topic {t!r} failed: Local: Message timed out") for t, _ in notes]

    def health(self) -> str | None:
        return self.inner.health()

    def close(self) -> None:
        self.inner.close()


async def test_a_commit_whose_first_publish_fails_is_published_again_on_the_path_and_read_once(
        devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("txpub")
    base = devcluster.config(topics=[topic_config(topic, batch_ms=20, read_partitions=PARTITIONS)])
    # the scan is an hour away: only the publish path can finish this commit
    config = dataclasses.replace(base, broker=dataclasses.replace(base.broker, kafka_port=0, txn_scan_ms=3_600_000))
    publisher = FirstPublishTimesOut(config.kafka)
    broker = Broker(config, publisher=publisher)
    await broker.start()
    values = [f"v-{i}" for i in range(40)]
    try:
        def commit() -> None:
            p = Producer({"bootstrap.servers": broker.kafka_address, "transactional.id": f"tx-{topic}",
                          "linger.ms": 5})
            p.init_transactions(TIMEOUT_S)
            p.begin_transaction()
            for i, v in enumerate(values):
                p.produce(topic, v.encode(), partition=i % PARTITIONS)
            p.flush(TIMEOUT_S)
            assert publisher.calls == 0   # stored and pending: nothing published before the commit
            publisher.armed = True
            p.commit_transaction(TIMEOUT_S)

        await asyncio.to_thread(commit)
        m = broker.metrics.registry.get_sample_value
        assert publisher.calls == 2 and not publisher.armed       # published again on the path, before EndTxn answered
        assert m("memq_txn_commits_total") == 1 and m("memq_txn_open") == 0
        republished = m("memq_broker_republished_notifications_total") or 0
        assert republished >= 1
        notes = await asyncio.to_thread(read_notifications, config.kafka.bootstrap_servers, f"memq.dev.{topic}")
        assert len(notes) == 2 * republished and len({(n.key, n.offset) for n in notes}) == republished  # each twice
        assert sorted(await asyncio.to_thread(read_committed, broker.kafka_address, topic, partitions=PARTITIONS)) == sorted(values)
    finally:
        await broker.stop()
