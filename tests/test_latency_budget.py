"""The latency budget: min_batch_bytes / max_batch_ms keep a trickle topic's batches filling.

The processor runs on the real file handler (the `Harness` of test_broker_processor); the
governed, real-S3 path of a topic created with these settings is in test_cost_cluster.py.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from tests.support.processor import Harness

from memq.config import TopicConfig, build
from memq.errors import ConfigError

SMALL = {"batch_ms": 50, "min_batch_bytes": 10_000, "max_batch_ms": 600}


def held(h: Harness) -> float:
    return h.metrics.registry.get_sample_value("memq_broker_held_batches_total", {"topic": "t1"}) or 0.0


async def test_a_small_batch_keeps_filling_past_batch_ms_until_max_batch_ms(tmp_path: Path) -> None:
    h = Harness(tmp_path, **SMALL)
    t0 = time.monotonic()
    await h.append(1)
    await asyncio.sleep(0.25)                   # five times batch_ms: still filling
    assert h.storage.puts == [] and held(h) == 1
    await h.append(2)                           # joins the same batch
    await h.wait_acks(2, timeout=5.0)
    assert time.monotonic() - t0 >= 0.55
    assert len(h.storage.puts) == 1 and {a.key for a in h.acks} == {h.storage.puts[0].key}


async def test_a_held_batch_seals_once_it_reaches_min_batch_bytes(tmp_path: Path) -> None:
    h = Harness(tmp_path, batch_ms=50, min_batch_bytes=2_000, max_batch_ms=60_000)
    await h.append(1, n=3, size=100)            # ~300 bytes
    await asyncio.sleep(0.15)
    assert h.storage.puts == [] and held(h) == 1
    await h.append(2, n=20, size=100)           # now over 2,000 bytes: no reason to wait on
    await h.wait_acks(2, timeout=2.0)
    assert len(h.storage.puts) == 1


async def test_a_batch_over_min_batch_bytes_seals_at_batch_ms(tmp_path: Path) -> None:
    h = Harness(tmp_path, batch_ms=50, min_batch_bytes=200, max_batch_ms=60_000)
    t0 = time.monotonic()
    await h.append(1, n=3, size=100)
    await h.wait_acks(1, timeout=2.0)
    assert time.monotonic() - t0 < 2.0 and held(h) == 0


async def test_a_producer_flush_still_seals_a_held_batch_at_once(tmp_path: Path) -> None:
    h = Harness(tmp_path, batch_ms=50, min_batch_bytes=10_000, max_batch_ms=60_000)
    await h.append(1)
    await asyncio.sleep(0.15)
    assert held(h) == 1
    await h.append(2, seal=True)
    await h.wait_acks(2, timeout=2.0)
    assert len(h.storage.puts) == 1


async def test_close_seals_a_held_batch(tmp_path: Path) -> None:
    h = Harness(tmp_path, batch_ms=50, min_batch_bytes=10_000, max_batch_ms=60_000)
    await h.append(1)
    await asyncio.sleep(0.15)
    async with asyncio.timeout(2.0):
        await h.proc.close()
    assert len(h.storage.puts) == 1 and [a.ok for a in h.acks] == [True]


def test_default_is_off() -> None:
    t = TopicConfig("t")
    assert (t.min_batch_bytes, t.max_batch_ms, t.hold_until_ms) == (0, None, t.batch_ms)


@pytest.mark.parametrize(("settings", "message"), [
    ({"batch_ms": 250, "max_batch_ms": 100}, "max_batch_ms 100 must be >= batch_ms 250"),
    ({"min_batch_bytes": 1024}, "min_batch_bytes 1024 needs max_batch_ms > batch_ms"),
    ({"min_batch_bytes": 1024, "max_batch_ms": 250}, "needs max_batch_ms > batch_ms"),
    ({"batch_bytes": 4096, "max_message_bytes": 4096, "min_batch_bytes": 8192, "max_batch_ms": 1000},
     "min_batch_bytes 8192 must be <= batch_bytes 4096"),
    ({"min_batch_bytes": -1}, "min_batch_bytes = -1 is out of range"),
    ({"max_batch_ms": 0}, "max_batch_ms = 0 is out of range"),
])
def test_bad_latency_budgets_name_the_settings(settings: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build(TopicConfig, {"name": "t", **settings}, "topic t")


def test_a_latency_budget_from_strings_as_memq_topic_create_set_passes_them() -> None:
    t = build(TopicConfig, {"name": "t", "min_batch_bytes": "1048576", "max_batch_ms": "60000"}, "topic t")
    assert (t.min_batch_bytes, t.hold_until_ms) == (1 << 20, 60_000)
