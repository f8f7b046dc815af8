"""DeleteRecords over memq's Kafka listener on a real governed cluster (moto S3, tansu, ZooKeeper,
two broker processes), on a topic with dense offsets: confluent-kafka's AdminClient moves a
partition's log start inside a part; Kafka readers (from earliest, behind it, ListOffsets) on
either broker (each counting the offsets itself, alike) and memq's own Consumer then see nothing
before it."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from tests.support.cluster import drain
from tests.support.kafka_clients import as_rows, kafka_produce, rows

from memq.client.cluster import fetch_metadata
from memq.client.consumer import Consumer as MemqConsumer
from memq.config import BrokerConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

N = 100
CHUNK = 25   # records per Produce (acks=all, one after the other): one part each
CUT = 37     # DeleteRecords to the offset of this record: inside the second part


@dataclasses.dataclass(frozen=True)
class Setup:
    gc: GovernedCluster
    topic: str
    listeners: tuple[str, ...]   # both brokers' Kafka listeners
    offsets: tuple[int, ...]     # the Kafka offset of each record produced, in order
    cut: int                     # the log start DeleteRecords answered


def read(c: Consumer, n: int, timeout_s: float = 30) -> list[tuple[int, tuple]]:
    """(offset, row) of the next `n` records; KafkaException on any consumer error."""
    got: list[tuple[int, tuple]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n:
        assert time.monotonic() < deadline, f"read {len(got)} of {n} records"
        for m in c.consume(n - len(got), 0.5):
            if m.error() is not None:
                if m.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(m.error())
                continue
            got.append((m.offset(), (m.value(), m.key(), tuple(m.headers() or ()), m.timestamp()[1])))
    return got


def consumer(address: str, **conf: object) -> Consumer:
    return Consumer({"bootstrap.servers": address, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                     "enable.auto.commit": False, "fetch.wait.max.ms": 100, **conf})


def delete_records(address: str, topic: str, offset: int) -> int:
    """DeleteRecords of partition 0 to `offset`: the low watermark answered (KafkaException if refused)."""
    admin = AdminClient({"bootstrap.servers": address})
    tp = TopicPartition(topic, 0, offset)
    result = admin.delete_records([tp], request_timeout=20, operation_timeout=20)[tp].result(30)
    return int(result.low_watermark)


@pytest.fixture(scope="module")
def setup(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    topic = f"dr-{uuid.uuid4().hex[:6]}"
    with GovernedCluster(tmp_path_factory.mktemp("dr"), brokers=2, servers=devcluster,
                         cluster=f"dr-{uuid.uuid4().hex[:6]}", broker=BrokerConfig(kafka_port=0)) as gc:
        gc.create_topic(TopicConfig(name=topic, read_partitions=1, batch_ms=50, offsets="dense"), brokers=2)
        listeners = tuple(sorted(b.kafka_address for b in fetch_metadata(gc.broker("b1").url, 10.0).brokers))
        sent = rows(N, "dr")
        for i in range(0, N, CHUNK):
            kafka_produce(listeners[0], topic, sent[i:i + CHUNK], acks="all")
        c = consumer(listeners[0])
        try:
            c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            got = read(c, N)
        finally:
            c.close()
        assert [r for _, r in got] == as_rows(sent)
        offsets = tuple(o for o, _ in got)
        cut = delete_records(listeners[0], topic, offsets[CUT])
        yield Setup(gc, topic, listeners, offsets, cut)


def test_delete_records_answers_the_new_log_start(setup: Setup) -> None:
    assert setup.offsets == tuple(range(N))   # dense: record numbers
    assert setup.cut == setup.offsets[CUT] == CUT and CUT % CHUNK, "the cut is inside a part (not at its first record)"


def test_readers_from_earliest_start_at_the_log_start_on_every_broker(setup: Setup) -> None:
    expected = as_rows(rows(N, "dr"))[CUT:]
    for address in setup.listeners:   # the log start is the same on every broker
        c = consumer(address)
        try:
            c.assign([TopicPartition(setup.topic, 0, OFFSET_BEGINNING)])
            got = read(c, N - CUT)
            low, _ = c.get_watermark_offsets(TopicPartition(setup.topic, 0), timeout=20)
        finally:
            c.close()
        assert got[0][0] == setup.cut and [r for _, r in got] == expected
        assert low == setup.cut
    admin = AdminClient({"bootstrap.servers": setup.listeners[1]})
    tp = TopicPartition(setup.topic, 0)
    assert admin.list_offsets({tp: OffsetSpec.earliest()}, request_timeout=20)[tp].result(30).offset == setup.cut


def test_a_reader_behind_the_log_start_is_out_of_range(setup: Setup) -> None:
    behind = TopicPartition(setup.topic, 0, setup.offsets[CUT - 1])   # the record just before the cut
    c = consumer(setup.listeners[1], **{"auto.offset.reset": "error"})
    try:
        c.assign([behind])
        with pytest.raises(KafkaException) as raised:
            read(c, 1)
    finally:
        c.close()
    assert raised.value.args[0].code() == KafkaError._AUTO_OFFSET_RESET
    c = consumer(setup.listeners[1], **{"auto.offset.reset": "earliest"})
    try:
        c.assign([behind])
        assert read(c, 1)[0][0] == setup.cut   # reset to the log start, not to the record asked
    finally:
        c.close()


def test_memq_consumer_from_the_beginning_reads_only_from_the_log_start(setup: Setup) -> None:
    config = setup.gc.config()
    config = dataclasses.replace(config, consumer=dataclasses.replace(config.consumer, auto_offset_reset="earliest"))
    with MemqConsumer(config, setup.topic, group_id=f"memq-{uuid.uuid4().hex[:6]}") as c:
        got = drain(c, N - CUT)
        assert [(r.value, r.key, r.headers, r.timestamp_ms) for r in got] == as_rows(rows(N, "dr"))[CUT:]
        assert c.metrics.expired == CUT // CHUNK   # the first part, wholly before the start, counts as expired


def test_delete_records_out_of_range_backwards_and_to_the_high_watermark(setup: Setup) -> None:
    address = setup.listeners[1]
    with pytest.raises(KafkaException) as raised:
        delete_records(address, setup.topic, setup.offsets[-1] + 2)   # past the high watermark
    assert raised.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE
    assert delete_records(address, setup.topic, setup.offsets[0]) == setup.cut   # never backwards
    # -1: up to the high watermark (the last test of the module: nothing is left to read)
    high = delete_records(address, setup.topic, -1)
    assert high == setup.offsets[-1] + 1
    c = consumer(address)
    try:
        assert c.get_watermark_offsets(TopicPartition(setup.topic, 0), timeout=20) == (high, high)
    finally:
        c.close()
