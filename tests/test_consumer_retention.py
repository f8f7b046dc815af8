"""Readers behind retention, with in-process fakes: a committed position outside the retained
notifications follows `consumer.auto_offset_reset` (Kafka's OffsetOutOfRange), and an object
deleted by retention counts as expired, never as data loss. The real-cluster cases are in
test_dedup_cluster.py."""

from __future__ import annotations

import dataclasses
import time

import pytest
from tests.support.consumer_fakes import FakeNotifications, MemorySource, batch, recs, values

from memq.client.consumer import Consumer
from memq.client.positions import is_expired, out_of_range
from memq.client.reader import BatchReader
from memq.config import ConsumerConfig, MemqConfig, TopicConfig, build
from memq.errors import ConfigError, DataLossError, OffsetOutOfRangeError
from memq.notify import NotificationRecord



def test_out_of_range_is_outside_the_retained_log_only() -> None:
    assert not out_of_range(None, 5, 9)                   # no committed offset: the reset policy's start
    assert not out_of_range(5, 5, 9) and not out_of_range(9, 5, 9)   # the end is a valid position
    assert out_of_range(4, 5, 9) and out_of_range(10, 5, 9)


def test_expired_is_a_missing_object_older_than_retention() -> None:
    day = 86_400_000
    assert is_expired(True, published_ms=1, now_ms=2 * day, retention_ms=day)
    assert not is_expired(True, published_ms=day, now_ms=day + 5, retention_ms=day)    # young: lost
    assert not is_expired(False, published_ms=1, now_ms=2 * day, retention_ms=day)    # corrupt: lost
    assert not is_expired(True, published_ms=1, now_ms=2 * day, retention_ms=None)    # no retention: lost


class Retained(FakeNotifications):
    """Notifications [low, end) retained, the group's committed offset given."""

    def __init__(self, records: list[NotificationRecord], low: int, committed: int | None) -> None:
        super().__init__(records)
        self.low, self.at, self.start = low, low, committed

    def committed(self, partitions: object) -> dict[int, int | None]:
        return {0: self.start}

    def watermarks(self, partition: int) -> tuple[int, int]:
        return self.low, len(self.records)

    def poll(self, timeout_s: float, max_records: int = 500) -> list[NotificationRecord]:
        self.at = max(self.at, self.low)
        return super().poll(timeout_s, max_records)


def lagging(reset: str, committed: int, **cc: object) -> tuple[Consumer, Retained]:
    objects: dict[str, bytes] = {}
    rs = [batch(f"k{i}", [(1, i, recs(str(i)))], i, objects) for i in range(6)]
    notes = Retained(rs, low=3, committed=committed)   # 0..2 expired from Kafka
    config = MemqConfig(consumer=ConsumerConfig(auto_offset_reset=reset, **cc))  # type: ignore[arg-type]
    return Consumer(config, "t", notifications=notes,
                    reader=BatchReader(config, 2, source=lambda: MemorySource(objects))), notes


def test_a_position_before_the_oldest_notification_resets_to_earliest_and_counts_expired() -> None:
    c, _ = lagging("earliest", committed=1)
    with c:
        assert values(c, 3) == [b"3", b"4", b"5"]
        assert (c.metrics.offset_resets, c.metrics.expired, c.metrics.data_loss_skipped) == (1, 2, 0)


def test_a_position_past_the_end_resets_to_latest() -> None:
    c, _ = lagging("latest", committed=99)
    with c:
        assert list(c.poll(0.2)) == []
        assert c.position() == {0: 6} and c.metrics.offset_resets == 1 and c.metrics.expired == 0


def test_error_raises_naming_topic_partition_position_and_oldest_until_the_application_seeks() -> None:
    c, _ = lagging("error", committed=1)
    with c:
        for _ in range(2):
            with pytest.raises(OffsetOutOfRangeError, match=r"topic t read partition 0: committed position 1 "
                                                            r".*oldest available offset 3") as e:
                list(c.poll(0.2))
            assert (e.value.topic, e.value.partition, e.value.offset, e.value.oldest) == ("t", 0, 1, 3)
        c.seek(0, 4)
        assert values(c, 2) == [b"4", b"5"]


def test_auto_offset_reset_is_checked_at_start() -> None:
    with pytest.raises(ConfigError, match="auto_offset_reset"):
        build(ConsumerConfig, {"auto_offset_reset": "none"}, "consumer")
    with pytest.raises(ConfigError, match="consumer.dedup_window = 8"):
        ConsumerConfig(dedup_window=8)


def retained_topic(objects: dict[str, bytes], published_ms: int) -> tuple[Consumer, FakeNotifications]:
    rs = [dataclasses.replace(batch(f"k{i}", [(1, i, recs(str(i)))], i, objects), timestamp_ms=published_ms)
          for i in range(3)]
    del objects["k1"]                                     # deleted by the retention janitor
    # the resolver reads the retention here; sparse: no broker tells where dense offsets stand
    config = MemqConfig(topics=(TopicConfig("t", retention_ms=60_000, offsets="sparse"),))
    notes = FakeNotifications(rs)
    c = Consumer(config, "t", notifications=notes, reader=BatchReader(config, 2, source=lambda: MemorySource(objects)))
    return c, notes


def test_an_object_older_than_retention_is_expired_not_lost() -> None:
    c, _ = retained_topic({}, published_ms=1)
    with c:
        assert values(c, 2) == [b"0", b"2"]               # on_data_loss = raise, yet no DataLossError
        assert (c.metrics.expired, c.metrics.data_loss_skipped) == (1, 0)


def test_a_young_missing_object_is_still_data_loss() -> None:
    c, _ = retained_topic({}, published_ms=int(time.time() * 1000))
    with c:
        assert values(c, 1) == [b"0"]
        with pytest.raises(DataLossError, match="is missing"):
            list(c.poll(5))
        assert c.metrics.expired == 0
