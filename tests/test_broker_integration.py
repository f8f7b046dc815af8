"""Producer -> broker -> S3 -> Kafka on the real dev cluster (moto S3 server, tansu).

The broker runs in this process; what was stored is checked by reading the S3 objects and
the notification topic directly (storage listing + format.decode_batch, confluent-kafka),
not through memq's consumer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from tests.support.cluster import producer_config, read_notifications, read_stored, running_broker, topic_config

from memq.client.producer import Delivery, Producer
from memq.config import TopicConfig
from memq.devcluster import DevCluster
from memq.errors import MessageTooLargeError, UnknownTopicError
from memq.format import LogMessage, decode_batch
from memq.storage import make_storage

pytestmark = pytest.mark.integration



async def test_several_producers_100k_ack_all_exactly_once(devcluster: DevCluster,
                                                           unique_name: Callable[[str], str]) -> None:
    topic = unique_name("ack-all")
    config = devcluster.config(topics=[topic_config(topic)])
    sent: dict[tuple[int, int], tuple[bytes, bytes, tuple]] = {}   # (producer, n) -> record

    async def produce(k: int, url: str, total: int) -> list[Delivery]:
        futures: list[asyncio.Future[Any]] = []
        hdrs = (("src", b"p%d" % k),)
        async with Producer(producer_config(url)) as p:
            n = 0
            while n < total:   # bulk calls of 1000, and a single send after each
                values = [b"p%d-v%d" % (k, n + i) for i in range(1000)] + [b"p%d-v%d" % (k, n + 1000)]
                keys = [b"key-%d" % ((n + i) % 97) for i in range(1000)] + [b"solo"]
                for i, v in enumerate(values):
                    sent[(p.producer_id, n + i)] = (keys[i], v, hdrs)
                futures.append(await p.send_many(topic, values[:-1], keys=keys[:-1], headers=hdrs))
                futures.append(await p.send(topic, values[-1], key=b"solo", headers=hdrs))
                n += 1001
            done = await asyncio.gather(*futures)
        return [d for r in done for d in (r if isinstance(r, list) else [r])]

    async with running_broker(config) as broker:
        results = await asyncio.wait_for(asyncio.gather(*(produce(k, broker.url, 33_367) for k in range(3))), 90)
    deliveries = [d for r in results for d in r]
    acked = sum(d.count for d in deliveries)
    assert acked == len(sent) >= 100_000
    assert all(d.key and d.partition >= 0 and d.offset >= 0 for d in deliveries)

    stored, dups, keys = await read_stored(config, topic)
    assert dups == {}
    found = {(pid, v): (k, v, h) for (pid, _e, _s, _p), (k, v, h) in stored.items()}
    by_value = {(pid, v): rec for (pid, _n), rec in sent.items() for v in [rec[1]]}
    assert set(found) == set(by_value)                        # every acked record, exactly once
    assert all(found[x] == by_value[x] for x in by_value)     # with its key and headers
    for d in deliveries[:50]:                                 # a Delivery names where the Message is
        assert any(d.key == k for k in keys)

    notes = read_notifications(devcluster.kafka_bootstrap or "", f"memq.dev.{topic}")
    assert sorted({n.key for n in notes}) == sorted(keys)     # every object announced, a notification per part
    assert len({(n.key, n.offset) for n in notes}) == len(notes)
    assert sum(n.logmessage_count for n in notes) == len(sent)


async def test_ack_one_before_storage_ack_zero_fire_and_forget(devcluster: DevCluster,
                                                               unique_name: Callable[[str], str]) -> None:
    topic = unique_name("acks")
    config = devcluster.config(topics=[topic_config(topic, batch_ms=1500)])
    async with running_broker(config) as broker:
        async with Producer(producer_config(broker.url, ack="1")) as p1:
            t0 = time.monotonic()
            d1 = await (await p1.send(topic, b"one", key=b"k"))
            assert time.monotonic() - t0 < 1.0     # the batch is still filling (batch_ms=1500)
            assert d1.key == "" and d1.sequence == 0
        async with Producer(producer_config(broker.url, ack="0")) as p0:
            fut = await p0.send_many(topic, [b"zero-%d" % i for i in range(100)])
            await asyncio.wait_for(p0.flush(), 2.0)
            assert sum(d.count for d in await fut) == 100
        async with Producer(producer_config(broker.url, ack="all")) as pa:
            t0 = time.monotonic()
            da = await (await pa.send(topic, b"all"))
            assert da.key and time.monotonic() - t0 >= 1.0   # only after the batch was stored
    stored, dups, _ = await read_stored(config, topic)   # graceful stop stored everything
    values = sorted(v for _, v, _ in stored.values())
    assert values == sorted([b"one", b"all"] + [b"zero-%d" % i for i in range(100)]) and dups == {}


async def test_unknown_topic_and_too_large_are_clear(devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("errs")
    config = devcluster.config(topics=[topic_config(topic)])
    async with running_broker(config) as broker:
        async with Producer(producer_config(broker.url, max_message_bytes=64 * 1024, max_block_ms=1000)) as p:
            with pytest.raises(UnknownTopicError, match="no-such-topic"):
                await p.send("no-such-topic", b"x")
            with pytest.raises(MessageTooLargeError, match="max_message_bytes"):
                await p.send(topic, b"x" * 100_000)
            assert (await (await p.send(topic, b"fine"))).key


async def test_metadata_health_and_stage_metrics(devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    import aiohttp
    topic = unique_name("meta")
    config = devcluster.config(topics=[topic_config(topic, read_partitions=2)])
    async with running_broker(config) as broker:
        async with Producer(producer_config(broker.url)) as p:
            await (await p.send(topic, b"m"))
        async with aiohttp.ClientSession() as s:
            md = await (await s.get(broker.url + "/v1/metadata")).json()
            assert md["topics"][topic] == {"brokers": [broker.url], "notification_topic": f"memq.dev.{topic}",
                                           "read_partitions": 2, "retention_ms": 7 * 86_400_000,
                                           "storage_group": ""}
            assert md["kafka"]["bootstrap_servers"] == devcluster.kafka_bootstrap
            assert (await s.get(broker.url + "/healthz")).status == 200
            metrics = await (await s.get(broker.url + "/metrics")).text()
    for stage in ("queue_wait", "batch_fill", "upload", "notify", "ack"):
        assert f'memq_broker_stage_seconds_count{{stage="{stage}",topic="{topic}"}} 1.0' in metrics
    assert "memq_storage_latency_seconds" in metrics


async def test_topics_of_a_shared_group_report_their_stages_per_group(devcluster: DevCluster,
                                                                       unique_name: Callable[[str], str]) -> None:
    # per-topic stage histograms are ~90 lines of /metrics each: a thousand small topics made ~10 MB
    import aiohttp
    topics = [unique_name("g1"), unique_name("g2")]
    config = devcluster.config(topics=[topic_config(t, storage_group="grp") for t in topics])
    async with running_broker(config) as broker:
        async with Producer(producer_config(broker.url, ack="all")) as p:   # acked once stored and notified
            await asyncio.gather(*[await p.send(t, b"m") for t in topics])
        async with aiohttp.ClientSession() as s:
            metrics = await (await s.get(broker.url + "/metrics")).text()
    for stage in ("queue_wait", "batch_fill", "upload", "notify"):   # per batch: one of each topic
        assert f'memq_broker_group_stage_seconds_count{{group="grp",stage="{stage}"}} 2.0' in metrics
    # per ack frame: the two acks went out together or one after the other
    assert re.search(r'memq_broker_group_stage_seconds_count\{group="grp",stage="ack"\} [12]\.0', metrics)
    assert not [line for line in metrics.splitlines()
                if line.startswith("memq_broker_stage_seconds") and any(t in line for t in topics)]


async def test_flush_sends_now_instead_of_waiting_batch_ms(devcluster: DevCluster,
                                                          unique_name: Callable[[str], str]) -> None:
    topic = unique_name("flush")
    config = devcluster.config(topics=[topic_config(topic, batch_ms=5000)])
    async with running_broker(config) as broker:
        # small Messages, so several are in flight and only the last asks for the seal
        async with Producer(producer_config(broker.url, max_message_bytes=16 * 1024)) as p:
            fut = await p.send_many(topic, [b"v-%d" % i for i in range(2000)], timestamp=7000)
            # mixed timestamps (0 = now): each Message's header range must match its records
            batch = await p.send_batch(topic, [LogMessage(b"b-%d" % i, timestamp_ms=(i * 7919) % 5000)
                                               for i in range(1500)])
            t0 = time.monotonic()
            await asyncio.wait_for(p.flush(), 4.0)
            took = time.monotonic() - t0
            deliveries = await fut + await batch
        sealed = broker.metrics.registry.get_sample_value("memq_broker_flush_seals_total", {"topic": topic})
    assert took < 2.5, f"flush took {took:.2f}s: the broker waited batch_ms=5s"
    assert sum(d.count for d in deliveries) == 3500 and all(d.key for d in deliveries)
    assert len({d.sequence for d in deliveries}) > 2 and sealed == 1
    stored, dups, keys = await read_stored(config, topic)
    assert len(stored) == 3500 and dups == {} and len(keys) == 1
    storage = make_storage(config)
    try:
        [info] = await storage.list_topic(topic, 0, 2**62)
        for mh, records in decode_batch(await storage.get(info.location))[1]:
            stamps = [r.timestamp_ms for r in records]
            assert (mh.min_timestamp_ms, mh.max_timestamp_ms) == (min(stamps), max(stamps))
    finally:
        await storage.close()


async def test_a_broker_publishes_through_several_producers_each_topic_in_order(
        devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    """`broker.notify_producers` librdkafka producers publish a shared group's parts; each
    topic's notifications keep the order its batches were stored in."""
    topics = [unique_name(f"np{i}") for i in range(9)]
    config = devcluster.config(topics=[TopicConfig(t, batch_ms=30, read_partitions=1) for t in topics])
    config = dataclasses.replace(config, broker=dataclasses.replace(config.broker, notify_producers=3))
    async with running_broker(config) as broker:
        pollers = {t.name for t in threading.enumerate() if t.name.startswith(f"memq-notify-memq-broker-{broker.broker_id}-")}
        assert len(pollers) == 3
        async with Producer(producer_config(broker.url, ack="all")) as p:
            for r in range(4):            # four objects, each with a part of every topic
                futures = [await p.send(t, b"r%d" % r) for t in topics]
                await p.flush()
                assert all(d.count == 1 for d in await asyncio.gather(*futures))
    for t in topics:
        notes = read_notifications(devcluster.kafka_bootstrap or "", f"memq.dev.{t}")
        assert len(notes) == 4 and len({n.key for n in notes}) == 4
        assert [n.created_ms for n in notes] == sorted(n.created_ms for n in notes), t


async def test_a_producer_of_many_topics_sends_what_it_seals_together_as_one_bundle(
        devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    """Messages sealed in the same turn go to the broker in one frame; each is stored, acked
    and read back exactly as if it had come alone."""
    topics = [unique_name(f"bu{i}") for i in range(6)]
    config = devcluster.config(topics=[TopicConfig(t, batch_ms=50, read_partitions=1) for t in topics])
    async with running_broker(config) as broker:
        async with Producer(producer_config(broker.url, ack="all", linger_ms=60_000)) as p:
            for r in range(3):
                futures = [await p.send(t, b"%s-r%d" % (t.encode(), r)) for t in topics]
                await p.flush()   # seals every topic's Message at once
                assert all(d.count == 1 and d.key for d in await asyncio.gather(*futures))
        m = broker.metrics.registry.get_sample_value
        bundles, bundled = m("memq_broker_bundles_total"), m("memq_broker_bundled_requests_total")
    assert bundles >= 3 and bundled >= 3 * len(topics) - 3 and bundled / bundles >= 2, (bundles, bundled)
    for t in topics:
        stored, dups, _ = await read_stored(config, t)
        assert sorted(v for _, v, _ in stored.values()) == [b"%s-r%d" % (t.encode(), r) for r in range(3)]
        assert dups == {}
