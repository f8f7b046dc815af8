"""Streaming ack=all records through a fault and checking what a default reader delivers: each acked
record once (the duplicate-free invariant across stalls)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections import Counter
from collections.abc import Callable
from memq.client.consumer import Consumer, ConsumerMetrics
from memq.client.producer import Producer
from memq.config import MemqConfig
from tests.support.cluster import producer_config, read_stored


def drain(config: MemqConfig, topic: str, want: set[bytes], *, dedup: bool,
          timeout_s: float = 60) -> tuple[Counter[bytes], ConsumerMetrics]:
    """Every value a fresh group reads: until all of `want` came and 2 s passed with nothing."""
    cc = dataclasses.replace(config.consumer, group_id=f"dedup-{uuid.uuid4().hex[:8]}", dedup=dedup)
    got: Counter[bytes] = Counter()
    with Consumer(dataclasses.replace(config, consumer=cc), topic) as c:
        deadline = time.monotonic() + timeout_s
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            batch = [bytes(r.value) for r in c.poll(0.5)]
            got.update(batch)
            if batch or not want <= set(got):
                quiet_since = time.monotonic() if batch else quiet_since
            elif time.monotonic() - quiet_since > 2:
                break
        return got, c.metrics


def duplicates(got: Counter[bytes]) -> int:
    return sum(n - 1 for n in got.values())


async def stream(config: MemqConfig, url: str, topic: str, fault: Callable[[], None], heal: Callable[[], None],
                 *, run_s: float = 14, fault_at_s: float = 3, fault_s: float = 6) -> set[bytes]:
    """Send unique values with ack=all for `run_s`, faulting from `fault_at_s` for `fault_s`;
    the values acked."""
    futures: dict[bytes, asyncio.Future[object]] = {}
    pc = producer_config(url, request_timeout_ms=3_000, delivery_timeout_ms=40_000, linger_ms=5)
    async with Producer(pc) as p:
        t0 = time.monotonic()
        faulted = healed = False
        i = 0
        while time.monotonic() - t0 < run_s:
            elapsed = time.monotonic() - t0
            if not faulted and elapsed >= fault_at_s:
                fault()
                faulted = True
            if faulted and not healed and elapsed >= fault_at_s + fault_s:
                heal()
                healed = True
            for _ in range(20):
                value = b"v-%08d" % i
                futures[value] = await p.send(topic, value)
                i += 1
            await asyncio.sleep(0.01)
        if not healed:
            heal()
        await asyncio.gather(*futures.values(), return_exceptions=True)
    return {v for v, f in futures.items() if not f.cancelled() and f.exception() is None}


async def check_no_duplicates_delivered(config: MemqConfig, topic: str, acked: set[bytes]) -> None:
    stored, stored_dups, _ = await read_stored(config, topic)
    got, metrics = await asyncio.to_thread(drain, config, topic, acked, dedup=True)
    raw, _ = await asyncio.to_thread(drain, config, topic, acked, dedup=False)
    print(f"acked {len(acked)}, stored {len(stored)} LogMessages ({sum(stored_dups.values())} stored twice), "
          f"delivered {sum(got.values())} with {duplicates(got)} duplicates "
          f"(dropped {metrics.duplicates_dropped}); without dedup {duplicates(raw)} duplicates")
    assert len(acked) > 1_000
    assert acked <= set(got)                                   # nothing acked is lost
    assert duplicates(got) == 0                                # nothing delivered twice
    assert set(raw) == set(got)
    assert metrics.duplicates_dropped == duplicates(raw)       # what was dropped is what dedup=false delivers
