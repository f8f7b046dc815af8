"""The compaction runner and the janitor's release on real servers (moto S3, tansu, ZooKeeper):
a crash at each step, then a rerun, ends in the same state, and readers never see a mix."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry

from memq.compaction.manifest import ManifestCache, ManifestPointers, compaction_group
from memq.compaction.read import PartReader
from memq.compaction.run import Compactor
from memq.config import GovernorConfig, MemqConfig, TopicConfig
from memq.format import LogMessage
from memq.governor.janitor import Janitor
from memq.governor.registry import Registry
from memq.notify import TopicAdmin
from memq.storage import make_storage
from tests.support.cluster import write_batches


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


@pytest.mark.parametrize("crash_at", ["parts_put", "manifest_put", "swapped"])
def test_a_crash_at_each_step_then_a_rerun_ends_in_the_same_state(
        setup: tuple[MemqConfig, Registry], unique_name: Callable[[str], str], crash_at: str) -> None:
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
            if step == crash_at:
                raise Crash(step)
        with pytest.raises(Crash):
            await _compactor(config, registry, die).partition(cfg, 0, force=True)
        mid, end1 = await _state(config, registry, cfg.name)
        assert (mid, end1) == ((before, end0) if crash_at != "swapped" else (mid, 5))   # old or new, never a mix
        if crash_at != "swapped":
            await _compactor(config, registry).partition(cfg, 0, force=True)   # the rerun
        after, end2 = await _state(config, registry, cfg.name)
        assert end2 == 5
        assert {k: v for k, (_, v) in after.items()} == latest
        assert after[b"k0"][1] is None                                   # the tombstone, until delete_retention_ms
        assert after[b"k40"] == before[b"k40"]                           # untouched keys keep their offsets

        await asyncio.sleep(1.2)                                         # past both graces
        janitor = Janitor(config, CollectorRegistry(), compactor=_compactor(config, registry))
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
