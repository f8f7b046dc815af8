"""Reading compacted topics on real servers (ZooKeeper, governor, broker with a Kafka listener,
moto S3, tansu): after compaction a confluent-kafka consumer and memq's Consumer from earliest see
one record per live key with its latest value, in increasing offsets, no tombstone past
`delete.retention.ms`; `memq get` and `Consumer.get` answer the latest value, "no such key" or
deleted; a record without a key is refused at once with a named error, by memq's Producer and by
the Kafka door (INVALID_RECORD). A compacted topic of three read partitions written by memq's
Producer and by confluent-kafka (murmur2_random) places each key in one partition, so compaction
per partition leaves one record per live key, and CreatePartitions on it is refused."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer as KafkaProducer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from prometheus_client import CollectorRegistry
from tests.support.cli import memq
from tests.support.kafka_clients import read_to_end

from memq.client.consumer import Consumer
from memq.client.placement import key_partition
from memq.client.producer import Producer
from memq.compaction.manifest import ManifestPointers
from memq.compaction.run import Compactor
from memq.config import BrokerConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster
from memq.devcluster.governed import FAST_GOVERNOR
from memq.errors import InvalidInputError, KeyRequiredError
from memq.format.kafka_records import KafkaCodec, peek_kafka_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

KEYS = 20
ROUNDS = 3


@pytest.fixture(scope="module")
def gc(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GovernedCluster]:
    """The brokers' own compactor is held off (an hour's interval): the tests compact when they mean
    to, and a tombstone they write stays past delete.retention.ms until they ask for it."""
    governor = dataclasses.replace(FAST_GOVERNOR, compaction_interval_s=3600.0)
    with GovernedCluster(tmp_path_factory.mktemp("cpread"), brokers=1, servers=devcluster, governor=governor,
                         cluster=f"cpr-{uuid.uuid4().hex[:6]}", broker=BrokerConfig(kafka_port=0)) as cluster:
        yield cluster


def _created(gc: GovernedCluster, prefix: str, partitions: int, **settings: str) -> tuple[str, TopicConfig]:
    """A compacted topic made by Kafka's CreateTopics under Kafka's names, once placed: its name and
    settings. Its creator also passes settings Kafka defines and memq has no use for, as Kafka
    Streams and Quix do for their changelogs: accepted and kept, changing nothing. `settings`: memq's
    settings (`offsets="sparse"` for the topics memq's Consumer reads: it counts in notifications)."""
    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": _bootstrap(gc)})
    inert = {"segment.ms": "600000", "segment.bytes": "52428800", "min.insync.replicas": "2"}
    admin.create_topics([NewTopic(topic, partitions, config={"cleanup.policy": "compact", "delete.retention.ms": "500",
                                                             "min.cleanable.dirty.ratio": "0.01", **inert,
                                                             **{f"memq.{k}": v for k, v in settings.items()}})
                         ])[topic].result(30)
    gc.wait_placed(topic)
    cfg = gc.registry.topic(topic)
    assert dict(cfg.kafka_inert) == inert
    return topic, cfg


def _written_and_compacted(gc: GovernedCluster, offsets: str) -> tuple[str, TopicConfig, KafkaProducer,
                                                                      dict[bytes, bytes]]:
    """A compacted topic (made by Kafka's CreateTopics under Kafka's names) written by a Kafka
    producer, key k0 deleted long enough ago to be dropped, then compacted: (topic, its settings,
    the producer, live values)."""
    topic, cfg = _created(gc, "cp", 1, offsets=offsets)
    assert cfg.cleanup_policy == "compact" and cfg.delete_retention_ms == 500
    assert cfg.storage_group == ""          # objects of its own, which compaction can release
    latest: dict[bytes, bytes] = {}
    producer = KafkaProducer({"bootstrap.servers": _bootstrap(gc), "acks": "all", "linger.ms": 5,
                              "compression.type": "lz4"})
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

    async def codecs() -> set[KafkaCodec]:   # compaction keeps the codec the producer chose
        return {peek_kafka_batch(b).codec for p in outcome.manifest.parts async for b in compactor.parts.batches_from(p, 0)}
    assert asyncio.run(codecs()) == {KafkaCodec.LZ4}
    asyncio.run(compactor.close())
    return topic, cfg, producer, latest


@pytest.fixture(scope="module")
def compacted(gc: GovernedCluster) -> tuple[str, dict[bytes, bytes]]:
    """A sparse compacted topic: (topic, live values)."""
    topic, _, _, latest = _written_and_compacted(gc, "sparse")
    return topic, latest


#: The dense topic's tails: the first compacted in a second run (a second part), the second left plain.
TAILS = ((b"t", 3), (b"u", 3))


@pytest.fixture(scope="module")
def compacted_dense(gc: GovernedCluster) -> tuple[str, dict[bytes, bytes]]:
    """A dense compacted topic, then a tail compacted into a second part, then a plain tail:
    (topic, live values)."""
    topic, cfg, producer, latest = _written_and_compacted(gc, "dense")
    for n, (prefix, count) in enumerate(TAILS):
        for i in range(count):
            producer.produce(topic, key=prefix + b"%d" % i, value=b"%s-tail%d" % (prefix, i))
            latest[prefix + b"%d" % i] = b"%s-tail%d" % (prefix, i)
        assert producer.flush(30) == 0
        if n == 0:
            compactor = Compactor(gc.base, ManifestPointers(gc.registry), CollectorRegistry())
            outcome = asyncio.run(compactor.partition(cfg, 0, force=True))
            asyncio.run(compactor.close())
            assert outcome.manifest is not None and len(outcome.manifest.parts) == 2
            assert outcome.manifest.tail_offset == ROUNDS * KEYS + count
    return topic, latest


def _dense_records(latest: dict[bytes, bytes]) -> list[tuple[int, bytes, bytes]]:
    """(offset, key, value) the dense topic's readers get: each key's latest record at the record
    number it was written at (the last round's, k0's tombstone dropped), then the tails'."""
    last = [((ROUNDS - 1) * KEYS + k, b"k%d" % k) for k in range(1, KEYS)]
    tails = list(enumerate((prefix + b"%d" % i for prefix, count in TAILS for i in range(count)), ROUNDS * KEYS))
    return [(o, k, latest[k]) for o, k in last + tails]


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


def test_a_dense_compacted_topic_keeps_each_records_offset_across_compaction(gc: GovernedCluster) -> None:
    """Kafka's contract on a compacted topic: after compaction each key's latest value is read at
    the offset it was written at (a record number: dense offsets), with gaps where records were
    removed, and the records written after it follow at consecutive offsets; `Consumer.get` answers
    a key with the same offset."""
    topic, cfg = _created(gc, "cpd", 1)
    assert cfg.offsets == "dense"                       # what Kafka's CreateTopics makes by default
    producer = KafkaProducer({"bootstrap.servers": _bootstrap(gc), "acks": "all", "linger.ms": 5})
    written: dict[bytes, tuple[int, bytes]] = {}
    for r in range(ROUNDS):
        for k in range(KEYS):
            key, value = b"k%d" % k, b"v%d-%d" % (r, k)
            producer.produce(topic, key=key, value=value)
            written[key] = (r * KEYS + k, value)        # a record number: one producer, one partition, in order
        assert producer.flush(30) == 0
    compactor = Compactor(gc.base, ManifestPointers(gc.registry), CollectorRegistry())
    outcome = asyncio.run(compactor.partition(cfg, 0, force=True))
    asyncio.run(compactor.close())
    assert outcome.manifest is not None and outcome.manifest.tail_offset == ROUNDS * KEYS
    for i in range(3):
        producer.produce(topic, key=b"t%d" % i, value=b"tail%d" % i)
    assert producer.flush(30) == 0
    survivors = sorted((o, k, v) for k, (o, v) in written.items())
    tail = [(ROUNDS * KEYS + i, b"t%d" % i, b"tail%d" % i) for i in range(3)]
    assert _kafka_read(gc, topic, 0) == survivors + tail
    assert _kafka_read(gc, topic, 10) == survivors + tail                    # from a removed record: the next one
    assert _kafka_read(gc, topic, survivors[5][0]) == survivors[5:] + tail   # inside the prefix: from there
    with Consumer(gc.config(), topic, subscribe=False, pointers=ManifestPointers(gc.registry)) as consumer:
        by_key = [(f.offset, f.key, f.value) for k in (b"k3", b"t1") if (f := consumer.get(k)) is not None]
    assert by_key == [survivors[3], tail[1]]                             # from a part, from the tail: Kafka's offsets
    compactor = Compactor(gc.base, ManifestPointers(gc.registry), CollectorRegistry())
    again = asyncio.run(compactor.partition(cfg, 0, force=True))     # counts on from the stored tail offset
    asyncio.run(compactor.close())
    assert again.manifest is not None and again.manifest.tail_offset == ROUNDS * KEYS + 3
    assert _kafka_read(gc, topic, 0) == survivors + tail


def _kafka_read(gc: GovernedCluster, topic: str, offset: int,
                partition: int = 0) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of `partition` from `offset` to its end, read by confluent-kafka."""
    return read_to_end(_bootstrap(gc), topic, offset, partition,   # a batch larger than it still comes (KIP-74)
                       **{"max.partition.fetch.bytes": 256})


def _memq_read(consumer: Consumer, count: int) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(offset, index, key, value) of `count` records polled (then one poll more: none must come)."""
    got: list[tuple[int, int, bytes | None, bytes | None]] = []
    deadline = time.monotonic() + 60
    while len(got) < count and time.monotonic() < deadline:
        got += [(r.offset, r.index, r.key, r.value) for r in consumer.poll(1.0)]
    return got + [(r.offset, r.index, r.key, r.value) for r in consumer.poll(1.0)]


@pytest.mark.parametrize("offsets", ["sparse", "dense"])
def test_memq_consumer_from_earliest_reads_the_compacted_prefix(
        gc: GovernedCluster, offsets: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """From earliest memq's Consumer reads each key's latest value, then the tail. On a dense topic
    it reads each record at the offset Kafka clients read (the survivors' record numbers, gaps
    where compaction removed records), and a position committed or sought inside the prefix
    resumes there, as a Kafka client's does."""
    topic, latest = request.getfixturevalue("compacted" if offsets == "sparse" else "compacted_dense")
    pointers = ManifestPointers(gc.registry)
    with Consumer(gc.config(), topic, group_id=f"m-{uuid.uuid4().hex[:6]}", pointers=pointers) as consumer:
        got = _memq_read(consumer, len(latest))
        end = consumer.commit()
        assert end == consumer.committed()
    places = [(o, i) for o, i, _, _ in got]
    assert places == sorted(set(places))
    assert {k: v for _, _, k, v in got} == latest and len(got) == len(latest)
    if offsets == "sparse":
        assert end == {0: ROUNDS}                                # past the prefix: its end
    else:
        records = _dense_records(latest)
        assert [(o, k, v) for o, _, k, v in got] == records == _kafka_read(gc, topic, 0)
        assert end == {0: records[-1][0] + 1}                    # after the last record, as Kafka's lag counts
        _dense_positions_inside_the_prefix(gc, topic, records)

    # stops at the prefix's count (a first read of the prefix may take seconds on a loaded machine;
    # an idle timeout of 2 s ended it with nothing read); a key missing or read twice fails below
    out = memq("consume", topic, "--from-beginning", "--keys", "-n", str(len(latest)), "--idle-timeout", "30",
               "-g", f"c-{uuid.uuid4().hex[:6]}", config=gc.write_client_config(tmp_path / "client.toml"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert dict(line.split(b"\t") for line in lines) == latest and len(lines) == len(latest)


def _dense_positions_inside_the_prefix(gc: GovernedCluster, topic: str, records: list[tuple[int, bytes, bytes]]
                                      ) -> None:
    """A group that read the first compacted part commits the record offset after it, inside the
    prefix; a consumer of that group resumes there; a seek into the prefix starts at its record."""
    group, pointers = f"m-{uuid.uuid4().hex[:6]}", ManifestPointers(gc.registry)
    first_part = KEYS - 1                                        # the first run's survivors, k0 dropped
    with Consumer(gc.config(), topic, group_id=group, pointers=pointers) as consumer:
        got = []
        deadline = time.monotonic() + 60
        while len(got) < first_part and time.monotonic() < deadline:
            got += [(r.offset, r.key, r.value) for r in consumer.poll(1.0)]
        assert got == records[:first_part]
        inside = records[first_part][0]                          # the second part's first record
        assert consumer.commit() == {0: inside} == consumer.committed()
    with Consumer(gc.config(), topic, group_id=group, pointers=pointers) as consumer:
        assert consumer.committed([0]) == {0: inside}
        assert [(o, k, v) for o, _, k, v in _memq_read(consumer, len(records) - first_part)] == records[first_part:]
    with Consumer(gc.config(), topic, group_id=f"m-{uuid.uuid4().hex[:6]}", pointers=pointers,
                  subscribe=False) as consumer:
        consumer._notify.assign({0: 0})   # type: ignore[attr-defined]
        consumer.seek(0, records[5][0])
        assert [(o, k, v) for o, _, k, v in _memq_read(consumer, len(records) - 5)] == records[5:]
        assert _kafka_read(gc, topic, records[5][0]) == records[5:]


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


PLACED_KEYS = 30


@pytest.fixture(scope="module")
def placed(gc: GovernedCluster) -> tuple[str, dict[bytes, bytes]]:
    """A compacted topic of 3 read partitions: memq's Producer writes every key, confluent-kafka
    (murmur2_random, Kafka's Java partitioner) writes every key again and deletes k1, memq's
    Producer rewrites the even keys; then each partition is compacted: (topic, live values)."""
    topic, cfg = _created(gc, "cp3", 3, offsets="sparse")
    assert cfg.compacted and cfg.read_partitions == 3
    keys = [b"k%d" % k for k in range(PLACED_KEYS)]

    async def memq_round(prefix: bytes, which: list[bytes]) -> None:
        async with Producer(dataclasses.replace(gc.config().producer, codec="none")) as p:
            deliveries = await (await p.send_many(topic, [prefix + k for k in which], keys=which))
            assert sum(d.count for d in deliveries) == len(which)
            assert {d.partition for d in deliveries} == {0, 1, 2}     # acked where the key was placed
    asyncio.run(memq_round(b"m0-", keys))
    producer = KafkaProducer({"bootstrap.servers": _bootstrap(gc), "acks": "all", "linger.ms": 5,
                              "partitioner": "murmur2_random"})
    for k in keys:
        producer.produce(topic, key=k, value=None if k == b"k1" else b"c1-" + k)
    assert producer.flush(30) == 0
    asyncio.run(memq_round(b"m2-", keys[::2]))
    latest = {k: (b"m2-" if i % 2 == 0 else b"c1-") + k for i, k in enumerate(keys) if k != b"k1"}
    time.sleep(0.6)   # k1's tombstone is past delete.retention.ms when compaction runs
    pointers = ManifestPointers(gc.registry)
    compactor = Compactor(gc.base, pointers, CollectorRegistry())
    for partition in range(3):
        outcome = asyncio.run(compactor.partition(cfg, partition, force=True))
        pointer = pointers.read(topic, partition)
        assert outcome.result == "swapped" and pointer is not None and pointer.end >= 2, outcome
    asyncio.run(compactor.close())
    return topic, latest


def test_a_compacted_topic_of_three_partitions_keeps_each_key_in_one_partition_with_its_latest_value(
        gc: GovernedCluster, placed: tuple[str, dict[bytes, bytes]]) -> None:
    topic, latest = placed
    seen: dict[bytes, tuple[int, bytes | None]] = {}
    for partition in range(3):
        got = _kafka_read(gc, topic, 0, partition)
        assert [o for o, _, _ in got] == sorted({o for o, _, _ in got})
        for _, key, value in got:
            assert key not in seen, f"{key!r} in partitions {seen[key][0]} and {partition}"
            seen[key] = (partition, value)
    assert {k: v for k, (_, v) in seen.items()} == latest          # one record per live key, k1 gone
    assert all(p == key_partition(k, 3) for k, (p, _) in seen.items())   # where Kafka's partitioner puts it

    with Consumer(gc.config(), topic, group_id=f"m-{uuid.uuid4().hex[:6]}",
                  pointers=ManifestPointers(gc.registry)) as consumer:
        records = []
        deadline = time.monotonic() + 60
        while len(records) < len(latest) and time.monotonic() < deadline:
            records += consumer.poll(1.0)
        records += consumer.poll(1.0)
    got = sorted((r.key, r.partition, r.value) for r in records)
    want = sorted((k, key_partition(k, 3), v) for k, v in latest.items())
    assert got == want, (len(got), len(want), sorted(set(got) - set(want)), sorted(set(want) - set(got)))

    admin = AdminClient({"bootstrap.servers": _bootstrap(gc)})
    with pytest.raises(Exception, match="compacted: its read_partitions do not grow"):
        admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
    assert gc.registry.topic(topic).read_partitions == 3


def test_memq_producer_deletes_a_key_a_kafka_reader_sees_null_and_compaction_drops_it(
        gc: GovernedCluster, placed: tuple[str, dict[bytes, bytes]]) -> None:
    """A tombstone from memq's Producer (`delete`): read as deleted by key, as a null value by
    a Kafka consumer and memq's Consumer, and gone after compaction past delete.retention.ms."""
    topic, latest = placed
    key = b"k4"
    partition = key_partition(key, 3)
    end = _kafka_read(gc, topic, 0, partition)[-1][0] + 1

    async def delete() -> None:
        async with Producer(dataclasses.replace(gc.config().producer, codec="zstd")) as p:
            d = await (await p.delete(topic, key))
            assert d.partition == partition                              # placed by key, as its values
            with pytest.raises(InvalidInputError, match="not compacted"):
                await p.delete(plain, key)
    plain = f"plain-{uuid.uuid4().hex[:6]}"
    gc.create_topic(TopicConfig(plain, read_partitions=1))
    asyncio.run(delete())
    assert [(k, v) for _, k, v in _kafka_read(gc, topic, end, partition)] == [(key, None)]
    pointers = ManifestPointers(gc.registry)
    with Consumer(gc.config(), topic, subscribe=False, pointers=pointers) as consumer:
        got = consumer.get(key)
        assert got is not None and got.deleted
    time.sleep(0.6)                                                      # past delete.retention.ms (500)
    compactor = Compactor(gc.base, pointers, CollectorRegistry())
    assert asyncio.run(compactor.partition(gc.registry.topic(topic), partition, force=True)).result == "swapped"
    asyncio.run(compactor.close())
    survivors = {k for _, k, _ in _kafka_read(gc, topic, 0, partition)}
    assert key not in survivors and survivors == {k for k in latest if key_partition(k, 3) == partition} - {key}
