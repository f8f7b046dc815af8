"""SIGTERM drains a broker process: what it holds is sealed, stored, notified and acked at once
(not when `batch_ms` would seal it), then it exits 0. Kubernetes and the image rely on it."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from memq.client.producer import Producer
from memq.devcluster import DevCluster
from memq.devcluster.broker_process import BrokerProcess
from tests.support.cluster import producer_config, read_notifications, read_stored, topic_config

pytestmark = pytest.mark.integration


def busy_slots(url: str, topic: str) -> float:
    """memq_broker_ring_busy_slots of `topic`: 1 once its first Message opened a batch."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(f'memq_broker_ring_busy_slots{{topic="{topic}"}}'):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_sigterm_stores_notifies_and_acks_what_is_in_flight_then_exits_0(
        devcluster: DevCluster, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    t_one, t_all = unique_name("term1"), unique_name("termall")
    config = devcluster.config(topics=[topic_config(t, batch_ms=120_000) for t in (t_one, t_all)])   # no age seal
    broker = BrokerProcess(config, tmp_path).start()
    one = [b"one-%d" % i for i in range(500)]
    every = [b"all-%d" % i for i in range(300)]
    try:
        async with Producer(producer_config(broker.url, ack="1")) as p1, \
                Producer(producer_config(broker.url, ack="all", request_timeout_ms=60_000)) as pa:
            acked_one = await (await p1.send_many(t_one, one))      # in the broker's batch, not stored
            pending = await pa.send_many(t_all, every)
            deadline = time.monotonic() + 10
            while await asyncio.to_thread(busy_slots, broker.url, t_all) < 1:   # the broker holds them
                assert time.monotonic() < deadline, "ack=all Messages never reached the broker"
                await asyncio.sleep(0.05)
            assert not pending.done()
            t0 = time.monotonic()
            await asyncio.to_thread(broker.stop, 60.0)                 # SIGTERM, then wait for exit
            stop_s = time.monotonic() - t0
            acked_all = await asyncio.wait_for(pending, 30)
    finally:
        broker.stop()
    assert broker.returncode == 0, broker.log_tail()
    assert stop_s < 20, f"drain took {stop_s:.1f} s"
    assert sum(d.count for d in acked_one) == len(one)
    assert all(d.key for d in acked_all) and sum(d.count for d in acked_all) == len(every)   # stored
    for topic, values in ((t_one, one), (t_all, every)):
        stored, dups, keys = await read_stored(config, topic)
        assert sorted(v for _, v, _ in stored.values()) == sorted(values) and dups == {}
        notes = read_notifications(devcluster.kafka_bootstrap or "", f"memq.dev.{topic}")
        assert sorted(n.key for n in notes) == sorted(keys)
        assert sum(n.logmessage_count for n in notes) == len(values)
