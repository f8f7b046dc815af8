"""Hedged requests without a network: a fake transport of coroutines that answer when told."""

from __future__ import annotations

import asyncio

import pytest

from memq.errors import ConfigError
from memq.storage.hedge import BURST, HEDGE_MIN_SAMPLES, Hedger, first_of, size_class


class FakeRequest:
    """One request of the fake transport: answers `value` (or raises `error`) after `delay_s`."""

    def __init__(self, value: str, delay_s: float, error: Exception | None = None) -> None:
        self.value, self.delay_s, self.error = value, delay_s, error
        self.started = self.cancelled = False

    async def __call__(self) -> str:
        self.started = True
        try:
            await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if self.error is not None:
            raise self.error
        return self.value


async def test_a_slow_first_request_loses_to_its_hedge_and_is_cancelled() -> None:
    slow, fast = FakeRequest("first", 5.0), FakeRequest("second", 0.01)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await first_of(slow(), 0.05, fast) == ("second", 1)
    assert loop.time() - t0 < 1.0
    await asyncio.sleep(0)
    assert slow.cancelled and not fast.cancelled


async def test_a_request_answering_within_the_delay_is_not_hedged() -> None:
    quick, spare = FakeRequest("first", 0.01), FakeRequest("second", 0.01)
    assert await first_of(quick(), 0.5, spare) == ("first", 0)
    assert not spare.started
    assert await first_of(FakeRequest("unhedged", 0.01)(), None, spare) == ("unhedged", 0)
    assert not spare.started


async def test_the_hedge_is_skipped_when_not_allowed_and_failures_fall_to_the_other() -> None:
    assert await first_of(FakeRequest("first", 0.1)(), 0.01, lambda: None) == ("first", 0)
    failing = FakeRequest("first", 0.05, RuntimeError("first failed"))
    assert await first_of(failing(), 0.01, FakeRequest("second", 0.2)) == ("second", 1)
    both = FakeRequest("second", 0.1, RuntimeError("second failed"))
    with pytest.raises(RuntimeError, match="second failed"):   # the later failure
        await first_of(FakeRequest("first", 0.05, RuntimeError("first failed"))(), 0.01, both)


async def test_cancelling_the_caller_cancels_both_requests() -> None:
    one, two = FakeRequest("first", 5.0), FakeRequest("second", 5.0)
    call = asyncio.ensure_future(first_of(one(), 0.01, two))
    await asyncio.sleep(0.1)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert one.cancelled and two.cancelled


async def test_hedger_waits_for_the_percentile_of_its_kind_and_bounds_the_share() -> None:
    hedger = Hedger(95.0, 0.05, 0.0)
    for i in range(HEDGE_MIN_SAMPLES - 1):
        hedger.observe("put:3", 0.010 + i / 10_000)
    assert hedger.delay("put:3") is None                      # too few samples yet
    hedger.observe("put:3", 0.5)
    assert hedger.delay("put:3") == pytest.approx(0.0147)     # p95 of 0.010..0.0148 and one 0.5
    assert hedger.delay("put:8") is None                      # another size class learns its own
    assert Hedger(95.0, 0.05, 0.1).delay("put:3") is None
    floor = Hedger(95.0, 0.05, 0.1)
    for _ in range(HEDGE_MIN_SAMPLES):
        floor.observe("get", 0.001)
    assert floor.delay("get") == 0.1                          # never sooner than the floor

    admitted = 0
    for _ in range(2000):                                     # every request slow: all want a hedge
        hedger.delay("put:3")
        admitted += hedger.admit()
    assert 0.05 * 2000 - 1 <= admitted <= 0.05 * 2000 + BURST
    off = Hedger(95.0, 0.0, 0.02)
    for _ in range(HEDGE_MIN_SAMPLES):
        off.observe("get", 0.01)
    assert off.delay("get") is None
    with pytest.raises(ConfigError):
        Hedger(100.0, 0.05, 0.02)


async def test_a_cancelled_loser_still_counts_as_slow() -> None:
    """Only winners' latencies would drift the percentile down, and hedges up, each round."""
    hedger = Hedger(99.0, 0.5, 0.0)
    for _ in range(HEDGE_MIN_SAMPLES - 1):
        hedger.observe("get", 0.01)
    loser = asyncio.ensure_future(hedger.timed("get", FakeRequest("slow", 5.0)))
    await asyncio.sleep(0.1)
    loser.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loser
    delay = hedger.delay("get")
    assert delay is not None and delay >= 0.09


def test_size_classes_group_sizes_within_8x() -> None:
    assert size_class(1024) == size_class(2000) != size_class(64 * 1024) != size_class(8 << 20)
    assert size_class(0) == size_class(1)


async def test_a_settled_put_names_the_hedge_when_both_land() -> None:
    """A PUT's hedge writes a higher attempt key; if it lands, the caller must name it."""
    first, hedge = FakeRequest("a0", 0.1), FakeRequest("a1", 0.1)
    assert await first_of(first(), 0.02, hedge, settle=True) == ("a1", 1)
    assert not first.cancelled and not hedge.cancelled
    failing = FakeRequest("a1", 0.1, RuntimeError("hedge failed"))
    assert await first_of(FakeRequest("a0", 0.1)(), 0.02, failing, settle=True) == ("a0", 0)
    slow = FakeRequest("a0", 5.0)
    assert await first_of(slow(), 0.02, FakeRequest("a1", 0.02), settle=True) == ("a1", 1)
    await asyncio.sleep(0)
    assert slow.cancelled
