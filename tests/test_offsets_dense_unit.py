"""Dense offsets (`memq.kafka_api.dense`), without I/O: a running count over the notification log,
checkpoints that spare a cold reader the scan from 0, the partition log model over them, and the
broker's counting (`memq.broker.bases`) over a notification log in memory."""

from __future__ import annotations

import dataclasses
from typing import cast

import pytest
from prometheus_client import CollectorRegistry

from tests.support.kafka_read import note

from memq.broker.bases import Bases, Counting, MemoryCheckpoints
from memq.compaction.manifest import Manifest, ManifestPointers
from memq.compaction.run import CompactionReads, Compactor, Store
from memq.config import MemqConfig, TopicConfig
from memq.errors import CorruptDataError, InvalidInputError, OffsetUnknownError
from memq.format.metadata import TopicMetadata
from memq.kafka_api.dense import (CHECKPOINT_EVERY, CHECKPOINTS_KEPT, Checkpoint, DenseScheme, PartitionBases,
                            decode_checkpoints, encode_checkpoints, kept, nearest)
from memq.log.model import SPARSE, PartitionLog, moved_start, stored_start
from memq.notify.consumer import NotificationRecord

COUNTS = [3, 0, 5, 1, 4]     # notifications 0-4; notification 1 holds no record


def _scheme(counts: list[int] = COUNTS, at: Checkpoint = Checkpoint(0, 0)) -> DenseScheme:
    bases = PartitionBases(at)
    bases.add(enumerate(counts, at.note))
    return DenseScheme(bases)


def test_offsets_are_consecutive_record_numbers_and_map_back() -> None:
    s = _scheme()
    offsets = [s.offset_of(n, i) for n, c in enumerate(COUNTS) for i in range(c)]
    assert offsets == list(range(sum(COUNTS)))
    assert [s.position_of(o) for o in offsets] == [(n, i) for n, c in enumerate(COUNTS) for i in range(c)]
    assert s.start_of(2) == 3 and s.end_of(2, 5) == 8 and s.end_of(4, 4) == sum(COUNTS)
    assert s.position_of(sum(COUNTS)) == (5, 0)          # the high watermark: the next notification's start
    assert s.start_of(5) == sum(COUNTS)


def test_the_same_offsets_from_any_checkpoint_and_counting_back() -> None:
    """A reader starting cold at a checkpoint (forward) or after retention (back) numbers alike."""
    full = _scheme()
    later = PartitionBases(Checkpoint(3, 8))
    later.add([(3, 1), (4, 4)])
    later.add_before([(1, 0), (2, 5)])                   # back to notification 1
    s = DenseScheme(later)
    assert later.first == 1 and [s.offset_of(n, 0) for n in range(1, 5)] == [full.offset_of(n, 0) for n in range(1, 5)]
    with pytest.raises(OffsetUnknownError):
        s.offset_of(0, 0)
    with pytest.raises(OffsetUnknownError):
        s.position_of(2)                                 # before notification 1's base (3)
    with pytest.raises(InvalidInputError):
        later.add_before([(0, 9)])                       # a base below 0: counts that are not this log's


def test_rereads_are_skipped_skipped_offsets_count_zero_and_retention_forgets() -> None:
    b = PartitionBases(Checkpoint(0, 0))
    b.add([(0, 2), (1, 2)])
    b.add([(1, 2), (2, 7)])                              # notification 1 read again
    assert b.next == 3 and b.checkpoint() == Checkpoint(3, 11)
    b.add([(5, 1)])                                      # offsets 3, 4 skipped by the notification topic
    assert b.base(5) == b.base(3) == 11 and b.position(11) == (5, 0)
    b.forget_before(2)
    assert b.first == 2 and b.base(2) == 4
    b.forget_before(99)                                  # never forgets where the next one starts
    assert b.first == 6 and b.base(6) == 12


def test_checkpoints_round_trip_and_keep_what_retention_needs() -> None:
    points = (Checkpoint(0, 0), Checkpoint(4096, 70_000), Checkpoint(8192, 150_000))
    assert decode_checkpoints(encode_checkpoints(points)) == points and decode_checkpoints(b"") == ()
    for bad in (b"{", b'[["a", 1]]', b"[[1, -2]]", b"[[1]]"):
        with pytest.raises(CorruptDataError):
            decode_checkpoints(bad)
    assert kept(points, Checkpoint(12288, 200_000), low=5000) == points[1:] + (Checkpoint(12288, 200_000),)
    with pytest.raises(InvalidInputError):
        kept(points, Checkpoint(4096, 1), low=0)          # a different base for the same note: never
    many = kept((Checkpoint(i, i) for i in range(200)), Checkpoint(200, 200), low=0)
    assert len(many) == CHECKPOINTS_KEPT and many[-1] == Checkpoint(200, 200)
    assert nearest(points, 5000) == points[1] and nearest(points, 10) == points[0] and nearest(points[1:], 0) == points[1]
    assert nearest((), 3) is None


def test_a_partition_log_over_dense_offsets_counts_records() -> None:
    """Log start, high watermark and lag are record counts; DeleteRecords inside a part skips its head."""
    s = _scheme()
    log = PartitionLog(low=2, high=5, last_end=s.end_of(4, 4), scheme=s)
    assert log.log_start == 3 and log.high_watermark == 13
    assert log.high_watermark - s.offset_of(3, 0) == 5    # a group at notification 3 has 5 records to read
    moved = PartitionLog(low=2, high=5, moved=s.offset_of(2, 2), scheme=s)
    assert moved.first_note == 2 and moved.skip(2) == 2 and moved.deleted(1) and not moved.deleted(2)
    seg = log.segments(s.offset_of(3, 0))
    assert (seg.tail.note, seg.tail.index) == (3, 0)


class Log:
    """A notification partition (record counts per offset) whose first `low` notifications expired."""

    def __init__(self, counts: list[int], low: int = 0, manifest: Manifest | None = None) -> None:
        self.counts, self.low, self.asked, self.compacted = counts, low, 0, manifest

    async def manifest(self, topic: str, partition: int) -> Manifest | None:
        return self.compacted

    def watermarks_seen(self, notification_topic: str, partition: int) -> tuple[int, int] | None:
        return None

    async def watermarks(self, notification_topic: str, partition: int) -> tuple[int, int]:
        return self.low, len(self.counts)

    async def notes_between(self, notification_topic: str, partition: int, start: int, end: int
                            ) -> list[NotificationRecord]:
        self.asked += max(end - max(start, self.low), 0)
        return [note(o, self.counts[o]) for o in range(max(start, self.low), min(end, len(self.counts)))]


DENSE = TopicMetadata("t", "n", 1, offsets="dense")


async def test_a_broker_counts_from_a_checkpoint_and_stores_the_next_ones() -> None:
    """Cold, a broker counts from the oldest checkpoint in the retained log (back to its start,
    forward to its end), not from notification 0; each multiple of CHECKPOINT_EVERY it passes is
    stored, with the same bases a broker counting from 0 finds."""
    counts = [1 + i % 7 for i in range(3 * CHECKPOINT_EVERY + 10)]
    full = Bases(Log(counts), MemoryCheckpoints())
    whole = await full.scheme(DENSE, 0)
    assert [whole.start_of(n) for n in (0, 1, 2)] == [0, 1, 3]
    store = MemoryCheckpoints()
    for n in range(CHECKPOINT_EVERY, len(counts), CHECKPOINT_EVERY):
        store.save_offset_checkpoint("t", 0, Checkpoint(n, whole.start_of(n)), 0)
    late = Log(counts, low=CHECKPOINT_EVERY + 100)
    cold = await Bases(late, store).scheme(DENSE, 0)
    assert late.asked == len(counts) - late.low                       # the retained log, nothing before it
    assert [cold.start_of(n) for n in (late.low, len(counts) - 1)] == [whole.start_of(n) for n in (late.low, len(counts) - 1)]
    with pytest.raises(OffsetUnknownError):
        await Bases(Log(counts, low=5), MemoryCheckpoints()).scheme(DENSE, 0)   # expired before any checkpoint
    prefix = Manifest("t", 0, 9, 1, 1, (), dense_tail=whole.start_of(9))      # a dense compacted prefix's tail
    compacted = dataclasses.replace(DENSE, cleanup_policy="compact")
    after = await Bases(Log(counts, low=5, manifest=prefix), MemoryCheckpoints()).scheme(compacted, 0)
    assert [after.start_of(n) for n in (5, 9, len(counts) - 1)] == [whole.start_of(n) for n in (5, 9, len(counts) - 1)]
    fresh = MemoryCheckpoints()
    await Bases(Log(counts), fresh).scheme(DENSE, 0)
    assert fresh.offset_checkpoints("t", 0) == tuple(Checkpoint(n, whole.start_of(n))
                                                    for n in range(CHECKPOINT_EVERY, len(counts), CHECKPOINT_EVERY))
    assert await Bases(Log(counts), fresh).scheme(TopicMetadata("t", "n", 1), 0) is SPARSE   # a sparse topic: no I/O


def test_a_delete_records_start_is_stored_as_a_position_every_reader_reads() -> None:
    """Stored sparse (notification, index), so memq's Consumer (counting in notifications) reads it
    without bases; a dense reader maps it back; one before the counted notifications is retention's."""
    s = _scheme()
    cut = s.offset_of(2, 3)
    stored = stored_start(s, cut)
    assert stored == SPARSE.offset_of(2, 3) and stored_start(SPARSE, stored) == stored
    assert moved_start(((0, stored),), 0, s) == cut and moved_start(((0, stored),), 0) == stored
    assert moved_start((), 0, s) == 0
    later = PartitionBases(Checkpoint(3, 8))
    assert moved_start(((0, stored),), 0, DenseScheme(later)) == 0   # before what this reader counted


async def test_a_hosting_broker_stores_checkpoints_without_any_reader() -> None:
    counts = [2] * (2 * CHECKPOINT_EVERY + 1)
    store = MemoryCheckpoints()
    hosted = [DENSE, TopicMetadata("s", "m", 1)]   # a sparse topic is left alone
    await Counting(Bases(Log(counts), store), lambda: hosted).count_all()
    assert store.offset_checkpoints("t", 0) == (Checkpoint(CHECKPOINT_EVERY, 2 * CHECKPOINT_EVERY),
                                                Checkpoint(2 * CHECKPOINT_EVERY, 4 * CHECKPOINT_EVERY))
    assert store.offset_checkpoints("s", 0) == ()


async def test_compaction_numbers_what_it_takes_from_the_manifests_tail_else_from_the_brokers_count() -> None:
    """A compaction run numbers a dense partition's records by counting the notifications it takes
    from the offset its manifest stored for `end` (0 at notification 0); when retention took
    notifications after `end`, from the broker's count (`base_of`), and without one it refuses."""
    asked: list[int] = []

    async def base_of(cfg: TopicConfig, partition: int, n: int) -> int:
        asked.append(n)
        return 1000
    cfg = TopicConfig("t", cleanup_policy="compact", offsets="dense")
    compactor = Compactor(MemqConfig(), cast(ManifestPointers, None), CollectorRegistry(),
                          storage=cast(Store, None), reads=cast(CompactionReads, None), base_of=base_of)
    taken = [note(o, c) for o, c in enumerate(COUNTS)]
    fresh = await compactor.dense_bases(cfg, 0, None, 0, taken)
    assert fresh is not None and [fresh.base(n) for n in range(6)] == [0, 3, 3, 8, 9, 13]
    old = Manifest("t", 0, 5, 1, 1, (), dense_tail=13)
    later = await compactor.dense_bases(cfg, 0, old, 5, [note(5, 2), note(6, 4)])
    assert later is not None and (later.base(6), later.base(7)) == (15, 19) and not asked
    expired = await compactor.dense_bases(cfg, 0, old, 5, [note(9, 2)])      # 5-8 gone with retention
    assert expired is not None and expired.base(10) == 1002 and asked == [9]
    assert await compactor.dense_bases(dataclasses.replace(cfg, offsets="sparse"), 0, old, 5, taken) is None
    compactor.base_of = None
    with pytest.raises(OffsetUnknownError, match="expired"):
        await compactor.dense_bases(cfg, 0, old, 5, [note(9, 2)])


class _Broker:
    """A broker's `/v1/offsets` over the full count of COUNTS, counting the questions."""

    def __init__(self) -> None:
        self.full = _scheme()
        self.asked: list[dict[str, int | None]] = []

    def checkpoint(self, topic: str, partition: int, *, note: int | None = None, offset: int | None = None) -> Checkpoint:
        self.asked.append({"note": note, "offset": offset})
        if note is not None:
            return Checkpoint(note, self.full.start_of(note))
        assert offset is not None
        at, index = self.full.position_of(offset)
        return Checkpoint(at, offset - index)


def test_a_reader_counts_from_one_checkpoint_and_asks_again_only_where_it_moved() -> None:
    """memq's Consumer and the Spark driver (`CountedOffsets`): one question where a partition's
    reading starts, then the notifications read give every base; a run that does not follow (a
    seek) starts from a new checkpoint; offsets it did not count are asked for."""
    from memq.client.dense_offsets import CountedOffsets

    broker = _Broker()
    counted = CountedOffsets("t", broker)   # type: ignore[arg-type]
    counted.count(0, [(2, 5), (3, 1)])
    counted.count(0, [(4, 4)])
    assert [counted.offset_of(0, n, i) for n, i in ((2, 0), (2, 4), (3, 0), (4, 3), (5, 0))] == [3, 7, 8, 12, 13]
    assert broker.asked == [{"note": 2, "offset": None}]
    assert counted.position_of(0, 9) == (4, 0) and len(broker.asked) == 1
    assert counted.offset_of(0, 0, 1) == 1 and counted.position_of(0, 2) == (0, 2)   # before its count: asked
    counted.count(0, [(1, 0)])          # a run before the counted ones (a seek back): from a new checkpoint
    assert counted.offset_of(0, 2) == 3 and broker.asked[-1] == {"note": 1, "offset": None}
