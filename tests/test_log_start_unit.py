"""DeleteRecords' log start without I/O: how memq's Consumer applies it (the partition logs of
`memq.log.model.TopicLogs`, `position_policy`, `consumer_record.trim`), and how the registry and
the metadata carry it. (Where it moves: `tests/test_partition_log_unit.py`.)"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

import pytest
from tests.support.consumer_fakes import batch, recs

from memq.client.consumer_record import build_records, trim
from memq.client.position_policy import PositionPolicy, RangeCheck, Reset
from memq.client.reader import DataLossPolicy
from memq.errors import CoordinationError, CorruptDataError, DataLossError, OffsetOutOfRangeError
from memq.format.batch import decode_batch_rows
from memq.format.metadata import ClusterMetadata, StorageMetadata, TopicMetadata
from memq.governor.registry import log_starts_from_json, log_starts_to_json
from memq.kafka_api.offsets import first_offset, kafka_offset
from memq.log.model import TopicLogs

log = logging.getLogger("test.log_start")


# --- the Consumer's partition logs and the position policy --------------------------------------------------


def test_log_starts_split_kafka_offsets_into_notification_and_index() -> None:
    logs = TopicLogs([(0, kafka_offset(4, 2)), (1, first_offset(7))])
    p0, p1, p2 = logs.partition(0), logs.partition(1), logs.partition(2)
    assert (p0.first_note, p1.first_note, p2.first_note) == (4, 7, 0)
    assert p0.deleted(3) and not p0.deleted(4) and not p2.deleted(0)
    assert (p0.skip(4), p0.skip(5), p1.skip(7)) == (2, 0, 0)
    assert logs.partition(0) is p0                                      # one per partition


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


def policy(reset: str = "earliest", starts: TopicLogs | None = None) -> PositionPolicy:
    return PositionPolicy("t", "memq.t", "g", reset, None, DataLossPolicy(skip=False, logger=log, hint=""),  # type: ignore[arg-type]
                          starts or TopicLogs())


def test_a_batch_before_the_log_start_is_expired_not_lost() -> None:
    objects: dict[str, bytes] = {}
    rec = batch("k", [(1, 0, recs("a"))], 3, objects)
    gone = DataLossError("before the log start")
    starts = TopicLogs([(0, kafka_offset(5, 1))])
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
    check = RangeCheck(policy(starts=TopicLogs([(0, kafka_offset(6, 3)), (1, first_offset(2))])))
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
