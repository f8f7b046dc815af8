"""The Spark source's driver-side planning (`NotificationLog`, the readers' `partitions()`),
without Spark: the batch objects a read covers, on a real Kafka (tansu) and on an in-process
notification topic whose first notifications expired."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from tests.support.spark import connection

import spark_source.datasource
from memq.client.consumer import notification_topic
from memq.config import MemqConfig
from memq.devcluster import DevCluster
from memq.errors import DataLossError, UnknownTopicError
from memq.format import NOTIFICATION_VERSION, Notification
from memq.notify import NotificationPublisher, NotificationRecord, TopicAdmin
from spark_source import SCHEMA
from spark_source.datasource import MemqDataSource, MemqStreamReader
from spark_source.options import SourceOptions
from spark_source.plan import MemqPartition, NotificationLog

PARTITIONS = 3


def note(topic: str, i: int) -> Notification:
    return Notification(v=NOTIFICATION_VERSION, topic=topic, bucket="memq", key=f"k/{i:06d}", size=100 + i,
                        header_size=10, message_count=1, logmessage_count=1, min_timestamp_ms=1_000 + i,
                        max_timestamp_ms=1_000 + i, crc32c=0, broker_id="b", attempt=0, created_ms=1_000 + i)


def planned(parts: Iterable[MemqPartition]) -> set[tuple[int | None, int | None]]:
    return {(r.partition, r.offset) for p in parts for r in p.refs}


def stream(options: Mapping[str, str]) -> MemqStreamReader:
    reader = MemqDataSource(dict(options)).streamReader(SCHEMA)
    assert isinstance(reader, MemqStreamReader)
    return reader


# --- on Kafka ----------------------------------------------------------------------------


@pytest.mark.integration
def test_the_plan_reaches_the_last_notification_of_a_shared_record_batch(devcluster: DevCluster,
                                                                        unique_name) -> None:
    """Notifications published together share Kafka record batches, and tansu 0.6 answers
    "latest" with the last batch's first offset + 1: the plan must still end at the true end."""
    config: MemqConfig = devcluster.config(cluster="plantest")
    topic = unique_name("plan")
    kafka_topic = notification_topic(config, topic)
    TopicAdmin(config.kafka).create_topic(kafka_topic, PARTITIONS)

    async def publish() -> list[tuple[int, int] | Exception]:
        publisher = NotificationPublisher(config.kafka, client_id="plan-test", linger_ms=50)
        try:
            return list(await publisher.publish_many([(kafka_topic, note(topic, i)) for i in range(60)]))
        finally:
            publisher.close()

    placed = asyncio.run(publish())
    assert all(isinstance(p, tuple) for p in placed)
    ends = {p: 1 + max(o for q, o in placed if q == p) for p in range(PARTITIONS)}  # type: ignore[misc]
    options = {**connection(config), "topic": topic}

    assert planned(MemqDataSource(options).reader(SCHEMA).partitions()) == set(placed)
    upto = {str(p): end - 1 for p, end in ends.items()}          # all but the last of each partition
    assert planned(MemqDataSource({**options, "endingOffsets": json.dumps(upto)}).reader(SCHEMA).partitions()) \
        == {(p, o) for p, o in placed if o < ends[p] - 1}        # type: ignore[misc]

    reader = stream({**options, "startingOffsets": "earliest"})
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        assert start == {str(p): 0 for p in ends} and end == {str(p): e for p, e in ends.items()}
        assert planned(reader.partitions(start, end)) == set(placed)
        capped = reader.latestOffset(start, ReadMaxRows(10))
        assert sum(capped.values()) == 10
        assert planned(reader.partitions(capped, end)) == {(p, o) for p, o in placed if o >= capped[str(p)]}  # type: ignore[misc]
        assert reader.reportLatestOffset() == end
    finally:
        reader.stop()

    missing = unique_name("missing")
    with pytest.raises(UnknownTopicError, match=missing):
        MemqDataSource({**options, "topic": missing}).reader(SCHEMA).partitions()
    assert notification_topic(config, missing) not in TopicAdmin(config.kafka).list_topics()  # not created by asking


# --- an in-process notification topic ----------------------------------------------------


class ExpiredTopic:
    """What `NotificationLog` asks of a NotificationConsumer, over partitions of `sizes[p]`
    notifications whose first `low[p]` expired; "latest" answers as tansu 0.6 does when all of a
    partition's notifications share one record batch (1, its first offset + 1)."""

    def __init__(self, topic: str, sizes: Mapping[int, int], low: Mapping[int, int]) -> None:
        self.records = {p: [NotificationRecord(p, o, 0, note(topic, 100 * p + o)) for o in range(n)]
                        for p, n in sizes.items()}
        self.low = dict(low)
        self.at: dict[int, int] = {}
        self.ends: dict[int, int] = {}

    def partitions(self) -> list[int]:
        return sorted(self.records)

    def list_offsets(self, partitions: Iterable[int], *, latest: bool = False) -> dict[int, int]:
        return {p: min(self.low[p] + 1, len(self.records[p])) if latest else self.low[p] for p in partitions}

    def assign(self, offsets: Mapping[int, int]) -> None:
        assert all(o >= self.low[p] for p, o in offsets.items()), "fetched expired notifications"
        self.at, self.ends = dict(offsets), {}

    def unassign(self) -> None:
        self.at, self.ends = {}, {}

    def poll(self, timeout_s: float, max_records: int = 500) -> list[NotificationRecord]:
        out = []
        for p, at in self.at.items():
            got = self.records[p][at:at + max_records - len(out)]
            out += got
            self.at[p] = at + len(got)
            if self.at[p] == len(self.records[p]):
                self.ends.setdefault(p, self.at[p])
        return out

    def ends_reached(self) -> dict[int, int]:
        return dict(self.ends)

    def position(self, partitions: Iterable[int]) -> dict[int, int | None]:
        return {p: self.at.get(p) for p in partitions}

    def close(self) -> None:
        pass


@pytest.fixture
def expired(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Options of topic "t": partition 0 holds notifications 0..9 of which 0..3 expired,
    partition 1 holds 0..4, none expired."""
    fake = ExpiredTopic("t", {0: 10, 1: 5}, {0: 4, 1: 0})

    def log(opts: SourceOptions) -> NotificationLog:
        return NotificationLog(opts, fake)  # type: ignore[arg-type]

    monkeypatch.setattr(spark_source.datasource, "NotificationLog", log)
    return {"topic": "t", "kafka.bootstrap.servers": "127.0.0.1:1", "s3.accessKeyId": "a", "s3.secretAccessKey": "b"}


def test_an_expired_start_fails_or_is_skipped_by_failOnDataLoss(expired: dict[str, str]) -> None:
    everything = {(0, o) for o in range(4, 10)} | {(1, o) for o in range(5)}
    assert planned(MemqDataSource(expired).reader(SCHEMA).partitions()) == everything   # earliest: no loss

    start = {**expired, "startingOffsets": '{"0": 1, "1": 2}'}
    with pytest.raises(DataLossError, match="notifications 1..3 of partition 0 expired"):
        MemqDataSource(start).reader(SCHEMA).partitions()
    with pytest.raises(DataLossError):     # ending before the first retained one is still a loss
        MemqDataSource({**start, "endingOffsets": '{"0": 3}'}).reader(SCHEMA).partitions()
    skipped = MemqDataSource({**start, "failOnDataLoss": "false"}).reader(SCHEMA).partitions()
    assert planned(skipped) == {(0, o) for o in range(4, 10)} | {(1, o) for o in range(2, 5)}

    with pytest.raises(DataLossError, match="partition 0"):
        stream(expired).partitions({"0": 1, "1": 0}, {"0": 8, "1": 5})
    reader = stream({**expired, "failOnDataLoss": "false"})
    assert planned(reader.partitions({"0": 1, "1": 0}, {"0": 8, "1": 5})) == \
        {(0, o) for o in range(4, 8)} | {(1, o) for o in range(5)}
    assert reader.latestOffset({"0": 1}, ReadAllAvailable()) == {"0": 10, "1": 5}   # a new partition: from its low
