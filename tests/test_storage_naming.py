"""Unit tests of the object key layout, listing merge and retry schedule (no I/O)."""

from __future__ import annotations

import asyncio
import collections
import random
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memq.errors import ConfigError, InvalidInputError
from memq.storage.base import ObjectInfo, ObjectLocation
from memq.storage.listing import list_all_prefixes
from memq.storage.naming import (MAX_TIMESTAMP_MS, PREFIXES, make_key, parse_key, prefix_for,
                                 home_dir, start_after, topic_home)
from memq.storage.retry import RetryPolicy

names = st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True)


@given(cluster=names, topic=names, broker=names, rid=st.integers(0, 2**64 - 1),
       ts=st.integers(0, MAX_TIMESTAMP_MS), unique=st.from_regex(r"[0-9a-f]{1,16}", fullmatch=True),
       attempt=st.integers(0, 99))
def test_key_round_trips_through_parser(cluster: str, topic: str, broker: str, rid: int, ts: int,
                                        unique: str, attempt: int) -> None:
    key = make_key(cluster=cluster, topic=topic, first_request_id=rid, timestamp_ms=ts,
                   broker_id=broker, unique=unique, attempt=attempt)
    text = str(key)
    assert text.startswith(f"{prefix_for(rid)}/{cluster}/topics/{topic}/{ts:013d}-")
    assert text.endswith(f"-{broker}-{unique}-a{attempt}")
    assert parse_key(text) == key


def test_key_layout_is_pinned() -> None:
    """Existing objects' prefixes must never move: the hash is part of the storage format."""
    key = make_key(cluster="prod", topic="orders", first_request_id=7, timestamp_ms=1_700_000_000_123,
                   broker_id="b-1", unique="00ff", attempt=2)
    assert str(key) == "61/prod/topics/orders/1700000000123-b-1-00ff-a2"


def test_prefix_is_stable_across_interpreters() -> None:
    """Unlike hash(), the prefix must not depend on PYTHONHASHSEED."""
    code = "from memq.storage.naming import prefix_for; print(','.join(prefix_for(i) for i in range(50)))"
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": seed}, timeout=60).stdout for seed in ("1", "2")}
    assert outs == {",".join(prefix_for(i) for i in range(50)) + "\n"}


def test_prefixes_spread_sequential_request_ids_evenly() -> None:
    counts = collections.Counter(prefix_for(i) for i in range(25_600))
    assert set(counts) == set(PREFIXES)
    assert 50 <= min(counts.values()) and max(counts.values()) <= 160  # mean 100


def test_keys_sort_by_time_within_a_prefix() -> None:
    ts = [5, 1_000, 999, 10**12, 42, MAX_TIMESTAMP_MS]
    keys = [str(make_key(cluster="c", topic="t", first_request_id=1, timestamp_ms=t, broker_id="b",
                         unique="ab", attempt=0)) for t in ts]
    assert [parse_key(k).timestamp_ms for k in sorted(keys)] == sorted(ts)


def test_start_after_splits_keys_at_the_start_time() -> None:
    p = prefix_for(3)
    mark = start_after(home_dir(p, "c", topic_home("t")), 1_000)
    before = str(make_key(cluster="c", topic="t", first_request_id=3, timestamp_ms=999,
                          broker_id="zz", unique="ff", attempt=9))
    at = str(make_key(cluster="c", topic="t", first_request_id=3, timestamp_ms=1_000,
                      broker_id="0", unique="0", attempt=0))
    assert before < mark < at
    assert mark.startswith(home_dir(p, "c", "topics/t"))


@pytest.mark.parametrize("bad", [
    "61/c/topics/t/1700000000123-b-00ff",            # no attempt
    "61/c/topics/t/170000000012-b-00ff-a0",          # 12-digit time
    "61/c/topics/t/1700000000123-b-00FF-a0",         # uppercase unique
    "zz/c/topics/t/1700000000123-b-00ff-a0",         # not a hex prefix
    "61/c/tables/t/1700000000123-b-00ff-a0",
    "61/c/topics/t/x/1700000000123-b-00ff-a0",
    "../../etc/passwd",
    "61/c/topics/t/.1700000000123-b-00ff-a0.x.tmp",  # a file handler temp file
])
def test_parse_rejects_foreign_keys(bad: str) -> None:
    with pytest.raises(InvalidInputError):
        parse_key(bad)


@pytest.mark.parametrize("kwargs", [
    {"topic": "a/b"}, {"topic": ""}, {"cluster": "x y"}, {"broker_id": "b/1"},
    {"first_request_id": -1}, {"first_request_id": 2**64}, {"timestamp_ms": -1},
    {"timestamp_ms": MAX_TIMESTAMP_MS + 1}, {"unique": "XYZ"}, {"attempt": -1},
])
def test_make_key_rejects_bad_parts(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"cluster": "c", "topic": "t", "first_request_id": 1, "timestamp_ms": 1,
                               "broker_id": "b", "unique": "ab", "attempt": 0}
    args.update(kwargs)
    with pytest.raises(InvalidInputError):
        make_key(**args)  # type: ignore[arg-type]


def test_full_jitter_backoff_stays_under_the_exponential_cap() -> None:
    policy = RetryPolicy(max_attempts=10, base_backoff_s=0.1, max_backoff_s=1.0)
    rng = random.Random(1)
    for retry, cap in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        delays = [policy.delay_s(retry, rng) for _ in range(500)]
        assert all(0 <= d <= cap for d in delays)
        assert max(delays) > 0.8 * cap  # jitter spans the whole window, not a fixed sleep


@pytest.mark.parametrize("args", [(0, 0.1, 1.0), (3, -0.1, 1.0), (3, 2.0, 1.0)])
def test_retry_policy_rejects_bad_settings(args: tuple[int, float, float]) -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(*args)


async def test_listing_keeps_only_the_latest_attempt_of_each_batch() -> None:
    def info(ts: int, unique: str, attempt: int, rid: int = 1) -> ObjectInfo:
        key = str(make_key(cluster="c", topic="t", first_request_id=rid, timestamp_ms=ts, broker_id="b",
                           unique=unique, attempt=attempt))
        return ObjectInfo(ObjectLocation("bk", key), 10, ts)

    stored = {prefix_for(1): [info(5, "aa", 0), info(5, "aa", 2), info(3, "bb", 0), info(5, "aa", 10)],
              prefix_for(2): [info(4, "aa", 0, rid=2), info(4, "aa", 1, rid=2)]}

    async def list_prefix(prefix: str) -> list[ObjectInfo]:
        await asyncio.sleep(0)
        return stored.get(prefix, [])

    got = await list_all_prefixes(list_prefix, concurrency=4)
    assert got == [info(3, "bb", 0), info(4, "aa", 1, rid=2), info(5, "aa", 10)]


def test_group_keys_name_the_group_and_parse_back() -> None:
    """A storage group's shared object lives under groups/<group>/ (what a bucket policy scopes)."""
    key = make_key(cluster="prod", topic="ignored", group="payments", first_request_id=7,
                   timestamp_ms=1_700_000_000_123, broker_id="b-1", unique="ab", attempt=2)
    text = str(key)
    assert text.split("/")[1:4] == ["prod", "groups", "payments"]
    assert "ignored" not in text
    parsed = parse_key(text)
    assert parsed == key and (parsed.group, parsed.topic, parsed.attempt) == ("payments", "", 2)
    assert parse_key(str(make_key(cluster="prod", topic="t", first_request_id=7, timestamp_ms=1,
                                  broker_id="b", unique="ab", attempt=0))).group == ""
    with pytest.raises(InvalidInputError, match="storage group"):
        make_key(cluster="c", topic="t", group="a/b", first_request_id=1, timestamp_ms=1, broker_id="b",
                 unique="ab", attempt=0)
    with pytest.raises(InvalidInputError, match="not a memq batch key"):
        parse_key("ab/prod/other/x/0000000000001-b-ab-a0")


def test_storage_metrics_label_a_groups_objects_by_group() -> None:
    """Requests on shared objects are priced per group (`memq cost` splits them by bytes)."""
    from memq.storage.metrics import topic_of
    assert topic_of("s3://b/ab/prod/topics/orders/0000000000001-b-ab-a0") == "orders"
    assert topic_of("ab/prod/groups/shared/") == "group:shared"
    assert topic_of("s3://b (3 keys from x)") == ""
