"""SingleFlight: the one way the client shares an in-flight connect or metadata refresh."""

from __future__ import annotations

import asyncio

import pytest

from memq.client._singleflight import SingleFlight


async def test_concurrent_callers_share_one_call_and_the_next_call_runs_again() -> None:
    flight: SingleFlight[str, int] = SingleFlight()
    calls = 0
    gate = asyncio.Event()

    async def call() -> int:
        nonlocal calls
        calls += 1
        await gate.wait()
        return calls

    waiters = [asyncio.create_task(flight.run("k", call)) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    assert await asyncio.gather(*waiters) == [1] * 5
    assert calls == 1
    assert await flight.run("k", call) == 2   # finished flights are not cached


async def test_a_failure_reaches_every_waiter() -> None:
    flight: SingleFlight[str, int] = SingleFlight()
    gate = asyncio.Event()

    async def call() -> int:
        await gate.wait()
        raise ConnectionRefusedError("down")

    waiters = [asyncio.create_task(flight.run("k", call)) for _ in range(3)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, ConnectionRefusedError) for r in results)


async def test_a_cancelled_waiter_does_not_cancel_the_shared_call() -> None:
    flight: SingleFlight[str, str] = SingleFlight()
    gate = asyncio.Event()

    async def call() -> str:
        await gate.wait()
        return "ok"

    owner = asyncio.create_task(flight.run("k", call))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(flight.run("k", call))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    gate.set()
    assert await owner == "ok"
