"""Per-prefix admission (AIMD limit and pause after SlowDown), without a network."""

from __future__ import annotations

import asyncio
import random

import pytest

from memq.errors import ConfigError
from memq.storage.throttle import PrefixThrottle


class Longest(random.Random):
    """Every jittered pause at its longest, so a test knows it."""

    def uniform(self, a: float, b: float) -> float:
        return b


async def test_a_throttled_prefix_pauses_and_halves_its_limit_while_others_go_on() -> None:
    throttle = PrefixThrottle(8, 0.1, 0.2, rng=Longest())
    for _ in range(8):
        await throttle.acquire("aa")
    throttle.release("aa", throttled=True)              # one SlowDown: limit 8 -> 4, pause 0.2 s
    throttle.release("aa", throttled=True)              # the same burst: the limit is cut once
    assert throttle.limit("aa") == 4 and throttle.throttled("aa")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await asyncio.wait_for(throttle.acquire("bb"), 0.05)   # another prefix: no wait at all
    assert not throttle.throttled("bb")
    waiting = asyncio.ensure_future(throttle.acquire("aa"))
    await asyncio.sleep(0.3)                             # the pause is over, but 6 in flight > 4
    assert not waiting.done()
    for _ in range(2):
        throttle.release("aa", throttled=None)           # failures that say nothing of the rate
    await asyncio.sleep(0.01)
    assert not waiting.done()                            # 4 in flight: still at the limit
    throttle.release("aa", throttled=None)
    await asyncio.wait_for(waiting, 1)
    assert loop.time() - t0 >= 0.2
    for _ in range(4):
        throttle.release("aa", throttled=False)          # successes: +1 each, back to 8
    assert throttle.limit("aa") == 8 and not throttle.throttled("aa")


async def test_consecutive_throttles_pause_longer_and_a_success_resets_them() -> None:
    throttle = PrefixThrottle(4, 0.05, 1.0, rng=Longest())
    loop = asyncio.get_running_loop()
    pauses = []
    for _ in range(3):
        await throttle.acquire("cc")
        throttle.release("cc", throttled=True)
        t0 = loop.time()
        await throttle.acquire("cc")
        pauses.append(loop.time() - t0)
        throttle.release("cc", throttled=None)
    assert pauses[0] >= 0.09 and pauses[1] >= 0.19 and pauses[2] >= 0.39   # 0.05 * 2**strikes
    assert throttle.limit("cc") == 1
    await throttle.acquire("cc")
    throttle.release("cc", throttled=False)              # the next throttle starts from one strike
    await throttle.acquire("cc")
    throttle.release("cc", throttled=True)
    t0 = loop.time()
    await throttle.acquire("cc")
    assert 0.09 <= loop.time() - t0 < 0.19


async def test_run_counts_only_throttle_answers_against_the_prefix() -> None:
    throttle = PrefixThrottle(4, 0.0, 0.0)

    async def slowdown() -> None:
        raise RuntimeError("SlowDown")

    async def other() -> None:
        raise ValueError("bad")

    with pytest.raises(RuntimeError):
        await throttle.run("dd", slowdown, lambda e: isinstance(e, RuntimeError))
    assert throttle.limit("dd") == 2
    with pytest.raises(ValueError):
        await throttle.run("dd", other, lambda e: isinstance(e, RuntimeError))
    assert throttle.limit("dd") == 2
    assert await throttle.run("dd", lambda: asyncio.sleep(0, "ok"), lambda e: False) == "ok"
    assert throttle.limit("dd") == 3


def test_one_throttle_serves_successive_event_loops() -> None:
    throttle = PrefixThrottle(1, 0.0, 0.0)

    async def hold_then_contend() -> None:
        await throttle.acquire("ee")
        second = asyncio.ensure_future(throttle.acquire("ee"))
        await asyncio.sleep(0.01)
        assert not second.done()
        throttle.release("ee", throttled=False)
        await asyncio.wait_for(second, 1)
        throttle.release("ee", throttled=False)

    asyncio.run(hold_then_contend())
    asyncio.run(hold_then_contend())
    with pytest.raises(ConfigError):
        PrefixThrottle(0, 0.1, 0.2)
