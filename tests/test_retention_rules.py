"""The janitor's pure rules (memq.governor.retention) and bulk deletes on the file handler."""

from __future__ import annotations

from pathlib import Path

import pytest

from memq.cli.topic import topic_config
from memq.config import GovernorConfig, MemqConfig, TopicConfig, build, load_config
from memq.errors import ConfigError
from memq.governor import retention
from memq.storage import FileStorageHandler
from memq.storage.base import DELETE_CHUNK, ObjectInfo, ObjectLocation, delete_chunks

NOW = 1_700_000_000_000


def obj(ts: int, size: int = 100, name: str | None = None) -> ObjectInfo:
    return ObjectInfo(ObjectLocation("b", name or f"00/c/topics/t/{ts:013d}-b1-{ts:x}-a0"), size, ts)


def test_time_retention_expires_only_objects_older_than_retention_plus_grace() -> None:
    objects = [obj(NOW - age) for age in (10_000, 6_000, 5_001, 5_000, 4_000, 0)]
    pointer = retention.pointer_cutoff(objects, NOW, retention_ms=4_000, retention_bytes=None)
    assert pointer == NOW - 4_000
    cut = retention.object_cutoff(pointer, None, grace_ms=1_000)
    assert [NOW - o.timestamp_ms for o in retention.expired(objects, cut)] == [10_000, 6_000, 5_001]


def test_byte_budget_expires_the_oldest_beyond_it() -> None:
    objects = [obj(NOW - 1000 + i, size=10) for i in range(10)]    # 100 bytes in all, all young
    pointer = retention.pointer_cutoff(objects, NOW, retention_ms=60_000, retention_bytes=35)
    assert pointer == objects[6].timestamp_ms + 1                  # the newest 3 (30 bytes) fit
    assert retention.expired(objects, retention.object_cutoff(pointer, None, 0)) == objects[:7]
    assert retention.pointer_cutoff(objects, NOW, 60_000, 100) == NOW - 60_000   # all fit


def test_a_retained_notification_keeps_its_object_whatever_the_cutoff() -> None:
    # Kafka still holds a pointer to an object older than the cutoff: it stays, grace included
    assert retention.object_cutoff(NOW - 1_000, NOW - 9_000, grace_ms=500) == NOW - 9_500
    assert retention.object_cutoff(NOW - 1_000, NOW, grace_ms=500) == NOW - 1_500


def test_orphans_are_the_unreferenced_objects_of_a_bounded_window() -> None:
    # a sweep at most once per grace, from where the last one ended
    assert retention.orphan_window(NOW, 2_000, swept_until_ms=NOW - 3_000, pointer_ms=0) is None
    assert retention.orphan_window(NOW, 2_000, NOW - 4_000, 0) == (NOW - 4_000, NOW - 2_000)
    # after an outage at most two graces back, never older than the pointer cutoff
    assert retention.orphan_window(NOW, 2_000, 0, 0) == (NOW - 6_000, NOW - 2_000)
    assert retention.orphan_window(NOW, 2_000, 0, pointer_ms=NOW - 5_000) == (NOW - 5_000, NOW - 2_000)
    announced, unannounced = obj(NOW - 3_000), obj(NOW - 2_500)
    assert retention.orphans([announced, unannounced], {announced.location.key}) == [unannounced]


def test_listing_ranges_merge_when_they_meet() -> None:
    assert retention.listing_ranges((0, 10), (5, 20)) == [(0, 20)]
    assert retention.listing_ranges((0, 10), (10, 20)) == [(0, 20)]
    assert retention.listing_ranges((0, 10), (15, 20)) == [(0, 10), (15, 20)]
    assert retention.listing_ranges((0, -5), (15, 15)) == []


def test_bulk_deletes_are_cut_into_requests_of_at_most_1000_keys() -> None:
    locs = [ObjectLocation("b", str(i)) for i in range(2_501)]
    chunks = delete_chunks(locs)
    assert [len(c) for c in chunks] == [DELETE_CHUNK, DELETE_CHUNK, 501]
    assert [loc for c in chunks for loc in c] == locs
    assert delete_chunks([]) == []


def test_a_byte_limit_needs_the_topics_own_objects(tmp_path: Path) -> None:
    """Parts of shared objects are not counted by size: a byte limit there is refused, not ignored."""
    path = tmp_path / "memq.toml"
    path.write_text('[[topics]]\nname = "t"\nretention_bytes = 1000\n')
    with pytest.raises(ConfigError, match='topic t: retention_bytes .* storage_group = ""'):
        load_config(path, env={})
    path.write_text('[[topics]]\nname = "t"\nretention_bytes = 1000\nstorage_group = ""\n')
    assert load_config(path, env={}).topics[0].retention_bytes == 1000
    TopicConfig("t", retention_bytes=1000)   # read back as stored (e.g. before storage groups): still served


def test_retention_settings_are_validated_by_name() -> None:
    cfg = build(TopicConfig, {"name": "t", "retention_ms": "5000", "retention_bytes": "1000"}, "topic t")
    assert (cfg.retention_ms, cfg.retention_bytes) == (5000, 1000)
    assert TopicConfig("t").retention_ms == 7 * 24 * 3_600_000 and TopicConfig("t").retention_bytes is None
    with pytest.raises(ConfigError, match="retention_ms = 0 is out of range"):
        build(TopicConfig, {"name": "t", "retention_ms": 0}, "topic t")
    with pytest.raises(ConfigError, match="retention_bytes"):
        build(TopicConfig, {"name": "t", "retention_bytes": "lots"}, "topic t")
    with pytest.raises(ConfigError, match="governor.orphan_grace_s"):
        build(GovernorConfig, {"orphan_grace_s": 0}, "governor")


async def test_file_handler_deletes_in_bulk_and_lists_every_attempt(tmp_path: Path) -> None:
    storage = FileStorageHandler(tmp_path, cluster="c")
    try:
        locs = [await storage.put_batch("t", b"x" * 10, first_request_id=i, timestamp_ms=NOW + i, broker_id="b1")
                for i in range(5)]
        retried = locs[0].key.removesuffix("-a0") + "-a1"      # a superseded attempt: hidden from readers
        (tmp_path / retried).write_bytes(b"y")
        assert len(await storage.list_topic("t", 0, 10**13)) == 5
        assert len(await storage.list_topic("t", 0, 10**13, all_attempts=True)) == 6
        assert await storage.delete_many([*locs[:3], ObjectLocation("", retried)]) == []
        left = await storage.list_topic("t", 0, 10**13, all_attempts=True)
        assert [i.location for i in left] == locs[3:]
        assert await storage.delete_many(locs[:1]) == []        # already gone: not a failure
    finally:
        await storage.close()


def test_topic_create_takes_retention_from_its_option_or_set() -> None:
    assert topic_config(MemqConfig(), "t", None, (), retention_ms=5_000).retention_ms == 5_000
    assert topic_config(MemqConfig(), "t", None, ("retention_bytes=1000",)).retention_bytes == 1_000
    with pytest.raises(ConfigError, match="--retention-ms 5000 and --set retention_ms=6000 disagree"):
        topic_config(MemqConfig(), "t", None, ("retention_ms=6000",), retention_ms=5_000)


def test_group_cutoff_is_the_oldest_member_cutoff_and_below_every_named_part() -> None:
    assert retention.group_cutoff([500, 300, 900], None, 50) == 300
    assert retention.group_cutoff([500, 300], 320, 50) == 270          # a retained pointer at 320
    assert retention.group_cutoff([500], 900, 50) == 500


def test_groups_of_lists_members_and_leaves_out_topics_with_their_own_objects() -> None:
    topics = {n: TopicConfig(n, storage_group=g) for n, g in (("a", "x"), ("b", ""), ("c", "x"), ("d", "shared"))}
    assert retention.groups_of(topics) == {"x": ["a", "c"], "shared": ["d"]}
