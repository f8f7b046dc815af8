"""A SlowDown storm gets fewer requests, not more: the storage reports the share of throttle
answers (`pressure`) and the broker's batches grow while it lasts (fewer, larger PUTs), with no
failed ack, and shrink back once the store is healthy.

The storm test runs a TopicProcessor on the real S3 handler against a small S3 on 127.0.0.1
that answers a share of requests `503 SlowDown`, as S3 does when a prefix is over its rate.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from tests.support.clock import FakeClock
from tests.support.processor import Harness, MemoryPublisher, message
from tests.support.appending import append

from memq.broker.storage_group import MAX_THROTTLED_AGE_S, throttled_age_s
from memq.broker.metrics import BrokerMetrics
from memq.broker.processor import TopicProcessor
from memq.chaos.s3faults import slowdown_body
from memq.config import S3Config, TopicConfig
from memq.format.wire import Ack, AckLevel
from memq.storage import S3StorageHandler
from memq.storage.pressure import ThrottleShare

pytestmark = pytest.mark.timeout(120)


def test_the_throttle_share_follows_a_storm_and_forgets_it() -> None:
    clock = FakeClock()
    share = ThrottleShare(half_life_s=1.0, clock=clock)
    assert share.share() == 0.0
    share.add(True)
    clock.advance(3.0)
    assert share.share() < 0.05                   # a lone throttle is soon forgotten
    clock.advance(10.0)
    for i in range(100):                          # a storm: 3 in 10 answers refused
        share.add(i % 10 in (1, 4, 7))
        clock.advance(0.05)
    assert 0.2 < share.share() < 0.4
    storm = share.share()
    clock.advance(1.0)                            # healthy, and no request for a half-life
    assert share.share() == pytest.approx(storm / 2, rel=0.05)
    for _ in range(20):                           # then 1 s of successes
        share.add(False)
        clock.advance(0.05)
    assert share.share() < 0.05


def test_a_throttled_store_stretches_the_batch_age_within_bounds() -> None:
    assert throttled_age_s(250, 0.0) == 0.25
    assert throttled_age_s(250, 0.3) == pytest.approx(1.0)          # 4x at S3's 30% storm
    assert throttled_age_s(250, 1.0) == MAX_THROTTLED_AGE_S         # capped well under a request timeout
    assert throttled_age_s(5_000, 1.0) == 5.0                       # never shorter than batch_ms


async def test_a_batch_keeps_filling_past_batch_ms_while_the_store_throttles(tmp_path: Path) -> None:
    h = Harness(tmp_path, batch_ms=50)
    h.storage.throttled_share = 0.3               # the batch may grow to 200 ms
    t0 = time.monotonic()
    await h.append(1)
    await asyncio.sleep(0.1)                      # past batch_ms: joins the same batch
    await h.append(2)
    await h.wait_acks(2)
    assert time.monotonic() - t0 >= 0.19
    assert len(h.storage.puts) == 1
    assert stretched(h) == 1
    h.storage.throttled_share = 0.0               # healthy: the next batch seals at batch_ms
    await h.append(3)
    await h.wait_acks(3)
    assert len(h.storage.puts) == 2 and stretched(h) == 1


def stretched(h: Harness) -> float:
    return h.metrics.registry.get_sample_value("memq_broker_throttled_batches_total", {"topic": "t1"}) or 0.0


class SlowDownS3:
    """Answers PUTs (200 with an ETag) and refuses `share` of all requests with 503 SlowDown,
    stamping every request it gets."""

    def __init__(self) -> None:
        self.share = 0.0
        self.stamps: list[float] = []
        self._rng = random.Random(7)

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.stamps.append(time.monotonic())
        if self._rng.random() < self.share:
            return web.Response(status=503, body=slowdown_body(request.path), content_type="application/xml")
        return web.Response(status=200, headers={"ETag": '"0"'})

    def rate(self, start: float, end: float) -> float:
        return sum(start <= t < end for t in self.stamps) / (end - start)


async def s3_on_loopback(fake: SlowDownS3) -> AsyncIterator[str]:
    app = web.Application(client_max_size=64 << 20)
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]   # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_slowdown_storm_gets_fewer_requests_per_second_and_no_failed_ack(tmp_path: Path) -> None:
    fake = SlowDownS3()
    urls = s3_on_loopback(fake)
    url = await anext(urls)
    s3 = S3Config(endpoint_url=url, bucket="b", access_key_id="k", secret_access_key="s", base_backoff_s=0.02,
                  max_backoff_s=0.2, hedge_max_share=0.0)
    storage = S3StorageHandler(s3, cluster="c")
    acks: list[Ack] = []
    proc = TopicProcessor(TopicConfig(name="t", batch_ms=40, ring_slots=8), cluster="c", broker_id="b1",
                          storage=storage, publisher=MemoryPublisher(), metrics=BrokerMetrics("b1"))
    seq = 0

    async def produce_for(seconds: float) -> tuple[float, float]:
        """Append a Message every 10 ms (paced, as the chaos producers): (start, end) monotonic."""
        nonlocal seq
        start = time.monotonic()
        while time.monotonic() < start + seconds:
            seq += 1
            await append(proc, message(seq), seq, AckLevel.ALL, acks.append)
            await asyncio.sleep(0.01)
        return start, time.monotonic()

    try:
        before = await produce_for(2.0)
        fake.share = 0.3
        storm = await produce_for(4.0)
        fake.share = 0.0
        after = await produce_for(4.0)
        await proc.close()
    finally:
        await storage.close()
        await anext(urls, None)
    rps_before, rps_storm = fake.rate(*before), fake.rate(*storm)
    rps_late = fake.rate(after[0] + 2.0, after[1])     # the share has decayed by then
    print(f"S3 requests/s: {rps_before:.1f} before, {rps_storm:.1f} in the storm, {rps_late:.1f} after")
    assert len(acks) == seq and all(a.ok for a in acks), [a for a in acks if not a.ok][:3]
    assert rps_storm < 0.8 * rps_before, (rps_before, rps_storm)
    assert rps_late > 1.5 * rps_storm, (rps_storm, rps_late)
