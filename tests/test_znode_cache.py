"""ZnodeCache: one read per change, and never a value an invalidation overtook."""

from __future__ import annotations

import pytest

from memq.governor.znode_cache import ZnodeCache


def test_a_value_is_read_once_until_invalidated() -> None:
    cache = ZnodeCache()
    reads: list[str] = []

    def load() -> str:
        reads.append("x")
        return f"v{len(reads)}"

    assert cache.get("k", load) == "v1"
    assert cache.get("k", load) == "v1"
    assert cache.loads == 1
    cache.invalidate("k")
    assert cache.get("k", load) == "v2"
    assert cache.loads == 2 and len(cache) == 1


def test_a_read_overtaken_by_its_invalidation_is_returned_but_not_kept() -> None:
    """The watch fired while the read was in flight: what it returned may predate the change."""
    cache = ZnodeCache()

    def racing_load() -> str:
        cache.invalidate("k")
        return "old"

    assert cache.get("k", racing_load) == "old"
    assert cache.get("k", lambda: "new") == "new"
    assert cache.get("k", lambda: "other") == "new"


def test_clear_drops_values_and_what_reads_in_flight_would_store() -> None:
    cache = ZnodeCache()
    cache.get("a", lambda: 1)

    def load_during_clear() -> int:
        cache.clear()
        return 2

    assert cache.get("b", load_during_clear) == 2
    assert len(cache) == 0
    assert cache.get("a", lambda: 3) == 3


def test_a_failed_read_is_not_kept_and_leaves_no_trace() -> None:
    cache = ZnodeCache()

    def failing() -> int:
        raise LookupError("no node")

    with pytest.raises(LookupError):
        cache.get("k", failing)
    assert cache.get("k", lambda: 5) == 5
    assert cache.get("k", lambda: 6) == 5
    assert not cache._loading and not cache._overtaken
