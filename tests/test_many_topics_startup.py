"""A broker restarted with a thousand topics: ready means ready, and a producer that starts the
moment /healthz answers 200 gets no error."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from memq.client.producer import Producer
from memq.config import ProducerConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster
from memq.governor.topics import hosted_topics
from memq.notify import KafkaTopic, TopicAdmin

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPICS = 1000


async def _send_to_each(url: str, topics: list[str]) -> int:
    async with Producer(ProducerConfig(brokers=url, ack="1", linger_ms=5)) as producer:
        futures = [await producer.send(t, b"v") for t in topics]
        return len(await asyncio.gather(*futures))


@pytest.mark.slow   # a soak (faults or scale played out for 20-60 s): `python -m bench soak`
def test_a_broker_restarted_with_1000_topics_is_ready_only_when_it_hosts_them_all(
        devcluster: DevCluster, tmp_path: Path, unique_name: Callable[[str], str]) -> None:
    with GovernedCluster(tmp_path, brokers=1, servers=devcluster, cluster=unique_name("c")) as gc:
        names = [f"t{i:04d}" for i in range(TOPICS)]
        assert TopicAdmin(gc.base.kafka).create_topics(
            [KafkaTopic(TopicConfig(n).notification_topic_for(gc.cluster), 1) for n in names]) == {}
        for n in names:
            gc.registry.create_topic(TopicConfig(n, read_partitions=1))
        url = gc.broker("b1").url
        deadline = time.monotonic() + 60
        while len(hosted_topics(url)) < TOPICS:
            assert time.monotonic() < deadline, f"{len(hosted_topics(url))} of {TOPICS} topics hosted after 60 s"
            time.sleep(0.5)

        gc.restart_broker("b1")   # returns once /healthz answered 200
        assert set(hosted_topics(url)) == set(names)   # 200 meant every assigned topic is hosted
        assert asyncio.run(_send_to_each(url, names[::-1][:100])) == 100   # the last hosted first
