"""DeleteRecords and the log start it moves, at the Kafka door with an in-memory core (no servers):
the checks and answers of `doors.kafka_admin_records`, and how `doors.kafka_fetch` reads past a
log start that lies inside a part."""

from __future__ import annotations

import dataclasses

import pytest
from tests.support.kafka_read import note, part_of, read_placed, recs

from memq.broker.doors import kafka_admin_records, kafka_fetch
from memq.broker.guard import Guard
from memq.broker.bases import Bases, MemoryCheckpoints
from memq.broker.logs import Logs
from memq.broker.metrics import BrokerMetrics
from memq.config import SecurityConfig
from memq.format import Notification
from memq.format.metadata import ClusterMetadata, StorageMetadata, TopicMetadata
from memq.kafka_api.offsets import end_offset, first_offset, kafka_offset
from memq.kafka_api.protocol import EARLIEST, ErrorCode, FetchPartition, FetchRequest, ListOffsetsRequest
from memq.kafka_api.records import FramedPart, frame_part
from memq.notify.consumer import NotificationRecord
from memq.security.tokens import hash_token

SIZES = (4, 6, 3)   # records of the partition's three parts
HIGH = end_offset(2, 3)


class Reads:
    """One partition of three parts, in memory."""

    def __init__(self) -> None:
        self.announced = [note(i, n) for i, n in enumerate(SIZES)]
        self.parts = {n.notification.key: frame_part(part_of([("memq", recs(f"p{n.offset}-", c))]))
                      for n, c in zip(self.announced, SIZES)}

    async def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        return 0, len(self.announced)

    def watermarks_seen(self, topic: str, partition: int) -> tuple[int, int]:
        return 0, len(self.announced)

    def last_seen(self, topic: str, partition: int) -> NotificationRecord:
        return self.announced[-1]

    async def notes(self, topic: str, partition: int, offset: int, wait_s: float) -> list[NotificationRecord]:
        return [n for n in self.announced if n.offset >= offset]

    async def end(self, topic: str, partition: int, last: NotificationRecord) -> tuple[int, int]:
        return last.offset, last.notification.logmessage_count

    async def readable(self, topic: str, partition: int, n: NotificationRecord) -> FramedPart:
        return self.parts[n.notification.key]

    async def part(self, n: Notification) -> FramedPart:
        return self.parts[n.key]

    async def manifest(self, topic: str, partition: int) -> None:
        return None   # no compacted prefix: the partition log's plain tail alone


class Registry:
    def __init__(self, core: Core) -> None:
        self.core = core

    def move_log_starts(self, topic: str, wanted: dict[int, int]) -> dict[int, int]:
        current = dict(self.core.starts)
        current |= {p: max(o, current.get(p, 0)) for p, o in wanted.items()}
        self.core.starts = current   # the broker's metadata carries it at once here
        return current


@dataclasses.dataclass
class Admin:
    registry: Registry


@dataclasses.dataclass
class Core:
    guard: Guard
    zookeeper: bool = True
    starts: dict[int, int] = dataclasses.field(default_factory=dict)
    reads: Reads = dataclasses.field(default_factory=Reads)
    broker_id: str = "b1"

    @property
    def cluster_admin(self) -> Admin | None:
        return Admin(Registry(self)) if self.zookeeper else None

    @property
    def logs(self) -> Logs:
        return Logs(self.reads, Bases(self.reads, MemoryCheckpoints()))

    def metadata(self) -> ClusterMetadata:
        t = TopicMetadata("t", "memq.c.t", 1, log_start=tuple(sorted(self.starts.items())))
        return ClusterMetadata("c", "b1", "", StorageMetadata(), topics={"t": t})


def core(security: SecurityConfig | None = None, **kw: object) -> Core:
    return Core(Guard(security or SecurityConfig(), BrokerMetrics("b1").denials), **kw)  # type: ignore[arg-type]


async def delete(c: Core, *asked: tuple[int, int], topic: str = "t",
                 principal: str | None = None) -> list[tuple[int, int, ErrorCode]]:
    done = await kafka_admin_records.delete_records(c, principal, topic, list(asked), "peer")  # type: ignore[arg-type]
    return [(d.partition, d.low_watermark, d.error) for d in done]


async def test_delete_records_moves_the_start_forward_within_the_log() -> None:
    c = core()
    inside = kafka_offset(1, 2)
    assert await delete(c, (0, inside)) == [(0, inside, ErrorCode.NONE)]
    assert await delete(c, (0, first_offset(0))) == [(0, inside, ErrorCode.NONE)]   # never backwards
    assert await delete(c, (0, HIGH + 1)) == [(0, -1, ErrorCode.OFFSET_OUT_OF_RANGE)]
    assert await delete(c, (0, -5)) == [(0, -1, ErrorCode.OFFSET_OUT_OF_RANGE)]
    assert c.starts == {0: inside}
    assert await delete(c, (0, -1)) == [(0, HIGH, ErrorCode.NONE)]                   # -1: the high watermark


async def test_refusals_are_answers_per_partition() -> None:
    security = SecurityConfig(enabled=True, tokens=(f"alice:{hash_token('a')}", f"bob:{hash_token('b')}"),
                              acls=("allow alice admin literal:t", "allow bob consume literal:t"))
    c = core(security)
    assert await delete(c, (0, 5), principal="bob") == [(0, -1, ErrorCode.TOPIC_AUTHORIZATION_FAILED)]
    assert c.starts == {}
    assert await delete(c, (0, 5), (3, 5), principal="alice") == [
        (0, 5, ErrorCode.NONE), (3, -1, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]
    assert await delete(c, (0, 5), topic="nope", principal="alice") == [(0, -1, ErrorCode.TOPIC_AUTHORIZATION_FAILED)]
    assert await delete(core(), (0, 5), topic="nope") == [(0, -1, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]
    assert await delete(core(zookeeper=False), (0, 5)) == [(0, -1, ErrorCode.POLICY_VIOLATION)]


async def fetch(c: Core, offset: int) -> tuple[ErrorCode, int, list[int]]:
    req = FetchRequest(0, 1, 1 << 20, (("t", (FetchPartition(0, offset, 1 << 20),)),))
    [(_, [out])] = await kafka_fetch.fetch(c, None, req, "peer")  # type: ignore[arg-type]
    return out.error, out.log_start, [o for o, _ in read_placed(bytes(out.records))]


@pytest.mark.parametrize("cut", [kafka_offset(1, 2), first_offset(2)])
async def test_readers_see_nothing_before_the_log_start(cut: int) -> None:
    c = core(starts={0: cut})
    error, low, _ = await fetch(c, cut - 1)
    assert (error, low) == (ErrorCode.OFFSET_OUT_OF_RANGE, cut)
    error, low, offsets = await fetch(c, cut)
    assert error is ErrorCode.NONE and low == cut
    assert [o for o in offsets if o >= cut][0] == cut   # a client skips a batch's records before its offset
    [(_, [listed])] = await kafka_fetch.list_offsets(c, None, ListOffsetsRequest((("t", ((0, EARLIEST),)),)))  # type: ignore[arg-type]
    assert listed.offset == cut
