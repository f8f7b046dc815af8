"""DeleteRecords' log start without I/O: where it moves (`kafka_api.log_start`), how memq's Consumer
applies it (`client.log_start`, `position_policy`), and how the registry and the metadata carry it."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

import pytest
from tests.support.consumer_fakes import batch, recs

from memq.client.consumer_record import build_records
from memq.client.log_start import LogStarts, trim
from memq.client.position_policy import PositionPolicy, RangeCheck, Reset
from memq.client.reader import DataLossPolicy
from memq.errors import CoordinationError, CorruptDataError, DataLossError, OffsetOutOfRangeError
from memq.format.batch import decode_batch_rows
from memq.format.metadata import ClusterMetadata, StorageMetadata, TopicMetadata
from memq.governor.registry import log_starts_from_json, log_starts_to_json
from memq.kafka_api.log_start import deletion_point, log_start, moved_start
from memq.kafka_api.offsets import first_offset, kafka_offset

log = logging.getLogger("test.log_start")


# --- kafka_api.log_start -----------------------------------------------------------------------


def test_the_log_start_is_the_later_of_retention_and_delete_records() -> None:
    assert moved_start(((0, 5), (2, 9)), 2) == 9 and moved_start(((0, 5),), 1) == 0
    assert log_start(3, 0) == first_offset(3)
    assert log_start(3, kafka_offset(4, 7)) == kafka_offset(4, 7)
    assert log_start(5, kafka_offset(4, 7)) == first_offset(5)     # retention went further
    assert log_start(-1, 0) == 0


def test_delete_records_moves_forward_within_the_log_or_is_out_of_range() -> None:
    start, high = kafka_offset(2, 3), kafka_offset(9, 40)
    assert deletion_point(kafka_offset(5, 1), start, high) == kafka_offset(5, 1)
    assert deletion_point(-1, start, high) == high                  # -1: the high watermark
    assert deletion_point(high, start, high) == high
    assert deletion_point(first_offset(1), start, high) == start   # never backwards
    assert deletion_point(high + 1, start, high) is None
    assert deletion_point(-2, start, high) is None


# --- client.log_start and the position policy --------------------------------------------------


def test_log_starts_split_kafka_offsets_into_notification_and_index() -> None:
    starts = LogStarts.of([(0, kafka_offset(4, 2)), (1, first_offset(7))])
    assert (starts.first_note(0), starts.first_note(1), starts.first_note(2)) == (4, 7, 0)
    assert starts.deleted(0, 3) and not starts.deleted(0, 4) and not starts.deleted(2, 0)
    assert (starts.skip(0, 4), starts.skip(0, 5), starts.skip(1, 7)) == (2, 0, 0)


def test_trim_drops_the_records_before_the_start_and_keeps_the_later_ones_at_their_indexes() -> None:
    objects: dict[str, bytes] = {}
    rec = batch("k", [(7, 0, recs("a", "b")), (8, 0, recs("c", "d", "e")), (9, 0, recs("f"))], 4, objects)
    built = build_records("t", rec, decode_batch_rows(objects["k"]))
    for skip, want in ((0, "abcdef"), (2, "cdef"), (3, "def"), (6, ""), (9, "")):
        out = trim(built, skip)
        flat = [r for _, rs in out for r in rs]
        assert "".join(bytes(r.value).decode() for r in flat) == want
        assert [r.index for r in flat] == list(range(6 - len(want), 6))
    assert [h.producer_id for h, _ in trim(built, 3)] == [8, 9]     # a Message wholly before the start goes


def policy(reset: str = "earliest", starts: LogStarts = LogStarts()) -> PositionPolicy:
    return PositionPolicy("t", "memq.t", "g", reset, None, DataLossPolicy(skip=False, logger=log, hint=""),  # type: ignore[arg-type]
                          starts)


def test_a_batch_before_the_log_start_is_expired_not_lost() -> None:
    objects: dict[str, bytes] = {}
    rec = batch("k", [(1, 0, recs("a"))], 3, objects)
    gone = DataLossError("before the log start")
    starts = LogStarts.of([(0, kafka_offset(5, 1))])
    assert policy(starts=starts).lost(rec, gone, 0) == "expired"
    with pytest.raises(OffsetOutOfRangeError, match="log start") as e:
        policy("error", starts).lost(rec, gone, 0)
    assert (e.value.offset, e.value.oldest) == (3, 5)
    with pytest.raises(DataLossError):   # at or after the start: a lost batch is data loss, as before
        policy(starts=starts).lost(dataclasses.replace(rec, offset=5), gone, 0)


class Log:
    def __init__(self, committed: dict[int, int | None], low: int, high: int) -> None:
        self.positions, self.low, self.high = committed, low, high

    def committed(self, partitions: Iterable[int]) -> dict[int, int | None]:
        return {p: self.positions[p] for p in partitions}

    def watermarks(self, partition: int) -> tuple[int, int]:
        return self.low, self.high


def test_a_committed_position_before_the_log_start_resets_as_behind_retention() -> None:
    check = RangeCheck(policy(starts=LogStarts.of([(0, kafka_offset(6, 3)), (1, first_offset(2))])))
    check.add([0, 1, 2])
    assert list(check.resets(Log({0: 4, 1: 2, 2: 1}, low=1, high=9))) == [Reset(0, 6, expired=2)]


# --- where it is stored and carried ------------------------------------------------------------


def test_registry_log_starts_round_trip_and_bad_znodes_fail_clearly() -> None:
    starts = {0: kafka_offset(3, 4), 5: 7}
    assert log_starts_from_json(log_starts_to_json(starts), "z") == starts
    for bad in (b"[]", b"{}", b'{"partitions": {"x": 1}}', b'{"partitions": {"0": -1}}', b"nope"):
        with pytest.raises(CoordinationError, match="z"):
            log_starts_from_json(bad, "z")


def test_metadata_carries_log_starts_and_omits_none() -> None:
    topic = TopicMetadata("t", "memq.t", 2, log_start=((1, kafka_offset(3, 4)),))
    md = ClusterMetadata("c", "b1", "k:9092", StorageMetadata(), topics={"t": topic, "u": TopicMetadata("u", "memq.u", 1)})
    doc = md.to_dict()
    assert doc["topics"]["t"]["log_start"] == {"1": kafka_offset(3, 4)} and "log_start" not in doc["topics"]["u"]
    assert ClusterMetadata.from_dict(doc).topics == md.topics
    doc["topics"]["t"]["log_start"] = {"1": -3}
    with pytest.raises(CorruptDataError, match="log_start"):
        ClusterMetadata.from_dict(doc)
