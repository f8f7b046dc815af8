"""The read model of a partition's log (`memq.log.model`), without I/O: its log start, its high
watermark, the segments read from an offset, and DeleteRecords' moves."""

from __future__ import annotations

from memq.compaction.manifest import Manifest
from memq.compaction.parts import PartRef
from memq.kafka_api.offsets import end_offset, first_offset, kafka_offset
from memq.kafka_api.dense import Checkpoint, DenseScheme, PartitionBases
from memq.log.model import PartitionLog, Segments, Tail, moved_start


def _part(key: str, first: int, last: int) -> PartRef:
    return PartRef("b", key, 100, 10, 0, first, last, 3, 0, 1, 2, 100, 20)


#: Survivors of notifications 0-1 (p0) and 3-4 (p1); the plain tail at notification 6.
P0 = _part("p0", kafka_offset(0, 1), kafka_offset(1, 4))
P1 = _part("p1", kafka_offset(3, 0), kafka_offset(4, 2))
M = Manifest("t", 0, 6, 1, 1, (P0, P1))


def test_the_log_start_is_the_later_of_retention_and_delete_records() -> None:
    assert moved_start(((0, 5), (2, 9)), 2) == 9 and moved_start(((0, 5),), 1) == 0
    assert PartitionLog(low=3).log_start == first_offset(3)
    assert PartitionLog(low=3, moved=kafka_offset(4, 7)).log_start == kafka_offset(4, 7)
    assert PartitionLog(low=5, moved=kafka_offset(4, 7)).log_start == first_offset(5)   # retention went further
    assert PartitionLog(low=0).log_start == 0
    assert PartitionLog().log_start == -1                                               # nothing known yet
    assert PartitionLog(moved=kafka_offset(2, 1)).log_start == kafka_offset(2, 1)


def test_a_compacted_partition_starts_at_its_first_survivor_never_before_delete_records() -> None:
    assert PartitionLog(M, low=5).log_start == P0.first_offset             # the prefix holds what expired
    assert PartitionLog(M, low=0).log_start == 0                            # retention kept everything
    assert PartitionLog(M, low=5, moved=kafka_offset(3, 1)).log_start == kafka_offset(3, 1)   # inside a part
    empty = Manifest("t", 0, 6, 1, 1, ())
    assert PartitionLog(empty, low=7).log_start == first_offset(6)          # nothing survived: the tail's start


def test_the_high_watermark_is_just_after_the_last_record_read() -> None:
    assert PartitionLog(low=0, high=3, last_end=end_offset(2, 5)).high_watermark == kafka_offset(2, 5)
    assert PartitionLog(low=0, high=3).high_watermark == first_offset(3)    # the last part not known
    assert PartitionLog(high=0).high_watermark == 0
    log = PartitionLog(low=0, high=3, last_end=kafka_offset(2, 5))
    assert log.last_stable_offset == log.high_watermark


def test_a_compacted_prefix_ending_in_dropped_records_ends_after_its_last_survivor() -> None:
    """Tombstones dropped at the prefix's end leave no record: with an empty tail the end is after
    the last survivor, so a reader that read everything is at the end; with a tail, the tail's."""
    assert PartitionLog(M, low=6, high=6).high_watermark == P1.last_offset + 1
    assert PartitionLog(M, low=6, high=-1).high_watermark == P1.last_offset + 1     # notifications not read
    assert PartitionLog(Manifest("t", 0, 6, 1, 1, ()), high=6).high_watermark == first_offset(6)
    assert PartitionLog(M, low=6, high=7, last_end=kafka_offset(6, 3)).high_watermark == kafka_offset(6, 3)


def test_segments_inside_a_part_then_the_tail() -> None:
    log = PartitionLog(M, low=6)
    segs = log.segments(kafka_offset(1, 0))
    assert [(s.part.key, s.start, s.stop, s.first_note, s.last_note) for s in segs.parts] == [
        ("p0", kafka_offset(1, 0), first_offset(6), 1, 1), ("p1", P1.first_offset, first_offset(6), 3, 5)]
    assert segs.tail == Tail(6, 0) and segs.in_prefix
    # between parts (a compacted-away notification): from the next part
    assert [s.part.key for s in log.segments(first_offset(2)).parts] == ["p1"]
    # past every survivor but inside the prefix: no part, still the tail at the prefix's end
    assert log.segments(kafka_offset(5, 3)) == Segments((), Tail(6, 0), in_prefix=True)


def test_segments_before_the_log_start_read_from_the_first_survivor() -> None:
    log = PartitionLog(M, low=6)
    segs = log.segments(0)
    assert [(s.part.key, s.start) for s in segs.parts] == [("p0", P0.first_offset), ("p1", P1.first_offset)]
    assert not log.before_start(0)
    plain = PartitionLog(low=2, moved=kafka_offset(3, 2))
    assert plain.before_start(kafka_offset(3, 1)) and plain.before_start(-1)
    assert not plain.before_start(kafka_offset(3, 2))


def test_segments_after_the_prefix_or_without_one_are_the_plain_tail_from_the_offset() -> None:
    assert PartitionLog(M).segments(kafka_offset(7, 4)) == Segments((), Tail(7, 4))
    assert PartitionLog().segments(kafka_offset(2, 9)) == Segments((), Tail(2, 9))
    assert PartitionLog(M).segments(first_offset(6)) == Segments((), Tail(6, 0))


def test_segments_of_a_notification_range() -> None:
    """Spark plans notification ranges: the parts cut at the range's stop, the tail bounded by it."""
    log = PartitionLog(M)
    assert [(s.part.key, s.first_note, s.stop) for s in log.segments_from_note(0, 6).parts] == [
        ("p0", 0, first_offset(6)), ("p1", 3, first_offset(6))]
    assert log.segments_from_note(0, 3) == Segments(
        (log.segments_from_note(0, 3).parts[0],), None, in_prefix=True)      # ends inside the prefix
    assert log.segments_from_note(0, 3).parts[0].stop == first_offset(3)
    assert log.segments_from_note(2, 3).parts == ()                              # compacted away
    assert log.segments_from_note(4, 9).tail == Tail(6, 0, 9)
    assert [(s.part.key, s.start) for s in log.segments_from_note(4, 9).parts] == [("p1", first_offset(4))]


def test_delete_records_inside_a_part() -> None:
    moved = kafka_offset(3, 1)
    log = PartitionLog(M, low=6, moved=moved)
    assert [(s.part.key, s.start) for s in log.segments(0).parts] == [("p1", moved)]   # never before it
    plain = PartitionLog(low=2, high=9, moved=kafka_offset(4, 3))
    assert (plain.first_note, plain.deleted(3), plain.deleted(4), plain.skip(4), plain.skip(5)) == (4, True, False, 3, 0)
    assert PartitionLog(low=5, moved=kafka_offset(4, 3)).first_note == 5
    assert (PartitionLog().first_note, PartitionLog().deleted(0), PartitionLog().skip(0)) == (0, False, 0)
    assert (PartitionLog(M, low=6).start_note, PartitionLog(low=6).start_note) == (0, 6)


def test_delete_records_moves_forward_within_the_log_or_is_out_of_range() -> None:
    log = PartitionLog(low=2, high=10, last_end=kafka_offset(9, 40), moved=kafka_offset(2, 3))
    start, high = log.log_start, log.high_watermark
    assert log.deletion_point(kafka_offset(5, 1)) == kafka_offset(5, 1)
    assert log.deletion_point(-1) == high                                  # -1: the high watermark
    assert log.deletion_point(high) == high
    assert log.deletion_point(first_offset(1)) == start                    # never backwards
    assert log.deletion_point(high + 1) is None
    assert log.deletion_point(-2) is None
    assert log.first_offset_at(1) == start and log.first_offset_at(7) == first_offset(7)


def test_the_plain_tail_starts_at_the_prefix_end_never_before_the_first_retained_notification() -> None:
    """`Consumer.get` reads the tail from here before the compacted parts."""
    assert PartitionLog(M, low=2).tail_note == 6
    assert PartitionLog(M, low=8).tail_note == 8                  # retention overtook compaction
    assert PartitionLog(low=3).tail_note == 3 and PartitionLog(low=0).tail_note == 0


def test_an_offset_is_in_the_prefix_below_the_tail_start() -> None:
    assert PartitionLog(M).in_prefix(0) and PartitionLog(M).in_prefix(kafka_offset(5, 9))
    assert not PartitionLog(M).in_prefix(kafka_offset(6, 0)) and not PartitionLog().in_prefix(0)


def test_a_dense_prefix_is_read_by_its_offsets_without_the_counts_of_its_notifications() -> None:
    """A dense topic's manifest stores where its tail starts: a reader whose count begins after the
    prefix (retention took its notifications) still finds the prefix's parts, its start and its end."""
    bases = PartitionBases(Checkpoint(7, 40))            # counted from notification 7 only
    bases.add([(7, 5), (8, 5)])
    parts = (_part("d0", 3, 9), _part("d1", 20, 31))
    m = Manifest("t", 0, 6, 1, 1, parts, dense_tail=35)   # notification 6's records start at 35
    log = PartitionLog(m, low=7, high=9, last_end=50, scheme=DenseScheme(bases))
    assert log.log_start == 3 and log.high_watermark == 50
    segs = log.segments(10)
    assert [(s.part.key, s.start, s.stop, s.first_note, s.last_note) for s in segs.parts] == [("d1", 20, 35, 5, 5)]
    assert segs.tail == Tail(6, 0) and log.in_prefix(34) and not log.in_prefix(35)
    assert log.segments(41) == Segments((), Tail(7, 1))
    assert PartitionLog(m, low=7, high=6).high_watermark == 32       # an empty tail: after the last survivor
    assert Manifest.from_json(m.to_json(), "m").tail_offset == 35
    assert b"dense_tail" not in M.to_json()                           # a sparse manifest as before


def test_a_dense_prefix_hands_its_parts_over_at_their_survivors_notifications() -> None:
    """With the prefix's notifications counted (memq's Consumer, Spark), a part hands over as its
    last survivor's notification, so a commit after it resumes at the next part's survivors."""
    bases = PartitionBases(Checkpoint(0, 0))
    bases.add([(0, 5), (1, 5), (2, 10), (3, 5), (4, 10), (5, 0)])   # notification 6 starts at 35
    m = Manifest("t", 0, 6, 1, 1, (_part("d0", 3, 9), _part("d1", 20, 31)), dense_tail=35)
    log = PartitionLog(m, scheme=DenseScheme(bases))
    assert [(s.part.key, s.start, s.first_note, s.last_note) for s in log.segments(0).parts] == [
        ("d0", 3, 0, 1), ("d1", 20, 3, 5)]
    assert [(s.part.key, s.start, s.first_note) for s in log.segments(log.scheme.start_of(2)).parts] == [
        ("d1", 20, 3)]
