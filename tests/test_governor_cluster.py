"""The governor end to end: real ZooKeeper, S3, Kafka and real broker processes.

Placement across racks, rate-limited rebalance, SIGKILL failover under ack=all load (with
the failover time printed), governor failover, drain without producer errors, and ZooKeeper
session expiry handled without a restart. Loss is counted by reading S3 + notifications.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from memq.client.consumer import Consumer
from memq.client.producer import Producer
from memq.config import (GovernorConfig, MemqConfig, ProducerConfig, TopicConfig,
                         ZooKeeperConfig)
from memq.devcluster.process import ManagedProcess, spawn
from memq.governor.registry import Registry
from memq.governor.topics import TopicManager
from memq.notify import TopicAdmin
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SESSION_S = 4.0


def env_of(config: MemqConfig) -> dict[str, str]:
    """The config as MEMQ_SECTION_FIELD variables, so a broker process needs no file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    for section in dataclasses.fields(config):
        value = getattr(config, section.name)
        if not dataclasses.is_dataclass(value):
            continue
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if v is not None:
                text = str(v).lower() if isinstance(v, bool) else ",".join(v) if isinstance(v, tuple) else str(v)
                env[f"MEMQ_{section.name}_{f.name}".upper()] = text
    return env


@dataclass
class BrokerProc:
    id: str
    rack: str
    proc: ManagedProcess
    url: str = ""


@dataclass
class GovCluster:
    config: MemqConfig
    run_dir: Path
    registry: Registry
    topics: TopicManager
    brokers: dict[str, BrokerProc] = field(default_factory=dict)

    def start_brokers(self, specs: list[tuple[str, str]], capacity_mbps: float = 100.0) -> None:
        empty = self.run_dir / "empty.toml"
        empty.write_text("")
        for bid, rack in specs:
            bc = dataclasses.replace(self.config.broker, broker_id=bid, rack=rack, port=0,
                                     capacity_mbps=capacity_mbps, shutdown_timeout_ms=15_000)
            env = env_of(dataclasses.replace(self.config, broker=bc))
            proc = spawn(f"broker-{bid}", [sys.executable, "-m", "memq.broker", "--config", str(empty)],
                         log_path=self.run_dir / f"broker-{bid}.log", env=env)
            self.brokers[bid] = BrokerProc(bid, rack, proc)
        for bid, _ in specs:
            b = self.brokers[bid]
            try:
                wait_for(lambda: bid in self.registry.brokers() or not b.proc.alive(), 30, f"broker {bid}")
            except AssertionError:
                raise AssertionError(b.proc.log_tail()) from None
            assert b.proc.alive(), b.proc.log_tail()
            b.url = self.registry.brokers()[bid].url

    def signal(self, bid: str, sig: signal.Signals) -> None:
        os.kill(self.brokers[bid].proc.pid, sig)

    def hosted(self, bid: str) -> list[str]:
        """Topics `bid` hosts; none while it is still starting (/healthz answers 503 until ready)."""
        try:
            with urllib.request.urlopen(self.brokers[bid].url + "/healthz", timeout=5) as r:
                return list(json.load(r)["topics"])
        except urllib.error.HTTPError as e:
            if e.code == 503:
                return []
            raise

    def metadata(self, bid: str) -> dict:
        with urllib.request.urlopen(self.brokers[bid].url + "/v1/metadata", timeout=5) as r:
            return json.load(r)

    def placed(self, topic: str) -> tuple[str, ...]:
        """Brokers assigned `topic` that also host it (started their TopicProcessor)."""
        assigned = self.registry.assignments().get(topic, ())
        if not all(self.brokers[b].proc.alive() for b in assigned):
            return ()
        hosting = tuple(b for b in assigned if topic in self.hosted(b))
        return hosting if len(hosting) == len(assigned) else ()

    def producer_config(self) -> ProducerConfig:
        urls = [b.url for b in self.brokers.values() if b.url]
        return ProducerConfig(brokers=",".join(urls), ack="all", linger_ms=5, retries=40,
                              retry_backoff_ms=50, request_timeout_ms=10_000)

    def close(self) -> None:
        for b in self.brokers.values():
            if b.proc.popen.poll() is None:
                os.kill(b.proc.pid, signal.SIGCONT)   # in case a test left it stopped
            b.proc.stop(timeout_s=20)
        self.registry.close()


@pytest.fixture
def gcluster(devcluster, tmp_path: Path) -> Iterator[GovCluster]:
    name = f"g{uuid.uuid4().hex[:8]}"
    base = devcluster.config(cluster=name)
    config = dataclasses.replace(
        base,
        zookeeper=ZooKeeperConfig(enabled=True, hosts=devcluster.zk_hosts, root="/memq-test",
                                  session_timeout_s=SESSION_S, connect_timeout_s=5.0),
        governor=GovernorConfig(interval_s=1.0, reconcile_interval_s=0.5, topic_share_mbps=25,
                                max_rebalance_moves=1, rebalance_interval_s=2.0, imbalance_threshold=0.1,
                                drain_timeout_s=20))
    registry = Registry(config.zookeeper, name).start()
    c = GovCluster(config, tmp_path, registry, TopicManager(registry, TopicAdmin(config.kafka), name))
    try:
        yield c
    finally:
        c.close()


def topic_cfg(name: str, mbps: float = 5.0) -> TopicConfig:
    return TopicConfig(name, read_partitions=2, batch_ms=100, expected_mbps=mbps)


@dataclass
class Load:
    """Steady ack=all production: every value, its send time and outcome."""

    acked: dict[bytes, float] = field(default_factory=dict)     # value -> ack time
    sent: dict[bytes, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    async def run(self, producer: Producer, topic: str, stop: asyncio.Event, per_tick: int = 20,
                  tick_s: float = 0.02) -> None:
        pending: set[asyncio.Future] = set()
        i = 0
        while not stop.is_set():
            for _ in range(per_tick):
                value = f"{topic}-{i:08d}".encode()
                i += 1
                self.sent[value] = time.monotonic()
                fut = await producer.send(topic, value)
                fut.add_done_callback(lambda f, v=value: self._done(f, v))
                pending.add(fut)
            pending = {f for f in pending if not f.done()}
            await asyncio.sleep(tick_s)
        await producer.flush()
        await asyncio.gather(*pending, return_exceptions=True)

    def _done(self, fut: asyncio.Future, value: bytes) -> None:
        if fut.cancelled():
            self.errors.append(f"{value!r} cancelled")
        elif fut.exception() is not None:
            self.errors.append(f"{value!r}: {fut.exception()}")
        else:
            self.acked[value] = time.monotonic()


def read_back(config: MemqConfig, topic: str, expected: set[bytes], timeout_s: float = 40) -> set[bytes]:
    """Values found by reading the topic's notifications and its batches in S3."""
    seen: set[bytes] = set()
    deadline = time.monotonic() + timeout_s
    with Consumer(config, topic, group_id=f"verify-{uuid.uuid4().hex[:6]}") as consumer:
        while time.monotonic() < deadline and not expected <= seen:
            for rec in consumer.poll(0.5):
                seen.add(bytes(rec.value))
    return seen


async def produce_during(c: GovCluster, topic: str, action: Callable[[], object],
                         before_s: float = 1.5, after_s: float = 3.0) -> tuple[Load, float]:
    """Produce steadily, run `action` (in a thread) midway; returns the load and action time."""
    load = Load()
    stop = asyncio.Event()
    async with Producer(c.producer_config()) as producer:
        task = asyncio.create_task(load.run(producer, topic, stop))
        await asyncio.sleep(before_s)
        t_action = time.monotonic()
        await asyncio.to_thread(action)
        await asyncio.sleep(after_s)
        stop.set()
        await asyncio.wait_for(task, 60)
    return load, t_action


def assert_no_loss(c: GovCluster, topic: str, load: Load) -> None:
    acked = set(load.acked)
    assert acked, "nothing was acked"
    seen = read_back(c.config, topic, acked)
    missing = acked - seen
    assert not missing, f"{len(missing)} acked values lost, e.g. {sorted(missing)[:3]}"
    print(f"{topic}: {len(acked)} acked, {len(seen)} read back from S3 + notifications, 0 lost")


def test_placement_spreads_racks_and_rebalance_is_rate_limited(gcluster: GovCluster) -> None:
    c = gcluster
    c.start_brokers([("b1", "ra"), ("b2", "rb"), ("b3", "rc")])
    racks = {"b1": "ra", "b2": "rb", "b3": "rc", "b4": "rd"}
    names = [f"p{i}" for i in range(4)]
    for n in names:
        c.topics.create(topic_cfg(n, 8))
    for n in names:
        placed = wait_for(lambda: c.placed(n), 20, f"{n} placed")
        assert len(placed) == 2 and len({racks[b] for b in placed}) == 2, placed
    md = c.metadata("b3")
    assert sorted(md["topics"]["p0"]["brokers"]) == sorted(c.brokers[b].url for b in c.placed("p0"))
    assert {b["id"] for b in md["brokers"]} == {"b1", "b2", "b3"}
    # a fourth broker joins and one topic's traffic rises: it needs 3 brokers, load is uneven
    c.start_brokers([("b4", "rd")])
    before = c.registry.assignments()
    c.topics.alter("p0", expected_mbps=70)
    history = [(time.monotonic(), before)]
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:
        a = c.registry.assignments()
        if a != history[-1][1]:
            history.append((time.monotonic(), a))
        time.sleep(0.05)
    assert len(history[-1][1]["p0"]) == 3
    assert any("b4" in bs for bs in history[-1][1].values()), history[-1]
    optional = []
    for (_, a0), (t1, a1) in zip(history, history[1:]):
        changed = [t for t in a1 if a1[t] != a0.get(t)]
        rebalanced = [t for t in changed if len(a1[t]) == len(a0[t])]   # same count: a move
        assert len(rebalanced) <= 1, (a0, a1)
        if rebalanced:
            optional.append(t1)
    assert optional, "no rebalance move happened"
    assert all(b - a > 1.5 for a, b in zip(optional, optional[1:])), optional
    for t, bs in history[-1][1].items():
        wait_for(lambda: c.placed(t) == bs, 10, f"{t} hosted where assigned")
        assert len({racks[b] for b in bs}) == len(bs)


@pytest.mark.asyncio
async def test_sigkill_of_hosting_broker_under_ack_all_load(gcluster: GovCluster) -> None:
    c = gcluster
    c.start_brokers([("b1", "ra"), ("b2", "rb"), ("b3", "rc")])
    topic = "fail"
    c.topics.create(topic_cfg(topic))
    first = await asyncio.to_thread(wait_for, lambda: c.placed(topic), 20, "placement")
    victim = first[0]
    recovered: list[float] = []

    def kill_and_watch() -> None:
        c.signal(victim, signal.SIGKILL)
        t0 = time.monotonic()
        wait_for(lambda: victim not in c.registry.assignments()[topic] and len(c.placed(topic)) == 2,
                 SESSION_S + 10, "reassignment")
        recovered.append(time.monotonic() - t0)

    load, t_kill = await produce_during(c, topic, kill_and_watch, before_s=2.0, after_s=2.0)
    after = sorted(t for v, t in load.acked.items() if load.sent[v] >= t_kill)
    assert after, f"no write acked after the kill; errors: {load.errors[:3]}"
    resume_s = after[0] - t_kill
    around = [load.acked[v] - t for v, t in load.sent.items() if v in load.acked and t_kill - 1 <= t <= t_kill + 1]
    print(f"\nFAILOVER: SIGKILL {victim}: first ack of a write sent after the kill {resume_s:.2f}s, "
          f"slowest ack of a write sent within 1 s of the kill {max(around):.2f}s (retries), "
          f"topic back on 2 live brokers after {recovered[0]:.2f}s (session timeout {SESSION_S:g}s); "
          f"producer errors {len(load.errors)}")
    assert resume_s <= SESSION_S + 2
    assert recovered[0] <= SESSION_S + 2 + 2   # + governor cycle and processor start
    assert not load.errors, load.errors[:3]
    await asyncio.to_thread(assert_no_loss, c, topic, load)


def test_sigkill_of_governor_elects_another_that_handles_later_failures(gcluster: GovCluster) -> None:
    c = gcluster
    c.start_brokers([("b1", "ra"), ("b2", "rb"), ("b3", "ra"), ("b4", "rb")])
    c.topics.create(topic_cfg("g0"))
    c.topics.create(topic_cfg("g1"))
    wait_for(lambda: c.placed("g0") and c.placed("g1"), 20, "placement")
    gov = wait_for(c.registry.governor, 10, "a governor")
    t0 = time.monotonic()
    c.signal(gov, signal.SIGKILL)
    new = wait_for(lambda: (g := c.registry.governor()) != gov and g, SESSION_S + 5, "a new governor")
    print(f"\nGOVERNOR: {gov} SIGKILLed, {new} governs after {time.monotonic() - t0:.2f}s")
    wait_for(lambda: all(gov not in bs for bs in c.registry.assignments().values()), 10, "dead governor's topics moved")
    # a later failure, handled by the new governor
    victim = next(b for b in c.registry.assignments()["g0"] if b != new)
    c.signal(victim, signal.SIGKILL)
    wait_for(lambda: all(victim not in bs and len(bs) == 2 for bs in c.registry.assignments().values())
             and c.placed("g0") and c.placed("g1"), SESSION_S + 6, "second failure handled")
    assert c.registry.governor() == new


@pytest.mark.asyncio
async def test_drain_during_ack_all_production_has_no_errors_and_no_loss(gcluster: GovCluster) -> None:
    c = gcluster
    c.start_brokers([("b1", "ra"), ("b2", "rb"), ("b3", "rc")])
    topic = "drain"
    c.topics.create(topic_cfg(topic))
    placed = await asyncio.to_thread(wait_for, lambda: c.placed(topic), 20, "placement")
    victim = placed[0]

    def drain_then_stop() -> None:
        c.registry.set_drain(victim)            # what `memq broker drain ID` does
        wait_for(lambda: topic not in c.hosted(victim) and len(c.placed(topic)) == 2, 15, "drain")
        c.brokers[victim].proc.stop(timeout_s=20)   # then the rolling restart stops it

    load, _ = await produce_during(c, topic, drain_then_stop, before_s=1.5, after_s=1.5)
    assert victim not in c.registry.assignments()[topic]
    assert not load.errors, load.errors[:3]
    await asyncio.to_thread(assert_no_loss, c, topic, load)


@pytest.mark.asyncio
async def test_session_expiry_reregisters_and_resumes_without_restart(gcluster: GovCluster) -> None:
    c = gcluster
    c.start_brokers([("b1", "ra"), ("b2", "rb"), ("b3", "rc")])
    topic = "expiry"
    c.topics.create(topic_cfg(topic))
    placed = await asyncio.to_thread(wait_for, lambda: c.placed(topic), 20, "placement")
    victim = placed[0]
    path = f"{c.registry.brokers_path}/{victim}"
    owner = c.registry.client.get(path)[1].ephemeralOwner
    pid = c.brokers[victim].proc.pid
    c.signal(victim, signal.SIGSTOP)            # frozen past its session timeout
    await asyncio.to_thread(wait_for, lambda: victim not in c.registry.brokers(), SESSION_S + 5, "expiry")
    await asyncio.to_thread(wait_for, lambda: victim not in c.registry.assignments()[topic], 5, "reassignment")
    c.signal(victim, signal.SIGCONT)
    await asyncio.to_thread(wait_for, lambda: victim in c.registry.brokers(), 15, "re-registration")
    assert c.registry.client.get(path)[1].ephemeralOwner != owner
    assert c.brokers[victim].proc.pid == pid and c.brokers[victim].proc.alive()
    # it resumes: it gives up what is no longer assigned, and takes topics again when drains
    # of the others send them its way
    await asyncio.to_thread(wait_for, lambda: topic not in c.hosted(victim), 10, "stale topic dropped")
    for other in c.brokers:
        if other != victim and other in c.registry.assignments()[topic]:
            c.registry.set_drain(other)
    await asyncio.to_thread(wait_for, lambda: victim in c.placed(topic), 15, "topic back on the expired broker")
    load, _ = await produce_during(c, topic, lambda: None, before_s=0.5, after_s=1.0)
    assert not load.errors, load.errors[:3]
    await asyncio.to_thread(assert_no_loss, c, topic, load)
