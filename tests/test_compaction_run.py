"""The compaction runner and the janitor's release on real servers (moto S3, tansu, ZooKeeper):
a crash at each step, then a rerun, ends in the same state, and readers never see a mix."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from memq.broker.server import Broker
from memq.chaos.checker import KeyedWrite, check_compacted
from memq.client.consumer import Consumer
from memq.client.producer import Producer
from memq.compaction.manifest import ManifestCache, ManifestPointers, compaction_group
from memq.compaction.read import PartReader
from memq.compaction.run import Compactor, Outcome
from memq.config import GovernorConfig, MemqConfig, ProducerConfig, TopicConfig
from memq.devcluster.broker_process import config_toml
from memq.format import LogMessage
from memq.governor.janitor import Janitor
from memq.governor.registry import Registry
from memq.notify import TopicAdmin
from memq.storage import make_storage
from memq.storage.metrics import group_label
from tests.support.cluster import write_batches
from tests.support.killed import kill_at_marker


class Crash(Exception):
    """The injected fault: the runner dies at a step."""


@pytest.fixture(scope="module")
def setup(devcluster: object) -> Iterator[tuple[MemqConfig, Registry]]:
    config = dataclasses.replace(devcluster.config(), governor=GovernorConfig(   # type: ignore[attr-defined]
        retention_grace_s=1.0, orphan_grace_s=1.0, janitor_timeout_s=60.0, compaction_mbps=50.0))
    with Registry(config.zookeeper, config.cluster.name) as registry:
        yield config, registry


def _topic(config: MemqConfig, name: str) -> TopicConfig:
    cfg = TopicConfig(name, read_partitions=1, storage_group="", cleanup_policy="compact",
                      delete_retention_ms=3_600_000, min_cleanable_dirty_ratio=0.0)
    TopicAdmin(config.kafka).create_topic(cfg.notification_topic_for(config.cluster.name), 1)
    return cfg


def _write(config: MemqConfig, topic: str, rounds: int, keys: int, seq: int = 0) -> dict[bytes, bytes | None]:
    """`rounds` batches each updating every key (key 0 deleted in the last); the latest values."""
    now = int(time.time() * 1000)
    batches = []
    latest: dict[bytes, bytes | None] = {}
    for r in range(rounds):
        recs = []
        for k in range(keys):
            value = None if (r == rounds - 1 and k == 0) else b"v%d-%d-%d" % (seq, r, k)
            recs.append(LogMessage(value, b"k%d" % k, (("r", b"%d" % r),), now + r))  # type: ignore[arg-type]
            latest[b"k%d" % k] = value
        batches.append([(7, 0, seq * 100 + r, recs)])
    write_batches(config, topic, batches)
    return latest


async def _state(config: MemqConfig, registry: Registry, topic: str) -> tuple[dict[bytes, tuple[int, bytes | None]], int]:
    """What a reader of the compacted prefix sees: key -> (offset, value), and the manifest's end;
    fails on a key seen twice or offsets out of order (a mix)."""
    storage = make_storage(config)
    try:
        ptr = ManifestPointers(registry).read(topic, 0)
        if ptr is None:
            return {}, 0
        m = await ManifestCache(storage).load(ptr)
        reader = PartReader(storage)
        seen: dict[bytes, tuple[int, bytes | None]] = {}
        last = -1
        for part in m.parts_from(0):
            async for chunk in reader.survivors_from(part, 0):
                for s in chunk:
                    assert s.key not in seen and s.offset > last, "a key twice, or offsets out of order"
                    seen[s.key] = (s.offset, s.value)
                    last = s.offset
        return seen, m.end
    finally:
        await storage.close()


def _compactor(config: MemqConfig, registry: Registry, step: Callable[[str], None] | None = None) -> Compactor:
    return Compactor(config, ManifestPointers(registry), CollectorRegistry(), step=step)


def test_a_crash_then_a_rerun_ends_in_the_same_state_and_the_janitor_releases_what_was_replaced(
        setup: tuple[MemqConfig, Registry], unique_name: Callable[[str], str]) -> None:
    """An exception after the manifest's PUT (each step under SIGKILL: test_a_sigkilled_compaction_...)."""
    config, registry = setup
    cfg = _topic(config, unique_name("cp"))
    first = _write(config, cfg.name, rounds=3, keys=50)

    async def go() -> None:
        await _compactor(config, registry).partition(cfg, 0)            # a first manifest: 50 keys
        before, end0 = await _state(config, registry, cfg.name)
        assert {k: v for k, (_, v) in before.items()} == first and end0 == 3
        latest = first | await asyncio.to_thread(_write, config, cfg.name, 2, 30, 1)
        await asyncio.sleep(1.1)     # its objects older than the orphan grace: no later notification can name them

        def die(step: str) -> None:
            if step == "manifest_put":
                raise Crash(step)
        with pytest.raises(Crash):
            await _compactor(config, registry, die).partition(cfg, 0, force=True)
        mid, end1 = await _state(config, registry, cfg.name)
        assert (mid, end1) == (before, end0)                             # the old manifest stands
        await _compactor(config, registry).partition(cfg, 0, force=True)   # the rerun
        after, end2 = await _state(config, registry, cfg.name)
        assert end2 == 5
        assert {k: v for k, (_, v) in after.items()} == latest
        assert after[b"k0"][1] is None                                   # the tombstone, until delete_retention_ms
        assert after[b"k40"] == before[b"k40"]                           # untouched keys keep their offsets

        await asyncio.sleep(1.2)                                         # past both graces
        janitor = Janitor(config, CollectorRegistry(), manifests=ManifestPointers(registry))
        try:
            await janitor.run_once({cfg.name: cfg})
            storage = make_storage(config)
            try:
                home = await storage.list_group(compaction_group(cfg.name), 0, 10**13, all_attempts=True)
                plain = await storage.list_topic(cfg.name, 0, 10**13, all_attempts=True)
            finally:
                await storage.close()
            ptr = ManifestPointers(registry).read(cfg.name, 0)
            assert ptr is not None
            m = await ManifestCache(make_storage(config)).load(ptr)
            assert {o.location.key for o in home} == {ptr.key, *(p.key for p in m.parts)}   # replaced + orphans gone
            assert plain == []                                           # every plain object is below `end`
            assert await _state(config, registry, cfg.name) == (after, end2)
        finally:
            await janitor.close()
    asyncio.run(go())


def test_nothing_due_changes_nothing_and_metrics_count(setup: tuple[MemqConfig, Registry],
                                                       unique_name: Callable[[str], str]) -> None:
    config, registry = setup
    cfg = dataclasses.replace(_topic(config, unique_name("idle")), min_compaction_lag_ms=3_600_000)
    _write(config, cfg.name, rounds=2, keys=5)
    metrics = CollectorRegistry()
    c = Compactor(config, ManifestPointers(registry), metrics)
    out = asyncio.run(c.partition(cfg, 0))
    assert out.result == "idle" and ManifestPointers(registry).read(cfg.name, 0) is None
    assert metrics.get_sample_value("memq_compaction_runs_total", {"topic": cfg.name, "result": "idle"}) == 1
    assert metrics.get_sample_value("memq_compaction_dirty_ratio", {"topic": cfg.name, "partition": "0"}) == 1.0


def test_produce_goes_on_during_compaction_and_nothing_acked_is_lost(
        setup: tuple[MemqConfig, Registry], unique_name: Callable[[str], str]) -> None:
    """memq's Producer writes through a broker while a compactor compacts and the janitor releases,
    pass after pass; a Consumer from earliest then reads every acked key's latest acked value (the
    checker's rule)."""
    config, registry = setup
    # sparse: the Consumer reads after the broker stopped (a dense topic's reader asks a broker)
    cfg = dataclasses.replace(_topic(config, unique_name("live")), offsets="sparse")
    config = dataclasses.replace(config, topics=(cfg,))
    keys, rounds = 40, 12
    writes: list[KeyedWrite] = []
    metrics, janitor_metrics = CollectorRegistry(), CollectorRegistry()

    def swapped() -> float:
        return metrics.get_sample_value("memq_compaction_runs_total", {"topic": cfg.name, "result": "swapped"}) or 0

    async def produce(url: str) -> None:
        """`rounds` rounds, more until compaction swapped 3 times while they went on."""
        async with Producer(ProducerConfig(brokers=url, ack="all", linger_ms=5)) as producer:
            r = 0
            while r < rounds or (swapped() < 3 and r < 60):
                r += 1
                sent = []
                for k in range(keys) if r % 2 == 0 else range(0, keys, 3):   # some keys more often
                    rid = f"{r}-{k}"
                    sent.append((f"k{k}", rid, time.monotonic(), await producer.send(
                        cfg.name, rid.encode(), key=b"k%d" % k, headers=[("id", rid.encode())])))
                for key, rid, t0, fut in sent:
                    ok = (await asyncio.gather(fut, return_exceptions=True))[0]
                    writes.append(KeyedWrite(key, rid, t0, time.monotonic(), not isinstance(ok, BaseException)))
                await asyncio.sleep(0.15)

    async def go() -> None:
        broker = Broker(config)
        url = await broker.start()
        compactor = Compactor(config, ManifestPointers(registry), metrics)
        janitor = Janitor(config, janitor_metrics, manifests=ManifestPointers(registry))
        try:
            producing = asyncio.create_task(produce(url))
            passes = 0
            while not producing.done() or passes < 2:
                await compactor.run_once({cfg.name: cfg})              # compacts when dirty
                await janitor.run_once({cfg.name: cfg})                # releases what it may
                passes += 1
                await asyncio.sleep(0.1)
            await producing
        finally:
            await janitor.close()
            await compactor.close()
            await broker.stop()
    asyncio.run(go())
    assert swapped() >= 3                                                # compaction ran during produce
    released = sum(s.value for m in janitor_metrics.collect() if m.name == "memq_janitor_deleted_objects"
                   for s in m.samples if s.labels.get("topic") == cfg.name and s.name.endswith("_total"))
    assert released > 0                                                  # plain objects below `end` went too
    assert all(w.ok for w in writes)

    state: dict[str, str] = {}
    with Consumer(config, cfg.name, group_id=unique_name("g"), pointers=ManifestPointers(registry)) as consumer:
        idle = 0
        deadline = time.monotonic() + 60
        while (idle < 3 or not state) and time.monotonic() < deadline:   # a group's assignment first
            got = list(consumer.poll(0.5))
            idle = 0 if got else idle + 1
            for rec in got:
                state[rec.key.decode()] = dict(rec.headers)["id"].decode()
    verdict = check_compacted(writes, state)
    assert verdict.passed and verdict.keys == keys, verdict.problems()
    ptr = ManifestPointers(registry).read(cfg.name, 0)
    assert ptr is not None and ptr.end > 0                               # the reader went through a prefix


def test_the_brokers_compactor_runs_the_share_it_is_told_and_counts_its_s3_requests_in_the_brokers_metrics(
        setup: tuple[MemqConfig, Registry], unique_name: Callable[[str], str]) -> None:
    """The broker builds the compactor on its own storage handler and read path; told its share
    (as the governor's agent tells it), it compacts, and every S3 request of the run is in the
    broker's `memq_storage_*` counters: the PUTs of the parts and the manifest under the topic's
    compaction home, the GET of each dirty part (through the read path: counted there too)."""
    config, registry = setup
    cfg = _topic(config, unique_name("metered"))
    rounds = 3
    _write(config, cfg.name, rounds=rounds, keys=20)
    config = dataclasses.replace(config, zookeeper=dataclasses.replace(config.zookeeper, enabled=True),
                                 governor=dataclasses.replace(config.governor, compaction_interval_s=0.2))

    async def go() -> tuple[float, ...]:
        broker = Broker(config)
        await broker.start()
        metric = broker.metrics.registry.get_sample_value

        def s3(op: str, topic: str) -> float:
            return metric("memq_storage_attempts_total", {"backend": "s3", "op": op, "topic": topic}) or 0.0

        try:
            before = (s3("put", group_label(compaction_group(cfg.name))), s3("get_range", cfg.name))
            asked: set[str] = set()

            def mine(topic: str, partition: int) -> bool:
                asked.add(topic)
                return topic == cfg.name

            broker.compact_share(lambda: {cfg.name: cfg, "other": dataclasses.replace(cfg, name="other")}, mine)
            deadline = time.monotonic() + 60
            while not metric("memq_compaction_runs_total", {"topic": cfg.name, "result": "swapped"}):
                assert time.monotonic() < deadline, "the broker's compactor never swapped a manifest"
                await asyncio.sleep(0.1)
            assert asked == {cfg.name, "other"}                      # the share is asked per partition
            assert metric("memq_compaction_runs_total", {"topic": "other", "result": "idle"}) is None
            return (s3("put", group_label(compaction_group(cfg.name))) - before[0],
                    s3("get_range", cfg.name) - before[1],
                    metric("memq_compaction_objects_total", {"topic": cfg.name}) or 0.0,
                    metric("memq_broker_read_gets_total") or 0.0)
        finally:
            await broker.stop()

    puts, gets, parts, read_gets = asyncio.run(go())
    assert parts >= 1 and puts >= parts + 1                 # the parts, then the manifest
    assert gets >= rounds and read_gets >= rounds          # each dirty part, read through the broker's read path


#: A compaction in its own process that stops at one step (argv: config, step, marker file) and
#: waits there to be SIGKILLed: a real crash, not an exception the runner could see.
_KILLED_RUN = """
import asyncio, os, sys, time
from pathlib import Path
from prometheus_client import CollectorRegistry
from memq.compaction.manifest import ManifestPointers
from memq.compaction.run import Compactor, Outcome
from memq.config import load_config
from memq.governor.registry import Registry

config = load_config(sys.argv[1], env={})
def step(name):
    if name == sys.argv[2]:
        Path(sys.argv[3]).write_text(str(os.getpgid(0)))
        time.sleep(600)
with Registry(config.zookeeper, config.cluster.name) as registry:
    compactor = Compactor(config, ManifestPointers(registry), CollectorRegistry(), step=step)
    asyncio.run(compactor.partition(config.topics[0], 0, force=True))
"""


def _kill_at(config: MemqConfig, cfg: TopicConfig, step: str, where: Path) -> None:
    """Run a compaction of `cfg` in a process; SIGKILL it once it reached `step`."""
    path = where / f"{step}.toml"
    path.write_text(config_toml(dataclasses.replace(config, topics=(cfg,))))
    marker = where / f"{step}.reached"
    kill_at_marker([sys.executable, "-c", _KILLED_RUN, str(path), step, str(marker)], marker, timeout_s=60)


def test_a_sigkilled_compaction_at_each_step_leaves_old_or_new_then_a_rerun_the_same_state(
        setup: tuple[MemqConfig, Registry], unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """Killed after the new parts' PUT, after the manifest's, and after the swap (before the
    janitor's release): readers see the old manifest or the new one, the rerun and the release
    end where one clean run does."""
    config, registry = setup
    cfg = _topic(config, unique_name("kill"))
    first = _write(config, cfg.name, rounds=3, keys=40)
    asyncio.run(_compactor(config, registry).partition(cfg, 0))
    before = asyncio.run(_state(config, registry, cfg.name))
    assert {k: v for k, (_, v) in before[0].items()} == first and before[1] == 3
    latest = first | _write(config, cfg.name, 2, 25, 1)

    for step in ("parts_put", "manifest_put"):
        _kill_at(config, cfg, step, tmp_path)
        assert asyncio.run(_state(config, registry, cfg.name)) == before        # the old manifest stands
    _kill_at(config, cfg, "swapped", tmp_path)
    after, end = asyncio.run(_state(config, registry, cfg.name))                # the new one: whole
    assert end == 5 and {k: v for k, (_, v) in after.items()} == latest
    assert after[b"k30"] == before[0][b"k30"]                                   # untouched keys keep their offsets

    async def rerun_and_release() -> str:
        out = await _compactor(config, registry).partition(cfg, 0, force=True)
        await asyncio.sleep(1.2)                                                # past both graces
        janitor = Janitor(config, CollectorRegistry(), manifests=ManifestPointers(registry))
        try:
            await janitor.run_once({cfg.name: cfg})
        finally:
            await janitor.close()
        return out.result
    assert asyncio.run(rerun_and_release()) == "idle"                            # nothing left to do
    assert asyncio.run(_state(config, registry, cfg.name)) == (after, end)

    async def homes() -> tuple[set[str], list]:
        storage = make_storage(config)
        try:
            home = await storage.list_group(compaction_group(cfg.name), 0, 10**13, all_attempts=True)
            return {o.location.key for o in home}, await storage.list_topic(cfg.name, 0, 10**13, all_attempts=True)
        finally:
            await storage.close()
    ptr = ManifestPointers(registry).read(cfg.name, 0)
    assert ptr is not None
    m = asyncio.run(ManifestCache(make_storage(config)).load(ptr))
    assert asyncio.run(homes()) == ({ptr.key, *(p.key for p in m.parts)}, [])  # the killed runs' orphans went


def test_a_pass_runs_only_this_compactors_partitions_and_drops_the_gauges_of_those_that_moved() -> None:
    """Unit: `run_once` asks `mine` per partition; a partition no longer this broker's stops being
    reported, so the cost view reads it from its new compactor."""
    cfg = TopicConfig("s", read_partitions=1, cleanup_policy="compact", storage_group="")
    topics = {"s": cfg, "plain": TopicConfig("plain", storage_group="")}
    metrics = CollectorRegistry()
    ran: list[tuple[str, int]] = []

    class Probe(Compactor):
        async def partition(self, cfg: TopicConfig, partition: int, *, force: bool = False) -> Outcome:
            ran.append((cfg.name, partition))
            self.metrics.stored.labels(cfg.name, str(partition)).set(100)
            return Outcome(cfg.name, partition, "idle", None, None)

    c = Probe(MemqConfig(), pointers=None, registry=metrics, storage=object())  # type: ignore[arg-type]

    def stored() -> float | None:
        return metrics.get_sample_value("memq_compaction_stored_bytes", {"topic": "s", "partition": "0"})
    asyncio.run(c.run_once(topics, lambda t, p: True))
    assert ran == [("s", 0)] and stored() == 100                  # plain topics are never compacted
    asyncio.run(c.run_once(topics, lambda t, p: False))
    assert ran == [("s", 0)] and stored() is None                 # moved: not run, no longer reported
