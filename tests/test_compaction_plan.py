"""Compaction planning (pure): what survives, which parts are rewritten, when a partition is due."""

from __future__ import annotations

import dataclasses

import pytest

from memq.compaction.parts import Survivor
from memq.compaction.plan import DirtyNote, Keep, Write, cleanable, compactor_of, dirty_ratio, due, plan, untouched
from memq.config import TopicConfig
from memq.errors import ConfigError

NOW = 10_000_000
CFG = TopicConfig("t", read_partitions=1, cleanup_policy="compact", delete_retention_ms=1_000, storage_group="")


def rec(offset: int, key: str, value: str | None, ts: int = NOW) -> Survivor:
    return Survivor(offset, ts, key.encode(), None if value is None else value.encode())


def test_latest_record_per_key_survives_with_its_offset() -> None:
    dirty = [rec(1, "a", "1"), rec(2, "b", "1"), rec(3, "a", "2"), rec(4, "c", "1"), rec(5, "b", "2")]
    p = plan(CFG, [], dirty, NOW)
    [seg] = p.segments
    assert isinstance(seg, Write)
    assert [(s.offset, s.key, s.value) for s in seg.survivors] == [(3, b"a", b"2"), (4, b"c", b"1"), (5, b"b", b"2")]
    assert (p.records_in, p.survivors, p.replaced) == (5, 3, ())


def test_tombstones_stay_until_delete_retention_then_go() -> None:
    dirty = [rec(1, "a", "1"), rec(2, "a", None, ts=NOW - 500), rec(3, "b", "1"), rec(4, "b", None, ts=NOW - 1_500)]
    p = plan(CFG, [], dirty, NOW)
    [seg] = p.segments
    assert isinstance(seg, Write)
    assert [(s.key, s.value) for s in seg.survivors] == [(b"a", None)]
    assert (p.tombstones, p.dropped_tombstones) == (1, 1)


def test_old_parts_losing_a_record_are_rewritten_others_kept() -> None:
    old = [("p1", [rec(1, "a", "1"), rec(2, "b", "1")]), ("p2", None), ("p3", [rec(7, "c", "1")])]
    p = plan(CFG, old, [rec(10, "b", "2"), rec(11, "d", "1")], NOW)
    kinds = [(type(s).__name__, s.part if isinstance(s, Keep) else [x.offset for x in s.survivors])
             for s in p.segments]
    assert kinds == [("Write", [1]), ("Keep", "p2"), ("Keep", "p3"), ("Write", [10, 11])]
    assert p.replaced == ("p1",)


def test_a_part_emptied_is_replaced_by_nothing() -> None:
    p = plan(CFG, [("p1", [rec(1, "a", "1")])], [rec(5, "a", "2")], NOW)
    assert p.replaced == ("p1",)
    assert [[s.offset for s in seg.survivors] for seg in p.segments if isinstance(seg, Write)] == [[5]]


def test_compact_delete_drops_records_past_retention() -> None:
    cfg = TopicConfig("t", read_partitions=1, cleanup_policy="compact,delete", retention_ms=1_000, storage_group="")
    p = plan(cfg, [], [rec(1, "a", "1", ts=NOW - 2_000), rec(2, "b", "1")], NOW)
    assert [s.key for seg in p.segments if isinstance(seg, Write) for s in seg.survivors] == [b"b"]
    assert p.expired == 1


def test_new_parts_are_cut_by_size() -> None:
    p = plan(CFG, [], [rec(i, str(i), "v") for i in range(10)], NOW, part_records=4)
    assert [len(s.survivors) for s in p.segments if isinstance(s, Write)] == [4, 4, 2]


def test_untouched_needs_no_key_hit_no_expiring_tombstone_no_retention() -> None:
    assert untouched(CFG, NOW, 0, False, NOW)
    assert not untouched(CFG, NOW, 0, True, NOW)
    assert untouched(CFG, NOW - 5_000, 0, False, NOW)                 # no tombstone to expire
    assert not untouched(CFG, NOW - 5_000, 1, False, NOW)             # its tombstone may have expired
    cfg = TopicConfig("t", read_partitions=1, cleanup_policy="compact,delete", retention_ms=1_000, storage_group="")
    assert not untouched(cfg, NOW - 5_000, 0, False, NOW)


def test_due_by_dirty_ratio_or_max_lag_and_never_before_min_lag() -> None:
    notes = [DirtyNote(0, NOW - 100, 600)]
    assert dirty_ratio(400, 600) == 0.6
    assert due(CFG, 400, notes, NOW).due
    assert not due(CFG, 1_000, notes, NOW).due                         # 0.375 < 0.5
    lagged = TopicConfig("t", read_partitions=1, cleanup_policy="compact", max_compaction_lag_ms=50, storage_group="")
    assert due(lagged, 1_000, notes, NOW).due
    young = TopicConfig("t", read_partitions=1, cleanup_policy="compact", min_compaction_lag_ms=1_000, storage_group="")
    assert not due(young, 0, notes, NOW).due
    assert cleanable([DirtyNote(0, NOW - 2_000, 1), DirtyNote(1, NOW - 10, 1), DirtyNote(2, NOW - 5_000, 1)],
                     NOW, 1_000) == 1


def test_a_compacted_topic_has_several_partitions_but_an_alter_never_moves_a_keys_records() -> None:
    compacted = TopicConfig("t", cleanup_policy="compact", storage_group="")   # records placed by key
    assert compacted.read_partitions == 3
    grown = dataclasses.replace(compacted, read_partitions=4)
    with pytest.raises(ConfigError, match="compacted: its read_partitions do not grow"):
        grown.check_altered_from(compacted)
    plain = TopicConfig("t", read_partitions=3, cleanup_policy="delete")
    with pytest.raises(ConfigError, match="spread over partitions without regard to keys"):
        dataclasses.replace(plain, cleanup_policy="compact").check_altered_from(plain)
    one = TopicConfig("t", read_partitions=1, cleanup_policy="delete")
    dataclasses.replace(one, cleanup_policy="compact").check_altered_from(one)          # one partition: fine
    dataclasses.replace(compacted, cleanup_policy="delete").check_altered_from(compacted)
    dataclasses.replace(plain, read_partitions=6).check_altered_from(plain)             # not compacted: grows


def test_a_topics_hosts_take_its_partitions_in_turn_and_unassigned_topics_spread_by_hash() -> None:
    hosts = ["b2", "b1"]                                       # assignment order, not sorted
    assert [compactor_of("t", p, hosts, ["b1", "b2", "b3"]) for p in range(5)] == ["b2", "b1", "b2", "b1", "b2"]
    live = ["b3", "b1", "b2"]
    owners = {compactor_of(f"t{i}", p, [], live) for i in range(20) for p in range(3)}
    assert owners == {"b1", "b2", "b3"}                        # every live broker gets a share
    assert compactor_of("t", 1, [], live) == compactor_of("t", 1, [], sorted(live))   # any listing order
    assert compactor_of("t", 0, [], []) is None


def test_a_new_compacted_topic_keeps_objects_of_its_own_unless_its_creator_chose_a_group() -> None:
    compacted = TopicConfig("t", read_partitions=1, cleanup_policy="compact")    # the default, shared group
    assert compacted.storage_group and compacted.created(set()).storage_group == ""
    assert compacted.created({"storage_group"}) == compacted                     # chosen: kept
    plain = TopicConfig("t")
    assert plain.created(set()) == plain                                         # plain topics share as before
