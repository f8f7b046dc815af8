"""An S3 outage of several seconds (every connection dropped by the fault proxy in front of
the real moto server): a PUT keeps retrying with backoff for as long as its ack can still be
on time, lands once S3 is back, and fails with the typed error once the time budget is spent."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterator

import pytest
from tests.support.faultproxy import FaultPlan, FaultProxy

from memq.config import MemqConfig, ProducerConfig
from memq.errors import RetryBudgetExhaustedError
from memq.storage import S3StorageHandler, make_storage, retry_budget_s

pytestmark = pytest.mark.integration

OUTAGE_S = 4.0
DOWN = FaultPlan(mode="reset", fraction=1.0)     # every request: the connection drops, no answer


@pytest.fixture
def proxy(memq_config: MemqConfig) -> Iterator[FaultProxy]:
    with FaultProxy(memq_config.s3.endpoint_url or "") as p:
        yield p


def through(config: MemqConfig, proxy: FaultProxy, **s3: float) -> MemqConfig:
    return dataclasses.replace(config, s3=dataclasses.replace(config.s3, endpoint_url=proxy.url, **s3))


async def test_a_put_outlasts_an_outage_of_several_seconds(memq_config: MemqConfig, proxy: FaultProxy,
                                                           unique_name: Callable[[str], str]) -> None:
    handler = make_storage(through(memq_config, proxy))   # the defaults a broker runs with
    try:
        proxy.set_plan(DOWN)
        put = asyncio.ensure_future(handler.put_batch(unique_name("t"), b"through the outage",
                                                      first_request_id=1, timestamp_ms=1, broker_id="b"))
        await asyncio.sleep(OUTAGE_S)
        assert not put.done()                         # still retrying, not failed
        assert len(proxy.faults()) >= 3
        proxy.set_plan(FaultPlan())                   # S3 is back
        loc = await asyncio.wait_for(put, 10)
        assert await handler.get(loc) == b"through the outage"
    finally:
        await handler.close()


async def test_past_its_time_budget_a_put_fails_with_the_typed_error(memq_config: MemqConfig, proxy: FaultProxy,
                                                                    unique_name: Callable[[str], str]) -> None:
    config = through(memq_config, proxy, retry_budget_s=1.5)
    handler = make_storage(config)
    assert isinstance(handler, S3StorageHandler)
    try:
        proxy.set_plan(DOWN)
        t0 = time.monotonic()
        with pytest.raises(RetryBudgetExhaustedError, match="retry_budget_s 1.5"):
            await handler.put_batch(unique_name("t"), b"x", first_request_id=1, timestamp_ms=1, broker_id="b")
        assert time.monotonic() - t0 < 1.5 + 2.0       # the budget, plus at most one attempt
        assert len(proxy.faults()) >= 2
    finally:
        await handler.close()


def test_the_budget_leaves_room_for_the_ack_within_the_producers_request_timeout() -> None:
    base = MemqConfig()
    assert retry_budget_s(base) == base.s3.retry_budget_s == 20.0
    short = dataclasses.replace(base, producer=ProducerConfig(request_timeout_ms=6_000))
    assert retry_budget_s(short) == pytest.approx(4.0)
