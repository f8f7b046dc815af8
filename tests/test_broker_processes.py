"""Real broker processes: SIGKILL mid-stream loses no acked message; slow storage keeps the
broker's memory bounded while producers see waits or clear errors."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from memq.client.producer import Delivery, Producer
from memq.config import MemqConfig
from memq.devcluster import DevCluster
from memq.devcluster.broker_process import BrokerProcess
from memq.devcluster.process import free_port
from memq.errors import MemqError
from tests.support.faultproxy import FaultPlan, FaultProxy
from tests.support.cluster import producer_config, read_notifications, read_stored, topic_config

pytestmark = pytest.mark.integration


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def with_port(config: MemqConfig, port: int, broker_id: str) -> MemqConfig:
    return dataclasses.replace(config, broker=dataclasses.replace(config.broker, port=port, broker_id=broker_id))


async def test_sigkill_loses_no_acked_message(devcluster: DevCluster, unique_name: Callable[[str], str],
                                              tmp_path: Path) -> None:
    topic = unique_name("kill")
    config = with_port(devcluster.config(topics=[topic_config(topic, batch_ms=50)]), free_port(), "k1")
    broker = BrokerProcess(config, tmp_path).start()
    acked: list[Delivery] = []
    failed: list[BaseException] = []
    values_sent = 0
    try:
        async with Producer(producer_config(broker.url, retries=8, retry_backoff_ms=200,
                                            request_timeout_ms=5_000, max_block_ms=20_000)) as p:
            futures = []
            for i in range(300):                      # ~60k LogMessages over a few seconds
                values = [b"kill-%d-%d" % (i, j) for j in range(200)]
                futures.append(await p.send_many(topic, values))
                values_sent += len(values)
                await asyncio.sleep(0.01)
                if i == 100:
                    broker.kill()                     # crash: nothing flushed
                if i == 130:
                    broker = BrokerProcess(config, tmp_path).start()   # same port: producer retries land
            for f in asyncio.as_completed(futures):
                try:
                    acked.extend(await f)
                except MemqError as e:
                    failed.append(e)
    finally:
        broker.stop()
    acked_values = sum(d.count for d in acked)
    assert acked_values + 200 * len(failed) == values_sent
    assert acked_values > values_sent // 2          # retries after the restart got through
    stored, _dups, keys = await read_stored(config, topic)
    stored_keys = {(pid, seq) for pid, _e, seq, _pos in stored}
    missing = [d for d in acked if (d.producer_id, d.sequence) not in stored_keys]
    assert missing == []                                # every acked Message is in S3 ...
    notes = {n.key for n in read_notifications(devcluster.kafka_bootstrap or "", f"memq.dev.{topic}")}
    assert {d.key for d in acked} <= notes              # ... and announced on Kafka


async def test_slow_storage_keeps_broker_memory_bounded(devcluster: DevCluster, unique_name: Callable[[str], str],
                                                        tmp_path: Path) -> None:
    topic = unique_name("slow")
    mib = 1024 * 1024
    base = devcluster.config(topics=[topic_config(topic, batch_bytes=2 * mib, max_message_bytes=mib, ring_slots=2,
                                                  batch_ms=100)])
    with FaultProxy(devcluster.s3_endpoint or "", FaultPlan(mode="stall", fraction=1.0, methods=frozenset({"PUT"}),
                                                         stall_s=1.0)) as proxy:
        config = dataclasses.replace(base, s3=dataclasses.replace(base.s3, endpoint_url=proxy.url),
                                     broker=dataclasses.replace(base.broker, broker_id="slow1", busy_wait_ms=500,
                                                                read_cache_bytes=8 * mib))
        with BrokerProcess(config, tmp_path) as broker:
            rss0 = rss_mib(broker.pid)
            peak = rss0
            outcomes: list[str] = []

            async def offer(k: int) -> None:
                cfg = producer_config(broker.url, max_in_flight_bytes=8 * mib, max_block_ms=1_000, retries=1,
                                      retry_backoff_ms=100, request_timeout_ms=10_000)
                async with Producer(cfg) as p:
                    futs = []
                    for i in range(40):               # 40 x 512 KiB offered per producer, far above 2 MB/s
                        try:
                            futs.append(await p.send_many(topic, [os.urandom(1024) for _ in range(512)]))
                        except MemqError as e:        # no room within max_block_ms: a clear error
                            outcomes.append(type(e).__name__)
                    for f in futs:
                        try:
                            await f
                            outcomes.append("ok")
                        except MemqError as e:
                            outcomes.append(type(e).__name__ + (":BUSY" if "BUSY" in str(e) else ""))

            async def watch() -> None:
                nonlocal peak
                while True:
                    peak = max(peak, rss_mib(broker.pid))
                    await asyncio.sleep(0.1)

            watcher = asyncio.create_task(watch())
            await asyncio.wait_for(asyncio.gather(*(offer(k) for k in range(3))), 90)
            watcher.cancel()
            assert broker.alive()
    print(f"broker RSS {rss0:.0f} MiB -> peak {peak:.0f} MiB; outcomes {sorted(set(outcomes))}")
    assert "ok" in outcomes                              # storage still took some
    assert set(outcomes) - {"ok"}                        # and producers were pushed back clearly
    # 3 producers offered 60 MiB; the ring holds 2 x (2 + 1) MiB plus socket buffers, and the read
    # cache keeps at most its 8 MiB of what was stored
    assert peak - rss0 < 40 + 8, f"broker RSS grew {peak - rss0:.0f} MiB"
