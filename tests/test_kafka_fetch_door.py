"""The Kafka door's Fetch (memq.broker.doors.kafka_fetch) over a fake core: limits, holes, ACLs,
long polls, without servers."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from tests.support.kafka_read import note

from memq.broker.guard import Guard
from memq.broker.bases import Bases, MemoryCheckpoints
from memq.broker.logs import Logs
from memq.broker.metrics import BrokerMetrics
from memq.broker.doors import kafka_fetch
from memq.config import SecurityConfig
from memq.format import LogMessage, Notification
from memq.format.metadata import BrokerMetadata, ClusterMetadata, StorageMetadata, TopicMetadata
from memq.kafka_api.mapping import node_id
from memq.kafka_api.offsets import first_offset, kafka_offset
from memq.errors import OffsetOutOfRangeError
from memq.kafka_api.protocol import EARLIEST, LATEST, ErrorCode, FetchPartition, FetchRequest, ListOffsetsRequest
from memq.kafka_api.records import FramedPart, frame_part
from memq.format.kafka_records import KafkaCodec, split_kafka_batches, verify_kafka_batch
from memq.notify.consumer import NotificationRecord
from memq.security.tokens import hash_token
from tests.support.kafka_read import part_of, read_placed, recs


class FakeReads:
    """One partition's notifications and parts, in memory; new ones can arrive."""

    def __init__(self, parts: list[list[tuple[str, list[LogMessage]]]]) -> None:
        self.low = 0   # notifications before it expired (retention)
        self.announced: list[NotificationRecord] = []
        self.parts: dict[str, FramedPart] = {}
        self.arrived = asyncio.Event()
        for p in parts:
            self.add(p)

    def add(self, groups: list[tuple[str, list[LogMessage]]]) -> None:
        n = note(len(self.announced), sum(len(r) for _, r in groups))
        self.parts[n.notification.key] = frame_part(part_of(groups))
        self.announced.append(n)
        self.arrived.set()

    async def notes_from(self, offset: int, wait_s: float) -> list[NotificationRecord]:
        self.arrived.clear()
        if not [n for n in self.announced if n.offset >= offset]:
            try:
                await asyncio.wait_for(self.arrived.wait(), wait_s)
            except TimeoutError:
                pass
        return [n for n in self.announced if n.offset >= offset]

    async def notes(self, topic: str, partition: int, offset: int, wait_s: float) -> list[NotificationRecord]:
        if not self.low <= offset <= len(self.announced):   # as the tail's consumer (auto.offset.reset=error)
            raise OffsetOutOfRangeError("out of range", topic=topic, partition=partition, offset=offset, oldest=self.low)
        return await self.notes_from(offset, wait_s)

    def watermarks_seen(self, topic: str, partition: int) -> tuple[int, int]:
        return self.low, len(self.announced)

    async def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        return self.watermarks_seen(topic, partition)

    async def offsets_for_time(self, topic: str, ts_ms: int) -> dict[int, int]:
        """The first notification whose part's records start at or after `ts_ms` (a stand-in
        for publish times), or the end."""
        after = [n.offset for n in self.announced if n.offset >= self.low and n.notification.min_timestamp_ms >= ts_ms]
        return {0: after[0] if after else len(self.announced)}

    def last_seen(self, topic: str, partition: int) -> NotificationRecord | None:
        return self.announced[-1] if self.announced else None

    async def end(self, topic: str, partition: int, last: NotificationRecord) -> tuple[int, int]:
        return last.offset, last.notification.logmessage_count   # no dropped copies here

    async def part(self, n: Notification) -> FramedPart:
        return self.parts[n.key]

    async def readable(self, topic: str, partition: int, n: NotificationRecord) -> FramedPart:
        return self.parts[n.notification.key]

    async def manifest(self, topic: str, partition: int) -> None:
        return None   # no compacted prefix: the partition log's plain tail alone


@dataclasses.dataclass
class FakeCore:
    reads: FakeReads
    guard: Guard
    broker_id: str = "b1"
    brokers: tuple[BrokerMetadata, ...] = ()

    @property
    def logs(self) -> Logs:
        return Logs(self.reads, Bases(self.reads, MemoryCheckpoints()))

    def metadata(self) -> ClusterMetadata:
        return ClusterMetadata(cluster="c", broker_id="b1", kafka_bootstrap_servers="", storage=StorageMetadata(),
                               brokers=self.brokers, topics={"t": TopicMetadata("t", "memq.c.t", 1)})


def core(parts: list[list[tuple[str, list[LogMessage]]]], security: SecurityConfig | None = None) -> FakeCore:
    return FakeCore(FakeReads(parts), Guard(security or SecurityConfig(), BrokerMetrics("b1").denials))


async def fetch(c: FakeCore, offset: int, *, limit: int = 1 << 20, wait_ms: int = 0,
                principal: str | None = None) -> tuple[ErrorCode, int, list[tuple[int, LogMessage]]]:
    req = FetchRequest(wait_ms, 1, 1 << 20, (("t", (FetchPartition(0, offset, limit),)),))
    [(_, [out])] = await kafka_fetch.fetch(c, principal, req, "peer")  # type: ignore[arg-type]
    return out.error, out.high_watermark, read_placed(bytes(out.records))


async def test_limits_split_parts_without_holes_and_an_oversized_batch_still_goes() -> None:
    small, big, after = recs("s", 3), [r._replace(value=r.value * 50) for r in recs("b", 20)], recs("n", 3)
    c = core([[("kafka", small), ("kafka", big)], [("kafka", after)]])
    small_bytes = len(c.reads.parts["k0"].batches[0].data)
    got: list[tuple[int, LogMessage]] = []
    offset = 0
    for _ in range(10):
        error, high, placed = await fetch(c, offset, limit=small_bytes * 2)
        assert error is ErrorCode.NONE and high == kafka_offset(1, 2) + 1   # just after the last record
        if not placed:
            break
        assert placed[0][0] >= offset
        got += [(o, r) for o, r in placed if o >= offset]   # a client skips what is before its offset
        offset = got[-1][0] + 1
    # the big batch did not fit after the small one, so the next part's did not go ahead of it
    assert [r for _, r in got] == small + big + after
    assert [o for o, _ in got] == [kafka_offset(0, i) for i in range(23)] + [kafka_offset(1, i) for i in range(3)]


async def test_a_fetch_at_the_end_waits_for_the_next_part_then_answers_at_once() -> None:
    c = core([[("memq", recs("a", 2))]])
    loop = asyncio.get_running_loop()
    loop.call_later(0.2, c.reads.add, [("memq", recs("b", 2))])
    t0 = time.monotonic()
    error, _, placed = await fetch(c, first_offset(1), wait_ms=5_000)
    assert error is ErrorCode.NONE and [r for _, r in placed] == recs("b", 2)
    assert 0.15 <= time.monotonic() - t0 < 2.0
    t0 = time.monotonic()
    assert (await fetch(c, first_offset(2), wait_ms=300))[2] == []     # nothing came: answered empty after the wait
    assert 0.25 <= time.monotonic() - t0 < 2.0


async def test_reading_needs_the_consume_acl_and_bad_places_are_refused() -> None:
    security = SecurityConfig(enabled=True, tokens=(f"alice:{hash_token('a')}", f"bob:{hash_token('b')}"),
                              acls=("allow alice consume literal:t", "allow bob produce literal:t"))
    c = core([[("memq", recs("a", 2))]], security)
    assert (await fetch(c, 0, principal="alice"))[0] is ErrorCode.NONE
    error, _, placed = await fetch(c, 0, principal="bob")
    assert error is ErrorCode.TOPIC_AUTHORIZATION_FAILED and placed == []
    assert (await fetch(c, -1, principal="alice"))[0] is ErrorCode.OFFSET_OUT_OF_RANGE


@pytest.mark.parametrize("topic,partition", [("nope", 0), ("t", 1)])
async def test_unknown_topics_and_partitions_are_refused(topic: str, partition: int) -> None:
    c = core([])
    req = FetchRequest(0, 1, 1 << 20, ((topic, (FetchPartition(partition, 0, 100),)),))
    [(_, [out])] = await kafka_fetch.fetch(c, None, req, "peer")  # type: ignore[arg-type]
    assert out.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_a_client_in_another_rack_is_sent_to_a_broker_of_its_rack() -> None:
    c = core([[("memq", recs("a", 2))]])
    c.brokers = (BrokerMetadata("b1", "http://h:1", "rack-a", kafka_address="h:9001"),
                 BrokerMetadata("b2", "http://h:2", "rack-b", kafka_address="h:9002"))

    async def one(rack: str) -> tuple[int, list[tuple[int, LogMessage]]]:
        req = FetchRequest(0, 1, 1 << 20, (("t", (FetchPartition(0, 0, 1 << 20),)),), rack)
        [(_, [out])] = await kafka_fetch.fetch(c, None, req, "peer")  # type: ignore[arg-type]
        return out.preferred_replica, read_placed(bytes(out.records))

    assert await one("rack-b") == (node_id("b2"), [])                  # redirected, nothing read here
    for rack in ("rack-a", "", "rack-z"):                               # its own rack, none said, none near
        replica, placed = await one(rack)
        assert replica == -1 and [r for _, r in placed] == recs("a", 2)


async def test_retention_moves_the_log_start_and_a_reader_behind_it_is_out_of_range() -> None:
    c = core([[("memq", recs("a", 2))], [("memq", recs("b", 3))], [("memq", recs("c", 1))]])
    c.reads.low = 1   # the first notification expired
    error, high, placed = await fetch(c, kafka_offset(0, 1))
    assert error is ErrorCode.OFFSET_OUT_OF_RANGE and placed == []
    assert (await fetch(c, first_offset(4)))[0] is ErrorCode.OFFSET_OUT_OF_RANGE    # past the end, too
    req = FetchRequest(0, 1, 1 << 20, (("t", (FetchPartition(0, first_offset(1), 1 << 20),)),))
    [(_, [out])] = await kafka_fetch.fetch(c, None, req, "peer")  # type: ignore[arg-type]
    assert out.log_start == first_offset(1) and out.high_watermark == kafka_offset(2, 0) + 1
    assert [r for _, r in read_placed(bytes(out.records))] == recs("b", 3) + recs("c", 1)


async def test_list_offsets_earliest_latest_and_by_time() -> None:
    c = core([[("memq", recs("a", 2))], [("memq", recs("b", 3))], [("memq", recs("c", 1))]])
    c.reads.low = 1
    req = ListOffsetsRequest((("t", ((0, EARLIEST), (0, LATEST), (0, 1500), (0, 999_999))),
                              ("nope", ((0, LATEST),))))
    [(_, listed), (_, [unknown])] = await kafka_fetch.list_offsets(c, None, req)  # type: ignore[arg-type]
    assert [(x.error, x.offset) for x in listed] == [
        (ErrorCode.NONE, first_offset(1)),          # the log start
        (ErrorCode.NONE, kafka_offset(2, 0) + 1),   # just after the last record, as a Fetch's high watermark
        (ErrorCode.NONE, first_offset(2)),          # the first part from that time on
        (ErrorCode.NONE, -1)]                       # none that late: -1, as Kafka answers
    assert listed[2].timestamp == 1500 and unknown.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_a_fetch_before_v10_gets_memq_records_uncompressed() -> None:
    a = [r._replace(value=b"same words again %d" % (i % 3)) for i, r in enumerate(recs("z", 200))]
    c = core([[("memq", a)]])
    codecs = {}
    for zstd in (True, False):
        req = FetchRequest(0, 1, 1 << 20, (("t", (FetchPartition(0, 0, 1 << 20),)),), zstd=zstd)
        [(_, [out])] = await kafka_fetch.fetch(c, None, req, "peer")  # type: ignore[arg-type]
        codecs[zstd] = [verify_kafka_batch(b).codec for b in split_kafka_batches(bytes(out.records))]
        assert [r for _, r in read_placed(bytes(out.records))] == a
    assert codecs == {True: [KafkaCodec.ZSTD], False: [KafkaCodec.NONE]}
