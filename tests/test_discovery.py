"""One cluster view: a topic created through the governor with its own notification topic is
found by a Consumer and by the Spark source that are given only a broker address.

Real dev cluster (moto S3, tansu, ZooKeeper), a real Broker with its governor agent in this
process, and PySpark local. S3 credentials are the one thing given besides the broker:
metadata never carries secrets.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from memq.broker.server import Broker
from memq.client.consumer import Consumer
from memq.client.producer import Producer
from memq.config import (BrokerConfig, ClusterConfig, ConsumerConfig, GovernorConfig, MemqConfig, ProducerConfig,
                         S3Config, TopicConfig, ZooKeeperConfig)
from memq.governor.agent import BrokerAgent
from memq.governor.registry import Registry
from memq.governor.topics import TopicManager
from memq.notify import TopicAdmin

pyspark = pytest.importorskip("pyspark")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

N = 300


@pytest.fixture
def governed(devcluster) -> Iterator[tuple[MemqConfig, str, str, str]]:
    """A governed broker in a loop thread; yields (its config, its URL, a topic, its notification topic),
    the topic created through the governor's TopicManager with a non-default notification topic."""
    cluster = f"d{uuid.uuid4().hex[:8]}"
    config = dataclasses.replace(
        devcluster.config(cluster=cluster),
        zookeeper=ZooKeeperConfig(enabled=True, hosts=devcluster.zk_hosts, root=f"/disc-{cluster}",
                                  session_timeout_s=4.0, connect_timeout_s=5.0),
        governor=GovernorConfig(interval_s=0.5, reconcile_interval_s=0.3),
        broker=BrokerConfig(broker_id="b1"))
    topic, kafka_topic = f"t-{cluster}", f"custom.{cluster}.events"
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    broker = Broker(config)

    async def start() -> BrokerAgent:
        await broker.start()
        agent = BrokerAgent(broker, config)   # what start_agent does, minus its signal handler
        await agent.start()
        broker.cluster_view = agent.metadata
        return agent

    agent = asyncio.run_coroutine_threadsafe(start(), loop).result(60)
    registry = Registry(config.zookeeper, cluster).start()
    try:
        TopicManager(registry, TopicAdmin(config.kafka), cluster).create(
            TopicConfig(name=topic, read_partitions=2, notification_topic=kafka_topic, batch_ms=50))
        deadline = time.monotonic() + 30
        while broker.processor(topic) is None:
            assert time.monotonic() < deadline, "the governor never placed the topic on the broker"
            time.sleep(0.2)
        yield config, broker.url, topic, kafka_topic
    finally:
        registry.close()

        async def stop() -> None:
            await agent.stop()
            await broker.stop()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def only_a_broker(url: str, s3: S3Config) -> MemqConfig:
    """A client config that names nothing of the cluster but one broker (and S3 credentials)."""
    return MemqConfig(producer=ProducerConfig(brokers=url),
                      s3=S3Config(access_key_id=s3.access_key_id, secret_access_key=s3.secret_access_key),
                      consumer=ConsumerConfig(group_id=f"g-{uuid.uuid4().hex[:6]}"))


def test_consumer_and_spark_find_a_governed_topic_through_one_broker(governed, spark: Any) -> None:
    config, url, topic, kafka_topic = governed
    values = [b"v-%04d" % i for i in range(N)]

    async def produce() -> None:
        async with Producer(ProducerConfig(brokers=url, ack="all")) as p:
            await (await p.send_many(topic, values))

    asyncio.run(produce())
    client = only_a_broker(url, config.s3)
    assert client.cluster == ClusterConfig() and not client.topics   # nothing about the cluster

    with Consumer(client, topic) as c:
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < N and time.monotonic() < deadline:
            got.extend(bytes(r.value) for r in c.poll(1.0))
    assert sorted(got) == values

    def read(mode: str) -> list[bytes]:
        return [bytes(r.value) for r in (
            spark.read.format("memq").option("memq.broker", url).option("topic", topic).option("mode", mode)
            .option("s3.accessKeyId", config.s3.access_key_id or "")
            .option("s3.secretAccessKey", config.s3.secret_access_key or "").load().select("value").collect())]

    assert sorted(read("notifications")) == values
    # the topic shares the default storage group (the broker's metadata says so): its objects
    # hold other topics' parts too, which a listing cannot tell apart
    with pytest.raises(Exception, match="mode=s3list: topic .* is stored in storage group 'shared'"):
        read("s3list")
