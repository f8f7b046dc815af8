"""Storage groups on the real path: a broker (moto S3, tansu) seals three topics into one object;
the Consumer and Spark read each topic's part exactly; a damaged part costs only its topic;
topics with their own group never share; retention deletes a shared object only when every
part has expired. Tests run in file order (the damage test last: it breaks the shared object).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import boto3
import pytest
from prometheus_client import CollectorRegistry

from memq.broker.server import Broker
from memq.client.consumer import Consumer, ConsumerRecord
from memq.client.producer import Producer
from memq.config import ConsumerConfig, GovernorConfig, MemqConfig, ProducerConfig, TopicConfig
from memq.devcluster import DevCluster
from memq.errors import DataLossError
from memq.format import decode_batch, split_parts
from memq.governor.janitor import Janitor
from memq.storage import make_storage
from memq.storage.naming import parse_key
from tests.support.spark import connection

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

T = TypeVar("T")
SHARED = ("a", "b", "c")                 # storage group "g"
OWN = {"solo": "", "lone": "lone"}        # a topic's own objects; a group of one


@dataclass(frozen=True)
class Written:
    config: MemqConfig
    values: dict[str, list[bytes]]        # topic -> values produced


@contextmanager
def running(config: MemqConfig) -> Iterator[tuple[str, Callable[[Coroutine[Any, Any, T]], T]]]:
    """A real Broker (S3 and Kafka from `config`) on a loop thread: (its URL, run on its loop)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    broker = Broker(config)

    def run(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(120)

    try:
        yield run(broker.start()), run
    finally:
        run(broker.stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


async def produce(url: str, values: dict[str, list[bytes]], flushed: tuple[str, ...]) -> None:
    """The topics not in `flushed` with ack=1 (in the broker's batches, not sealed: batch_ms is a
    minute), then `flushed` with ack=all and a flush: each flush seals its topic's group object."""
    async with Producer(ProducerConfig(brokers=url, ack="1")) as p:
        for t in values:
            if t not in flushed:
                await (await p.send_many(t, values[t]))
    async with Producer(ProducerConfig(brokers=url, ack="all")) as p:
        pending = [await p.send_many(t, values[t]) for t in flushed]
        await p.flush()
        for fut in pending:
            await fut


@pytest.fixture(scope="module")
def written(devcluster: DevCluster) -> Written:
    cluster = f"sh{uuid.uuid4().hex[:8]}"
    # sparse: read back with Kafka and S3 alone, after the broker stopped (a dense topic's reader asks one)
    topics = [TopicConfig(t, read_partitions=2, batch_ms=60_000, storage_group="g", offsets="sparse") for t in SHARED]
    topics += [TopicConfig(t, read_partitions=1, batch_ms=60_000, storage_group=g, offsets="sparse")
               for t, g in OWN.items()]
    config = devcluster.config(cluster=cluster, topics=topics)
    values = {t: [b"%s-%05d" % (t.encode(), i) for i in range(300 * (n + 1))] for n, t in enumerate([*SHARED, *OWN])}
    with running(config) as (url, run):
        run(produce(url, values, flushed=("c", *OWN)))
    return Written(config, values)


def consume(config: MemqConfig, topic: str, n: int, wait_s: float = 30, **cc: Any) -> list[ConsumerRecord]:
    """The topic's records from the start, polled until `n` arrived (then a little more) or `wait_s`."""
    group = ConsumerConfig(group_id=f"g-{uuid.uuid4().hex[:8]}", **cc)
    out: list[ConsumerRecord] = []
    with Consumer(dataclasses.replace(config, consumer=group), topic) as c:
        deadline = time.monotonic() + wait_s
        while len(out) < n and time.monotonic() < deadline:
            out.extend(c.poll(1.0))
        out.extend(c.poll(0.5))
    return out


def test_three_topics_share_one_object_and_each_reads_back_exactly(written: Written) -> None:
    keys = {}
    for t in SHARED:
        got = consume(written.config, t, len(written.values[t]))
        assert sorted(bytes(r.value) for r in got) == sorted(written.values[t])
        keys[t] = {r.location.key for r in got}
    [key] = set.union(*keys.values())                       # one object for the three topics
    assert parse_key(key).group == "g" and f"/{written.config.cluster.name}/groups/g/" in key

    async def parts() -> list[int]:
        storage = make_storage(written.config)
        try:
            loc = next(r.location for r in consume(written.config, "a", 1))
            return [decode_batch(p)[0].logmessage_count for p in split_parts(await storage.get(loc))]
        finally:
            await storage.close()

    assert sorted(asyncio.run(parts())) == sorted(len(written.values[t]) for t in SHARED)


def test_topics_with_their_own_group_never_share(written: Written) -> None:
    shared = {r.location.key for r in consume(written.config, "a", 1)}
    for t, group in OWN.items():
        got = consume(written.config, t, len(written.values[t]))
        assert sorted(bytes(r.value) for r in got) == sorted(written.values[t])
        [key] = {r.location.key for r in got}
        parsed = parse_key(key)
        assert key not in shared and (parsed.group, parsed.topic) == ((group, "") if group else ("", t))


def spark_values(spark: Any, config: MemqConfig, topic: str, **options: str) -> list[bytes]:
    df = spark.read.format("memq").options(**connection(config)).option("topic", topic).options(**options).load()
    return sorted(bytes(r.value) for r in df.select("value").collect())


def test_spark_reads_each_topics_part_exactly(written: Written, spark: Any) -> None:
    for t in SHARED:
        assert spark_values(spark, written.config, t) == sorted(written.values[t])


def test_a_damaged_part_fails_only_its_own_topics_reads(written: Written, spark: Any) -> None:
    """Bytes inside b's part are overwritten in S3: b's reads raise (or skip, when told), by the
    Consumer and by Spark; a's and c's parts of the same object read as before."""
    cfg = written.config
    loc = next(r.location for r in consume(cfg, "b", 1))
    s3 = boto3.client("s3", endpoint_url=cfg.s3.endpoint_url, region_name=cfg.s3.region,
                      aws_access_key_id=cfg.s3.access_key_id, aws_secret_access_key=cfg.s3.secret_access_key)
    body = bytearray(s3.get_object(Bucket=loc.bucket, Key=loc.key)["Body"].read())
    counts = {t: len(written.values[t]) for t in SHARED}
    b_part = next(p for p in split_parts(body) if decode_batch(p)[0].logmessage_count == counts["b"])
    start = bytes(body).index(bytes(b_part))
    body[start + len(b_part) - 10] ^= 0xFF                   # inside b's last Message
    s3.put_object(Bucket=loc.bucket, Key=loc.key, Body=bytes(body))

    with pytest.raises(DataLossError, match="CRC32C") as e:
        consume(cfg, "b", 1)
    assert e.value.topic == "b" and e.value.location == loc.key
    assert consume(cfg, "b", 1, wait_s=5, on_data_loss="skip") == []
    for t in ("a", "c"):
        assert sorted(bytes(r.value) for r in consume(cfg, t, counts[t])) == sorted(written.values[t])
    with pytest.raises(Exception, match="CRC32C"):           # Spark wraps the task's DataLossError
        spark_values(spark, cfg, "b")
    assert spark_values(spark, cfg, "b", failOnDataLoss="false") == []
    assert spark_values(spark, cfg, "a") == sorted(written.values["a"])


async def test_retention_deletes_a_shared_object_only_when_every_part_expired(
        devcluster: DevCluster) -> None:
    """Topics short (2 s) and long (7 s) share objects: after 3.5 s only the short one's retention
    has passed and the object stays; after both, it goes."""
    governor = GovernorConfig(janitor_interval_s=1.0, retention_grace_s=0.5, orphan_grace_s=600.0,
                              janitor_timeout_s=30.0)
    topics = {"short": TopicConfig("short", read_partitions=1, retention_ms=2_000, batch_ms=60_000, storage_group="r"),
              "long": TopicConfig("long", read_partitions=1, retention_ms=7_000, batch_ms=60_000, storage_group="r")}
    config = dataclasses.replace(devcluster.config(cluster=f"re{uuid.uuid4().hex[:8]}", topics=tuple(topics.values())),
                                 governor=governor)
    storage = make_storage(config)
    janitor = Janitor(config, CollectorRegistry())

    async def objects() -> list[str]:
        return [o.location.key for o in await storage.list_group("r", 0, 10**13, all_attempts=True)]

    try:
        with running(config) as (url, run):
            run(produce(url, {"short": [b"s"] * 5, "long": [b"l"] * 5}, flushed=("long",)))
        [key] = await objects()
        written_at = time.monotonic()
        await asyncio.sleep(3.5 - (time.monotonic() - written_at))     # past short's retention + grace only
        reports = {r.topic: r for r in await janitor.run_once(topics)}
        assert reports["group:r"].expired == () and await objects() == [key]
        await asyncio.sleep(8.0 - (time.monotonic() - written_at))     # past long's retention + grace too
        reports = {r.topic: r for r in await janitor.run_once(topics)}
        assert [o.location.key for o in reports["group:r"].expired] == [key] and await objects() == []
    finally:
        await janitor.close()
        await storage.close()
