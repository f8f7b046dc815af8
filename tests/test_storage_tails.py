"""S3 as it misbehaves, through the fault proxy in front of the real moto server: a tail of
stalled answers (cut by hedged requests), and a storm of 503 SlowDown on one key prefix
(that prefix slowed down, the others untouched, nothing lost)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Callable, Iterator

import pytest
from tests.support.faultproxy import FaultPlan, FaultProxy
from prometheus_client import CollectorRegistry

from memq.config import MemqConfig, S3Config
from memq.storage import ObjectLocation, S3StorageHandler, StorageMetrics
from memq.storage.hedge import HEDGE_MIN_SAMPLES
from memq.storage.naming import prefix_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

STALL_S = 1.5


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return sum(s.value for f in registry.collect() for s in f.samples
               if s.name == name and labels.items() <= s.labels.items())


@pytest.fixture
def proxy(memq_config: MemqConfig) -> Iterator[FaultProxy]:
    with FaultProxy(memq_config.s3.endpoint_url or "") as p:
        yield p


def through(config: MemqConfig, proxy: FaultProxy, hedge_max_share: float) -> S3Config:
    return dataclasses.replace(config.s3, endpoint_url=proxy.url, read_timeout_s=10.0, base_backoff_s=0.01,
                               max_backoff_s=0.05, hedge_max_share=hedge_max_share)


async def slowest_of(handler: S3StorageHandler, proxy: FaultProxy, topic: str) -> tuple[float, float, list[ObjectLocation]]:
    """Warm the handler's latency windows, then PUT and GET under a stalled tail; the slowest
    PUT and GET (seconds) and the locations."""
    for i in range(HEDGE_MIN_SAMPLES + 10):
        loc = await handler.put_batch(topic, b"w" * 1000, first_request_id=i, timestamp_ms=1, broker_id="b")
        await handler.get_range(loc, 0, 1000)
    # A fifth of first attempts stall (a hedge, attempt 1, is not stalled again).
    proxy.set_plan(FaultPlan(mode="stall", fraction=0.2, stall_s=STALL_S, seed=4, methods=frozenset({"PUT"}),
                             path_contains="-a0"))
    locs, put_s = [], []
    for i in range(30):
        t0 = time.monotonic()
        locs.append(await handler.put_batch(topic, b"t" * 1000, first_request_id=1000 + i, timestamp_ms=2,
                                            broker_id="b"))
        put_s.append(time.monotonic() - t0)
    assert len(proxy.faults()) >= 3
    # The first GET of a fifth of the objects stalls (a hedge of the same object is not stalled).
    proxy.set_plan(FaultPlan(mode="stall", fraction=0.2, stall_s=STALL_S, seed=4, methods=frozenset({"GET"}),
                             once_per_path=True))
    get_s = []
    for loc in locs:
        t0 = time.monotonic()
        assert await handler.get_range(loc, 0, 1000) == b"t" * 1000
        get_s.append(time.monotonic() - t0)
    assert len(proxy.faults()) >= 3
    return max(put_s), max(get_s), locs


@pytest.mark.slow   # a soak (faults or scale played out for 20-60 s): `python -m bench soak`
async def test_hedged_requests_cut_a_stalled_tail(memq_config: MemqConfig, proxy: FaultProxy,
                                                  unique_name: Callable[[str], str]) -> None:
    registry = CollectorRegistry()
    handler = S3StorageHandler(through(memq_config, proxy, hedge_max_share=0.5), cluster=unique_name("c"),
                               metrics=StorageMetrics(registry), rng=random.Random(1))
    try:
        put_s, get_s, locs = await slowest_of(handler, proxy, "hedged")
        assert put_s < STALL_S / 2 and get_s < STALL_S / 2
        assert metric(registry, "memq_storage_hedges_total", op="put", outcome="won") >= 3
        assert metric(registry, "memq_storage_hedges_total", op="get_range", outcome="won") >= 3
        # A stalled PUT landed too (under its own attempt key); a listing names each batch once,
        # by its highest attempt: the hedge the call returned.
        listed = {i.location for i in await handler.list_topic("hedged", 2, 3)}
        assert listed == set(locs)
    finally:
        await handler.close()

    unhedged = S3StorageHandler(through(memq_config, proxy, hedge_max_share=0.0), cluster=unique_name("c"))
    try:
        proxy.set_plan(FaultPlan())
        put_s, get_s, _ = await slowest_of(unhedged, proxy, "unhedged")
        assert put_s >= STALL_S and get_s >= STALL_S
    finally:
        await unhedged.close()


async def test_a_slowdown_storm_on_one_prefix_slows_that_prefix_only_and_loses_nothing(
        memq_config: MemqConfig, proxy: FaultProxy, unique_name: Callable[[str], str]) -> None:
    storm_s = 2.0
    s3 = dataclasses.replace(memq_config.s3, endpoint_url=proxy.url, base_backoff_s=0.02, max_backoff_s=0.5,
                             max_attempts=1000, retry_budget_s=20.0, max_pool_connections=8, hedge_max_share=0.0)
    handler = S3StorageHandler(s3, cluster=unique_name("c"), rng=random.Random(2))
    hot = prefix_for(0)
    hot_ids = [i for i in range(5000) if prefix_for(i) == hot][:16]
    cold_ids = [i for i in range(5000) if prefix_for(i) != hot][:16]
    try:
        proxy.set_plan(FaultPlan(mode="slowdown", fraction=1.0, path_contains=f"/{hot}/"))
        storm_end = time.monotonic() + storm_s
        hot_puts = [asyncio.ensure_future(handler.put_batch("t", b"hot %d" % i, first_request_id=i, timestamp_ms=1,
                                                            broker_id="b")) for i in hot_ids]
        cold_s = []
        for i in cold_ids:                       # meanwhile the other prefixes answer as usual
            t0 = time.monotonic()
            await handler.put_batch("t", b"cold", first_request_id=i, timestamp_ms=1, broker_id="b")
            cold_s.append(time.monotonic() - t0)
        assert max(cold_s) < 0.5
        await asyncio.sleep(storm_end - time.monotonic())
        refused = len(proxy.faults())
        # Retrying each PUT on its own sends over 200 requests into this storm here (up to ~1,300 on
        # an idle machine: 16 x 2 s / 25 ms); the prefix's limit fell to 1 and its pauses grew instead.
        assert not any(p.done() for p in hot_puts) and 10 <= refused < 60
        proxy.set_plan(FaultPlan())              # S3 is healthy again
        t0 = time.monotonic()
        locs = await asyncio.gather(*hot_puts)   # none failed: backpressure, not errors
        assert time.monotonic() - t0 < 2.0       # the prefix recovers within its longest pause and a few rounds
        assert [await handler.get(loc) for loc in locs] == [b"hot %d" % i for i in hot_ids]
        assert {loc.key.split("/", 1)[0] for loc in locs} == {hot}
    finally:
        await handler.close()
