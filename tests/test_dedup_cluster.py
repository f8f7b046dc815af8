"""No duplicates by default, on the real path (moto S3, tansu, in-process brokers): a Message
really stored twice, and short ack=all runs through a paused Kafka and a paused S3, are read
by the default Consumer exactly once, while a Consumer with `consumer.dedup = false` shows
the duplicates the default one dropped. Also a committed position outside the retained
notifications on the real Kafka (tansu cannot expire records, so the position is past the end).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import aiohttp
import pytest

from memq.client.consumer import Consumer, notification_topic
from memq.config import KafkaConfig
from memq.devcluster import DevCluster
from memq.errors import OffsetOutOfRangeError
from memq.format import Codec, LogMessage, encode_message
from memq.format.wire import AckLevel, decode_acks, encode_request
from memq.notify import NotificationConsumer, TopicAdmin
from tests.support.dedup import check_no_duplicates_delivered, drain, duplicates, stream
from tests.support.cluster import read_stored, running_broker, topic_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KAFKA_TIMEOUT_MS = 3_000


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[DevCluster]:
    with DevCluster(tmp_path / "kafka", s3=False, zookeeper=False) as dc:
        yield dc


@pytest.fixture
def own_s3(tmp_path: Path) -> Iterator[DevCluster]:
    with DevCluster(tmp_path / "s3", kafka=False, zookeeper=False) as dc:
        yield dc


@pytest.mark.slow   # a soak (faults or scale played out for 20-60 s): `python -m bench soak`
async def test_a_paused_kafka_run_delivers_no_duplicates(devcluster: DevCluster, own_kafka: DevCluster,
                                                         unique_name: Callable[[str], str]) -> None:
    topic = unique_name("kpause")
    base = devcluster.config(topics=[topic_config(topic, batch_ms=50)])
    config = dataclasses.replace(base, kafka=KafkaConfig(bootstrap_servers=own_kafka.kafka_bootstrap or "",
                                                         request_timeout_ms=KAFKA_TIMEOUT_MS))
    tansu = own_kafka.pids["kafka"]
    async with running_broker(config) as broker:
        acked = await stream(config, broker.url, topic, lambda: os.kill(tansu, signal.SIGSTOP),
                             lambda: os.kill(tansu, signal.SIGCONT))
    await check_no_duplicates_delivered(dataclasses.replace(config, kafka=dataclasses.replace(
        config.kafka, request_timeout_ms=10_000)), topic, acked)


@pytest.mark.slow   # a soak (faults or scale played out for 20-60 s): `python -m bench soak`
async def test_a_paused_s3_run_delivers_no_duplicates(devcluster: DevCluster, own_s3: DevCluster,
                                                      unique_name: Callable[[str], str]) -> None:
    topic = unique_name("s3pause")
    base = devcluster.config(topics=[topic_config(topic, batch_ms=50)])
    s3 = dataclasses.replace(base.s3, endpoint_url=own_s3.s3_endpoint, connect_timeout_s=2.0, read_timeout_s=2.0)
    config = dataclasses.replace(base, s3=s3)
    moto = own_s3.pids["s3"]
    async with running_broker(config) as broker:
        acked = await stream(config, broker.url, topic, lambda: os.kill(moto, signal.SIGSTOP),
                             lambda: os.kill(moto, signal.SIGCONT))
    await check_no_duplicates_delivered(config, topic, acked)


async def test_a_message_stored_by_two_brokers_is_delivered_once(devcluster: DevCluster,
                                                                 unique_name: Callable[[str], str]) -> None:
    """A producer gave up on one broker and sent the Message to another: both stored it."""
    topic = unique_name("twice")
    config = devcluster.config(topics=[topic_config(topic, batch_ms=20)])
    frames = {seq: encode_message([LogMessage(b"m%d-%d" % (seq, i)) for i in range(10)], producer_id=77, epoch=3,
                                  sequence=seq, codec=Codec.NONE) for seq in range(3)}
    other = dataclasses.replace(config, broker=dataclasses.replace(config.broker, broker_id="b2"))
    async with running_broker(config) as a, running_broker(other) as b, aiohttp.ClientSession() as s:
        for url, seqs in ((a.url, (0, 1)), (b.url, (1, 2))):          # sequence 1 goes to both
            async with s.ws_connect(url + "/v1/produce") as ws:
                for seq in seqs:
                    await ws.send_bytes(encode_request(seq + 1, AckLevel.ALL, topic, frames[seq]))
                    assert all(ack.ok for ack in decode_acks(await ws.receive_bytes(timeout=30)))
    stored, stored_dups, keys = await read_stored(config, topic)
    assert (len(stored), len(stored_dups), len(keys)) == (30, 10, 4)   # one object per Message; 10 LogMessages stored twice
    want = {b"m%d-%d" % (seq, i) for seq in range(3) for i in range(10)}
    got, metrics = await asyncio.to_thread(drain, config, topic, want, dedup=True)
    assert got == Counter(want) and (metrics.duplicate_messages, metrics.duplicates_dropped) == (1, 10)
    raw, _ = await asyncio.to_thread(drain, config, topic, want, dedup=False)
    assert duplicates(raw) == 10


def test_a_position_past_the_retained_notifications_follows_auto_offset_reset(
        devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    """tansu keeps every record (no retention, no delete-records), so the committed offset is
    put past the end of the log: Kafka's OffsetOutOfRange all the same."""
    from tests.support.cluster import records, write_batches

    topic = unique_name("reset")
    config = devcluster.config()
    kafka_topic = notification_topic(config, topic)
    TopicAdmin(config.kafka).create_topic(kafka_topic, 1)
    write_batches(config, topic, [[(5, 0, s, records(2, f"b{s}"))] for s in range(3)])
    resets: list[tuple[Literal["earliest", "latest", "error"], int | None]] = [("error", None), ("earliest", 6),
                                                                              ("latest", 0)]
    for reset, check in resets:
        group = unique_name(reset)
        nc = NotificationConsumer(config.kafka, kafka_topic, group_id=group)
        try:
            nc.commit({0: 1_000})
        finally:
            nc.close()
        cc = dataclasses.replace(config.consumer, group_id=group, auto_offset_reset=reset)
        with Consumer(dataclasses.replace(config, consumer=cc), topic) as c:
            deadline = time.monotonic() + 30
            if check is None:
                with pytest.raises(OffsetOutOfRangeError, match=r"committed position 1000 .*oldest available offset 0"):
                    while time.monotonic() < deadline:
                        list(c.poll(0.5))
                continue
            got: list[bytes] = []
            while time.monotonic() < deadline and (len(got) < check or not c.assignment()):
                got += [bytes(r.value) for r in c.poll(0.5)]
            got += [bytes(r.value) for r in c.poll(1.0)]
            assert len(got) == check and c.metrics.offset_resets == 1, (reset, got)
            assert c.position() == {0: 3}
