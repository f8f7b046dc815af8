"""Consumer against the real dev cluster, on batches written directly (format + storage +
notify), so each test controls exactly which batch holds which Message.

The produce path through brokers, the 200k-message group test and the restart test are in
test_consumer_group.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

import boto3
import pytest
from tests.support.cluster import drain, records, write_batches

from memq.client.consumer import Consumer, ConsumerRecord, notification_topic
from memq.config import ConsumerConfig, MemqConfig
from memq.devcluster import DevCluster
from memq.errors import DataLossError
from memq.format import (LogMessage)
from memq.notify import TopicAdmin
from memq.storage import ObjectLocation

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]




@pytest.fixture
def topic(devcluster: DevCluster, unique_name: Callable[[str], str]) -> Callable[[int], tuple[MemqConfig, str]]:
    """`topic(partitions)` -> (config, name) of a fresh topic whose notification topic exists."""

    def make(partitions: int = 1, **consumer: object) -> tuple[MemqConfig, str]:
        config = devcluster.config()
        config = dataclasses.replace(config, consumer=ConsumerConfig(
            group_id=unique_name("g"), **consumer))  # type: ignore[arg-type]
        name = unique_name("c")
        TopicAdmin(config.kafka).create_topic(notification_topic(config, name), partitions)
        return config, name

    return make


def as_log(r: ConsumerRecord) -> LogMessage:
    return LogMessage(r.value, r.key, r.headers, r.timestamp_ms, r.message_id)


def test_reads_every_field_and_position_in_order(topic) -> None:
    config, name = topic(1)
    written = write_batches(config, name, [
        [(11, 1, 0, records(5, "a")), (11, 1, 1, records(3, "b"))],
        [(12, 0, 7, records(4, "c"))],
    ])
    with Consumer(config, name) as c:
        got = drain(c, 12)
        assert list(c.poll(0.3)) == []
    assert [as_log(r) for r in got] == written[0].records + written[1].records
    assert [(r.partition, r.offset, r.index) for r in got] == (
        [(0, written[0].offset, i) for i in range(8)] + [(0, written[1].offset, i) for i in range(4)])
    assert [(r.producer_id, r.epoch, r.sequence) for r in got[:8]] == [(11, 1, 0)] * 5 + [(11, 1, 1)] * 3
    assert {r.location for r in got[8:]} == {written[1].location}
    assert all(r.topic == name for r in got)


def test_commit_only_after_the_whole_batch_was_handed_over(topic) -> None:
    config, name = topic(1)
    written = write_batches(config, name, [[(1, 0, s, records(10, f"m{s}"))] for s in range(3)])
    with Consumer(config, name) as c:
        first = list(c.poll(10))
        assert len(first) == 10
        it = c.poll(10)
        partial = [next(it) for _ in range(4)]   # then abandoned
        assert c.commit() == {0: written[0].offset + 1}
        rest = list(c.poll(10))                  # resumes the abandoned batch
        assert [as_log(r) for r in partial + rest] == written[1].records
        assert c.position() == {0: written[2].offset}
        assert c.commit() == {0: written[1].offset + 1}
        assert c.committed() == {0: written[1].offset + 1}
    # a new member of the group starts at the committed position
    with Consumer(config, name) as c2:
        assert [as_log(r) for r in drain(c2, 10)] == written[2].records


def test_seek_variants_and_position(topic) -> None:
    config, name = topic(1)
    written = write_batches(config, name, [[(1, 0, s, records(2, f"s{s}"))] for s in range(4)])
    with Consumer(config, name) as c:
        drain(c, 8)
        c.seek_to_beginning()
        assert [as_log(r) for r in drain(c, 2)] == written[0].records
        c.seek(0, written[2].offset)
        assert c.position() == {0: written[2].offset}
        assert [as_log(r) for r in drain(c, 2)] == written[2].records
        c.seek_to_end()
        assert list(c.poll(0.5)) == []


def test_seek_to_timestamp_lands_on_the_right_batch(topic) -> None:
    config, name = topic(1)
    written = write_batches(config, name, [[(1, 0, s, records(3, f"t{s}"))] for s in range(5)], gap_s=0.05)
    with Consumer(config, name) as c:
        drain(c, 15)
        target = written[3]
        assert c.seek_to_timestamp(target.published_ms - 20) == {0: target.offset}
        got = drain(c, 3)
        assert {r.offset for r in got} == {target.offset}
        assert [as_log(r) for r in got] == target.records
        # after the last batch: nothing left to read
        assert c.seek_to_timestamp(int(time.time() * 1000) + 60_000) == {0: written[-1].offset + 1}
        assert list(c.poll(0.5)) == []


def test_random_access_returns_the_exact_message(topic) -> None:
    config, name = topic(1)
    written = write_batches(config, name, [
        [(5, 0, 0, records(7, "x")), (5, 0, 1, records(9, "y")), (6, 2, 4, records(1, "z"))]])
    w = written[0]
    with Consumer(config, name) as c:
        for index in (0, 6, 7, 15, 16):
            r = c.read(w.partition, w.offset, index)
            assert as_log(r) == w.records[index]
            assert (r.partition, r.offset, r.index, r.location) == (w.partition, w.offset, index, w.location)
        assert (c.read(0, w.offset, 16).producer_id, c.read(0, w.offset, 16).epoch) == (6, 2)
        assert c.assignment() == [] or c.position() == {}   # reading did not move this consumer


def _overwrite(devcluster: DevCluster, loc: ObjectLocation, data: bytes) -> None:
    s3 = boto3.client("s3", endpoint_url=devcluster.s3_endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.put_object(Bucket=loc.bucket, Key=loc.key, Body=data)


def test_corrupt_batch_raises_data_loss_naming_it(topic, devcluster) -> None:
    config, name = topic(1)
    written = write_batches(config, name, [[(1, 0, s, records(4, f"d{s}"))] for s in range(3)])
    _overwrite(devcluster, written[1].location, b"garbage" * 50)
    with Consumer(config, name) as c:
        assert [as_log(r) for r in drain(c, 4)] == written[0].records
        for _ in range(2):   # it stays raised: never garbage, never a silent skip
            with pytest.raises(DataLossError) as e:
                list(c.poll(10))
            assert written[1].location.key in str(e.value)
            assert (e.value.partition, e.value.offset, e.value.location) == (0, written[1].offset,
                                                                              written[1].location.key)
        c.seek(0, written[1].offset + 1)     # the application decides to move on
        assert [as_log(r) for r in drain(c, 4)] == written[2].records


def test_missing_batch_is_skipped_and_counted_when_asked(topic, devcluster) -> None:
    config, name = topic(1, on_data_loss="skip")
    written = write_batches(config, name, [[(1, 0, s, records(4, f"k{s}"))] for s in range(3)])
    s3 = boto3.client("s3", endpoint_url=devcluster.s3_endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.delete_object(Bucket=written[1].location.bucket, Key=written[1].location.key)
    with Consumer(config, name) as c:
        got = drain(c, 8)
        assert [as_log(r) for r in got] == written[0].records + written[2].records
        assert c.metrics.data_loss_skipped == 1
        assert c.commit() == {0: written[2].offset + 1}


def test_retried_messages_are_dropped_by_default(topic) -> None:
    config, name = topic(1)
    retried = records(6, "r")
    write_batches(config, name, [[(9, 1, 0, records(2, "p")), (9, 1, 1, retried)],
                                 [(9, 1, 1, retried), (9, 1, 2, records(2, "q"))]])
    with Consumer(config, name) as c:
        got = drain(c, 10)
        assert list(c.poll(0.5)) == []
        assert (c.metrics.duplicates_dropped, c.metrics.duplicate_messages) == (6, 1)
    assert [r.sequence for r in got] == [0] * 2 + [1] * 6 + [2] * 2
    off = dataclasses.replace(config, consumer=dataclasses.replace(config.consumer, dedup=False, group_id="nodedup-" + name))
    with Consumer(off, name) as c:
        assert len(drain(c, 16)) == 16


def test_small_prefetch_budget_still_reads_everything_in_order(topic) -> None:
    config, name = topic(2, prefetch_bytes=1, fetch_concurrency=1)
    written = write_batches(config, name, [[(1, 0, s, records(50, f"b{s}"))] for s in range(8)])
    with Consumer(config, name) as c:
        got: list[ConsumerRecord] = []
        largest = 0
        while len(got) < 400:
            batch = c.poll(1.0)
            largest = max(largest, c.buffered_bytes)    # the batch in hand, nothing ahead
            got.extend(batch)
        assert 0 < largest <= 2 * max(len(r.value) + 200 for r in got) * 50   # one batch, not eight
        assert c.buffered_bytes == 0
    for p in (0, 1):
        expect = [r for w in written if w.partition == p for r in w.records]
        assert [as_log(r) for r in got if r.partition == p] == expect


def test_async_iteration_and_audit_sink(topic) -> None:
    config, name = topic(1)
    written = write_batches(config, name, [[(3, 0, 0, records(4, "u")), (3, 0, 1, records(2, "v"))]])
    calls: list[dict] = []

    class Sink:
        def consumed(self, **kw: object) -> None:
            calls.append(kw)

    async def read() -> list[ConsumerRecord]:
        out = []
        with Consumer(config, name, audit=Sink()) as c:
            async for r in c:
                out.append(r)
                if len(out) == 3:
                    assert calls == []           # Message 0 (4 records) not handed over yet
                if len(out) == 6:
                    break
            assert c.commit() == {0: written[0].offset + 1}   # the last record completed the batch
        return out

    got = asyncio.run(asyncio.wait_for(read(), 30))
    assert [as_log(r) for r in got] == written[0].records
    assert [(k["producer_id"], k["sequence"], k["count"]) for k in calls] == [(3, 0, 4), (3, 1, 2)]
    assert calls[0]["group"] == config.consumer.group_id and calls[0]["topic"] == name


def test_poll_honours_its_timeout_on_an_empty_topic(topic) -> None:
    config, name = topic(1)
    with Consumer(config, name) as c:
        list(c.poll(2))                 # joins the group
        t0 = time.monotonic()
        assert list(c.poll(0.3)) == []
        assert 0.25 <= time.monotonic() - t0 < 2
