"""Reading compacted topics on real servers (ZooKeeper, governor, broker with a Kafka listener,
moto S3, tansu): after compaction a confluent-kafka consumer and memq's Consumer from earliest see
one record per live key with its latest value, in increasing offsets, no tombstone past
`delete.retention.ms`; `memq get` and `Consumer.get` answer the latest value, "no such key" or
deleted; a record without a key is refused at once with a named error, by memq's Producer and by
the Kafka door (INVALID_RECORD)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError, Producer as KafkaProducer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client import CollectorRegistry
from tests.support.cli import memq

from memq.client.consumer import Consumer
from memq.client.producer import Producer
from memq.compaction.manifest import ManifestPointers
from memq.compaction.run import Compactor
from memq.config import BrokerConfig
from memq.devcluster import DevCluster, GovernedCluster
from memq.errors import KeyRequiredError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

KEYS = 20
ROUNDS = 3


@pytest.fixture(scope="module")
def gc(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GovernedCluster]:
    with GovernedCluster(tmp_path_factory.mktemp("cpread"), brokers=1, servers=devcluster,
                         cluster=f"cpr-{uuid.uuid4().hex[:6]}", broker=BrokerConfig(kafka_port=0)) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def compacted(gc: GovernedCluster) -> tuple[str, dict[bytes, bytes]]:
    """A compacted topic (made by Kafka's CreateTopics under Kafka's names) written by a Kafka
    producer, key k0 deleted long enough ago to be dropped, then compacted: (topic, live values)."""
    topic = f"cp-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": _bootstrap(gc)})
    admin.create_topics([NewTopic(topic, 1, config={"cleanup.policy": "compact", "delete.retention.ms": "500",
                                                    "min.cleanable.dirty.ratio": "0.01"})])[topic].result(30)
    gc.wait_placed(topic)
    cfg = gc.registry.topic(topic)
    assert cfg.cleanup_policy == "compact" and cfg.delete_retention_ms == 500
    latest: dict[bytes, bytes] = {}
    producer = KafkaProducer({"bootstrap.servers": _bootstrap(gc), "acks": "all", "linger.ms": 5})
    for r in range(ROUNDS):
        for k in range(KEYS):
            key, value = b"k%d" % k, b"v%d-%d" % (r, k)
            deleted = k == 0 and r == ROUNDS - 1
            producer.produce(topic, key=key, value=None if deleted else value)
            if not deleted:
                latest[key] = value
        assert producer.flush(30) == 0
    latest.pop(b"k0")
    time.sleep(0.6)   # the tombstone is past delete.retention.ms when compaction runs
    compactor = Compactor(gc.base, ManifestPointers(gc.registry), CollectorRegistry())
    outcome = asyncio.run(compactor.partition(cfg, 0, force=True))
    assert outcome.manifest is not None and outcome.manifest.end == ROUNDS
    asyncio.run(compactor.close())
    return topic, latest


def _bootstrap(gc: GovernedCluster) -> str:
    from memq.client.cluster import fetch_metadata
    return next(b.kafka_address for b in fetch_metadata(gc.broker("b1").url, 10.0).brokers if b.kafka_address)


def test_a_kafka_consumer_from_earliest_sees_each_live_key_once_with_its_latest_value(
        gc: GovernedCluster, compacted: tuple[str, dict[bytes, bytes]]) -> None:
    topic, latest = compacted
    got = _kafka_read(gc, topic, 0)
    offsets = [o for o, _, _ in got]
    assert offsets == sorted(set(offsets))                       # increasing, no record twice
    assert {k: v for _, k, v in got} == latest                   # the latest value of each live key
    assert len(got) == len(latest)                               # one record per live key, k0 gone
    assert _kafka_read(gc, topic, 1 << 24) == got                # in a range compacted away: the next survivor on
    assert _kafka_read(gc, topic, offsets[10]) == got[10:]       # inside the prefix: from there


def _kafka_read(gc: GovernedCluster, topic: str, offset: int) -> list[tuple[int, bytes, bytes | None]]:
    """(offset, key, value) of partition 0 from `offset` to its end, read by confluent-kafka."""
    consumer = KafkaConsumer({"bootstrap.servers": _bootstrap(gc), "group.id": f"g-{uuid.uuid4().hex[:6]}",
                              "auto.offset.reset": "error", "enable.partition.eof": True,
                              "max.partition.fetch.bytes": 256})   # a batch larger than it still comes (KIP-74)
    try:
        consumer.assign([TopicPartition(topic, 0, offset)])
        got: list[tuple[int, bytes, bytes | None]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = consumer.poll(1.0)
            if m is None:
                continue
            if m.error():
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                break
            got.append((m.offset(), m.key(), m.value()))
        return got
    finally:
        consumer.close()


def test_memq_consumer_from_earliest_reads_the_compacted_prefix(
        gc: GovernedCluster, compacted: tuple[str, dict[bytes, bytes]], tmp_path: Path) -> None:
    topic, latest = compacted
    with Consumer(gc.config(), topic, group_id=f"m-{uuid.uuid4().hex[:6]}",
                  pointers=ManifestPointers(gc.registry)) as consumer:
        got = []
        deadline = time.monotonic() + 60
        while len(got) < len(latest) and time.monotonic() < deadline:
            got += [(r.offset, r.index, r.key, r.value) for r in consumer.poll(1.0)]
        got += [(r.offset, r.index, r.key, r.value) for r in consumer.poll(1.0)]
        assert consumer.commit() == {0: ROUNDS}                   # past the prefix: its end
    places = [(o, i) for o, i, _, _ in got]
    assert places == sorted(set(places))
    assert {k: v for _, _, k, v in got} == latest and len(got) == len(latest)

    out = memq("consume", topic, "--from-beginning", "--keys", "--idle-timeout", "2", "-g", f"c-{uuid.uuid4().hex[:6]}",
               config=gc.write_client_config(tmp_path / "client.toml"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert dict(line.split(b"\t") for line in lines) == latest and len(lines) == len(latest)


def test_get_answers_latest_value_no_such_key_and_deleted(
        gc: GovernedCluster, compacted: tuple[str, dict[bytes, bytes]], tmp_path: Path) -> None:
    topic, latest = compacted
    producer = KafkaProducer({"bootstrap.servers": _bootstrap(gc), "acks": "all"})
    producer.produce(topic, key=b"k5", value=b"newer")            # the plain tail, after compaction
    producer.produce(topic, key=b"k6", value=None)                # a tombstone in the tail
    assert producer.flush(30) == 0
    cfg = gc.write_client_config(tmp_path / "client.toml")
    out = memq("get", topic, "k5", config=cfg)
    assert out.returncode == 0 and out.stdout == b"newer\n", out.stderr
    out = memq("get", topic, "k7", config=cfg)                    # from the compacted part's key index
    assert out.returncode == 0 and out.stdout == latest[b"k7"] + b"\n", out.stderr
    out = memq("get", topic, "k6", config=cfg)
    assert out.returncode == 1 and b"deleted" in out.stderr
    for missing in ("k0", "nokey"):                               # k0's tombstone was dropped
        out = memq("get", topic, missing, config=cfg)
        assert out.returncode == 1 and b"no such key" in out.stderr, out.stderr
    with Consumer(gc.config(), topic, subscribe=False, pointers=ManifestPointers(gc.registry)) as consumer:
        k7 = consumer.get(b"k7")
        assert k7 is not None and k7.value == latest[b"k7"] and k7.offset >> 24 < ROUNDS
        k6 = consumer.get(b"k6")
        assert k6 is not None and k6.deleted
        assert consumer.get(b"nokey") is None


def test_a_record_without_a_key_is_refused_at_once(
        gc: GovernedCluster, compacted: tuple[str, dict[bytes, bytes]]) -> None:
    topic, _ = compacted
    errors: list[KafkaError] = []
    producer = KafkaProducer({"bootstrap.servers": _bootstrap(gc), "acks": "all", "retries": 0})
    producer.produce(topic, value=b"no key", on_delivery=lambda err, _msg: errors.append(err))
    start = time.monotonic()
    assert producer.flush(30) == 0
    assert time.monotonic() - start < 10
    assert errors and errors[0] is not None and errors[0].code() == KafkaError.INVALID_RECORD

    async def send() -> None:
        async with Producer(dataclasses.replace(gc.config().producer, codec="none")) as p:
            with pytest.raises(KeyRequiredError, match="compacted"):
                await p.send(topic, b"no key")
            with pytest.raises(KeyRequiredError):
                await p.send_many(topic, [b"a", b"b"], keys=[b"a", None])
            assert (await (await p.send(topic, b"keyed", key=b"k9"))).count == 1
    asyncio.run(send())
