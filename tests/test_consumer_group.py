"""The whole path on the real dev cluster: Producer -> broker process -> S3 + Kafka -> Consumers.

200k messages with keys and headers are produced once for the module; a group of three
consumers reads each exactly once, and a consumer restarted mid-way resumes from the
committed position.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from memq.client.consumer import Consumer, ConsumerRecord
from memq.client.producer import Producer
from memq.config import BrokerConfig, MemqConfig, TopicConfig
from memq.devcluster import DevCluster
from memq.devcluster.broker_process import BrokerProcess
from memq.format import LogMessage

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOTAL = 200_000
KiB = 1024

Row = tuple[bytes | None, bytes, tuple[tuple[str, bytes], ...]]


def row(r: ConsumerRecord) -> Row:
    return r.key, r.value, r.headers


@pytest.fixture(scope="module")
def produced(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MemqConfig, str, Counter[Row]]]:
    """TOTAL messages in a 3-partition topic, in many small batches (so restarts fall mid-topic)."""
    name = f"grp-{uuid.uuid4().hex[:8]}"
    topic = TopicConfig(name=name, read_partitions=3, batch_bytes=512 * KiB, max_message_bytes=128 * KiB)
    config = devcluster.config(topics=[topic])
    with BrokerProcess(dataclasses.replace(config, broker=BrokerConfig(broker_id="grp")),
                       tmp_path_factory.mktemp("grp")) as broker:
        config = dataclasses.replace(config, producer=dataclasses.replace(
            config.producer, brokers=broker.url, ack="all", max_message_bytes=64 * KiB))
        sent = [LogMessage(value=b"value-%d-" % i + b"p" * (i % 64), key=b"key-%d" % i,
                           headers=(("n", b"%d" % i), ("src", b"test")), timestamp_ms=0)
                for i in range(TOTAL)]

        async def send() -> None:
            async with Producer(config.producer) as producer:
                futures = [await producer.send_batch(name, sent[i:i + 10_000]) for i in range(0, TOTAL, 10_000)]
                await asyncio.gather(*futures)

        asyncio.run(asyncio.wait_for(send(), 120))
        yield config, name, Counter((m.key, m.value, m.headers) for m in sent)


def test_group_of_three_reads_every_message_exactly_once(produced) -> None:
    config, name, expected = produced
    group = f"three-{uuid.uuid4().hex[:6]}"
    got: list[list[ConsumerRecord]] = [[], [], []]
    total = [0]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def member(i: int) -> None:
        try:
            with Consumer(config, name, group_id=group) as c:
                deadline = time.monotonic() + 120
                while total[0] < TOTAL and time.monotonic() < deadline:
                    batch = list(c.poll(0.5))
                    if batch:
                        got[i].extend(batch)
                        c.commit()
                        with lock:
                            total[0] += len(batch)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=member, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    assert not errors, errors
    everything = [r for part in got for r in part]
    assert len(everything) == TOTAL
    assert Counter(map(row, everything)) == expected
    # no two members read the same batch
    owners = {}
    for i, part in enumerate(got):
        for r in part:
            assert owners.setdefault((r.partition, r.offset), i) == i


def test_restarted_consumer_resumes_from_the_committed_position(produced) -> None:
    config, name, expected = produced
    group = f"restart-{uuid.uuid4().hex[:6]}"
    first: list[ConsumerRecord] = []
    with Consumer(config, name, group_id=group) as c:
        deadline = time.monotonic() + 60
        while len(first) < TOTAL // 2:
            assert time.monotonic() < deadline
            first.extend(c.poll(1.0))
            c.commit()
        committed_count = len(first)
        it = c.poll(10.0)
        uncommitted = [next(it) for _ in range(10)]   # half a batch handed, never committed
        first.extend(uncommitted)
    second: list[ConsumerRecord] = []
    with Consumer(config, name, group_id=group) as c:
        deadline = time.monotonic() + 60
        while len(second) < TOTAL - committed_count:
            assert time.monotonic() < deadline, f"{len(second)} of {TOTAL - committed_count}"
            second.extend(c.poll(1.0))
        assert list(c.poll(1.0)) == []
    assert len(second) == TOTAL - committed_count
    assert Counter(map(row, first[:committed_count] + second)) == expected   # no loss, nothing twice
    again = set(map(row, first)) & set(map(row, second))
    assert again == set(map(row, uncommitted))        # duplicates only from the uncommitted batch
