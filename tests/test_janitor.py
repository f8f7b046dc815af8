"""The janitor on real servers: retention and orphans (moto S3, tansu, ZooKeeper, broker processes)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from memq.cli import main as memq_cli
from memq.client.producer import Producer
from memq.config import GovernorConfig, MemqConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster
from memq.devcluster.broker_process import config_toml
from memq.devcluster.governed import FAST_GOVERNOR
from memq.format import Notification
from memq.errors import MemqError
from memq.governor.janitor import Janitor
from memq.governor.registry import Registry
from memq.governor.topics import TopicManager
from memq.notify import NotificationConsumer, NotificationPublisher, TopicAdmin
from memq.notify import log as log_module
from memq.notify.log import KafkaNotificationLog
from memq.storage import make_storage
from memq.storage.base import ObjectLocation

from tests.support.waiting import wait_for


def _notification(topic: str, loc: ObjectLocation) -> Notification:
    return Notification(v=1, topic=topic, bucket=loc.bucket, key=loc.key, size=1, header_size=1,
                        message_count=1, logmessage_count=1, min_timestamp_ms=0, max_timestamp_ms=0,
                        crc32c=0, broker_id="b1", attempt=0, created_ms=0)


async def test_expired_and_orphaned_objects_go_announced_young_ones_stay(
        memq_config: MemqConfig, unique_name: Callable[[str], str]) -> None:
    """Announced objects past retention + grace and unannounced ones past the orphan grace are
    deleted in bulk; younger objects and announced ones inside retention are not."""
    config = dataclasses.replace(memq_config, governor=GovernorConfig(
        janitor_interval_s=1.0, retention_grace_s=1.0, orphan_grace_s=1.0, janitor_timeout_s=30.0))
    topic = TopicConfig(unique_name("ret"), read_partitions=2, retention_ms=3_000, storage_group="")  # own objects
    kafka_topic = topic.notification_topic_for(config.cluster.name)
    admin = TopicAdmin(config.kafka)
    admin.create_topic(kafka_topic, topic.read_partitions, retention_ms=topic.retention_ms)
    storage = make_storage(config)
    publisher = NotificationPublisher(config.kafka, client_id="test-janitor")
    registry = CollectorRegistry()
    janitor = Janitor(config, registry)
    try:
        async def write(announced: bool, n: int) -> list[ObjectLocation]:
            locs = []
            for i in range(n):
                loc = await storage.put_batch(topic.name, b"batch", first_request_id=time.time_ns() + i,
                                              timestamp_ms=time.time_ns() // 1_000_000, broker_id="b1")
                if announced:
                    await publisher.publish(kafka_topic, _notification(topic.name, loc))
                locs.append(loc)
            return locs

        old_announced, old_orphan = await write(True, 3), await write(False, 1)
        await asyncio.sleep(4.5)                            # past retention (3 s) + grace (1 s)
        young_announced, young_orphan = await write(True, 2), await write(False, 2)
        await asyncio.sleep(1.5)                            # past the orphan grace (1 s) only
        [report] = await janitor.run_once({topic.name: topic})

        left = {i.location for i in await storage.list_topic(topic.name, 0, 10**13, all_attempts=True)}
        assert left == set(young_announced)
        assert {o.location for o in report.expired} == set(old_announced + old_orphan)
        assert {o.location for o in report.orphans} == set(young_orphan)
        assert report.failed == 0
        assert registry.get_sample_value("memq_janitor_deleted_objects_total",
                                         {"topic": topic.name, "reason": "orphan"}) == 2
        deletes = [smp.value for m in registry.collect() for smp in m.samples
                   if smp.name == "memq_storage_attempts_total" and smp.labels.get("op") == "delete_many"]
        assert sum(deletes) == 2                                                   # one request per reason
        # pointers expire first: Kafka is told the topic's retention, and no retained
        # notification inside retention names a deleted object
        assert admin.retention_ms(kafka_topic) == topic.retention_ms
        reader = NotificationConsumer(config.kafka, kafka_topic, group_id=unique_name("g"))
        try:
            starts = reader.offsets_for_times(report.pointer_ms)
            ends = {p: reader.watermarks(p)[1] for p in starts}
            reader.assign(starts)
            named: set[str] = set()
            deadline = time.monotonic() + 20
            while sum(ends.values()) - sum(starts.values()) > len(named) and time.monotonic() < deadline:
                named |= {r.notification.key for r in reader.poll(0.5)}
        finally:
            reader.close()
        assert named == {loc.key for loc in young_announced}
        # the next orphan sweep is due one grace after this one's end, not at the next pass
        [again] = await janitor.run_once({topic.name: topic})
        assert not again.orphans
    finally:
        publisher.close()
        await janitor.close()
        await storage.close()


async def test_a_byte_budget_expires_the_oldest_objects_after_their_pointers(
        memq_config: MemqConfig, unique_name: Callable[[str], str]) -> None:
    config = dataclasses.replace(memq_config, governor=GovernorConfig(retention_grace_s=0.0, orphan_grace_s=600.0))
    topic = TopicConfig(unique_name("bytes"), read_partitions=1, retention_ms=3_600_000, retention_bytes=250,
                        storage_group="")
    kafka_topic = topic.notification_topic_for(config.cluster.name)
    TopicAdmin(config.kafka).create_topic(kafka_topic, 1, retention_ms=topic.retention_ms)
    storage = make_storage(config)
    publisher = NotificationPublisher(config.kafka, client_id="test-janitor-bytes")
    janitor = Janitor(config, CollectorRegistry())
    try:
        locs = []
        for i in range(5):                                   # 5 x 100 bytes, oldest first
            loc = await storage.put_batch(topic.name, b"x" * 100, first_request_id=time.time_ns(),
                                          timestamp_ms=time.time_ns() // 1_000_000, broker_id="b1")
            await publisher.publish(kafka_topic, _notification(topic.name, loc))
            locs.append(loc)
            await asyncio.sleep(0.05)
        [report] = await janitor.run_once({topic.name: topic})
        left = [i.location for i in await storage.list_topic(topic.name, 0, 10**13, all_attempts=True)]
        # the newest two fit the budget; the oldest two go; the third's pointer is published after
        # the cutoff (object time + 1 ms) unless put and publish took under 1 ms: then it goes too
        gone = {o.location for o in report.expired}
        assert set(locs[:2]) <= gone <= set(locs[:3])
        assert left == [loc for loc in locs if loc not in gone] and locs[3:] == left[-2:]
    finally:
        publisher.close()
        await janitor.close()
        await storage.close()


def _metric(url: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples with `labels` on a broker's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert "_created{" not in text     # a broker process serves no per-series creation times
    return sum(smp.value for fam in text_string_to_metric_families(text) for smp in fam.samples
               if smp.name == name and labels.items() <= smp.labels.items())


def _janitor_lines(gc: GovernedCluster, broker_id: str) -> int:
    log = Path(gc.run_dir) / "brokers" / f"broker-{broker_id}.log"
    return sum("janitor: topic" in line and "expired" in line for line in log.read_text().splitlines())


@pytest.mark.slow   # a soak (faults or scale played out for 20-60 s): `python -m bench soak`
def test_janitor_runs_on_the_governor_only_and_its_successor_carries_on(tmp_path: Path,
                                                                         devcluster: DevCluster) -> None:
    governor = dataclasses.replace(FAST_GOVERNOR, drain_timeout_s=5.0, janitor_interval_s=1.0,
                                   retention_grace_s=0.5, orphan_grace_s=600.0)
    with GovernedCluster(tmp_path, brokers=2, servers=devcluster, cluster="janitor", governor=governor) as gc:
        topic = TopicConfig("expiring", read_partitions=1, retention_ms=1_500, batch_ms=20, storage_group="")
        gc.create_topic(topic)
        storage_config = gc.config()

        async def produce() -> None:
            async with Producer(storage_config.producer) as p:
                await (await p.send_many(topic.name, [b"v"] * 10))
                await p.flush()

        async def objects() -> int:
            storage = make_storage(storage_config)
            try:
                return len(await storage.list_topic(topic.name, 0, 10**13, all_attempts=True))
            finally:
                await storage.close()

        first = gc.governor()
        other = next(b for b in gc.live() if b != first)
        asyncio.run(produce())
        assert asyncio.run(objects()) > 0
        wait_for(lambda: asyncio.run(objects()) == 0, 30, "objects past retention deleted by the governor", interval_s=0.5)
        assert _janitor_lines(gc, first) > 0 and _janitor_lines(gc, other) == 0
        served = _metric(gc.broker(first).url, "memq_janitor_deleted_objects_total", topic="expiring",
                         reason="expired")
        assert served > 0                                   # the janitor's metrics are on the broker's /metrics
        assert _metric(gc.broker(first).url, "memq_storage_attempts_total", op="delete_many") > 0

        gc.stop_broker(first)
        assert gc.governor(exclude=first) == other
        gc.wait_placed(topic.name)
        asyncio.run(produce())
        assert asyncio.run(objects()) > 0
        wait_for(lambda: asyncio.run(objects()) == 0, 30, "objects past retention deleted by the new governor", interval_s=0.5)
        assert _janitor_lines(gc, other) > 0


def test_topic_alter_changes_retention_in_zookeeper_and_kafka(tmp_path: Path, memq_config: MemqConfig,
                                                              unique_name: Callable[[str], str]) -> None:
    config = dataclasses.replace(memq_config, zookeeper=dataclasses.replace(memq_config.zookeeper, enabled=True))
    path = tmp_path / "memq.toml"
    path.write_text(config_toml(config))
    name = unique_name("alter")
    kafka_topic = TopicConfig(name).notification_topic_for(config.cluster.name)
    admin = TopicAdmin(config.kafka)
    with Registry(config.zookeeper, config.cluster.name) as registry:
        TopicManager(registry, admin, config.cluster.name).create(TopicConfig(name, retention_ms=60_000))
        assert admin.retention_ms(kafka_topic) == 60_000
        runner = CliRunner()
        ok = runner.invoke(memq_cli, ["--config", str(path), "topic", "alter", name, "--set", "retention_ms=5000"])
        assert ok.exit_code == 0, ok.output
        assert registry.topic(name).retention_ms == 5000 and admin.retention_ms(kafka_topic) == 5000
        bad = runner.invoke(memq_cli, ["--config", str(path), "governor", "topic", "alter", name,
                                       "--set", "retention_bytes=-1"])
        assert bad.exit_code == 2 and "retention_bytes = -1 is out of range" in bad.output, bad.output
        # the topic is in the shared storage group, where a byte limit would do nothing: refused, unchanged
        shared = runner.invoke(memq_cli, ["--config", str(path), "topic", "alter", name, "--set", "retention_bytes=1000"])
        assert shared.exit_code != 0 and 'storage_group = ""' in shared.output, shared.output
        assert registry.topic(name).retention_bytes is None
        ok = runner.invoke(memq_cli, ["--config", str(path), "topic", "alter", name,
                                      "--set", "retention_bytes=1000", "--set", "storage_group="])
        assert ok.exit_code == 0, ok.output
        assert registry.topic(name).retention_bytes == 1000


async def test_one_consumer_reads_the_notification_topics_of_a_pass_each_answer_its_own(
        memq_config: MemqConfig, unique_name: Callable[[str], str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer per topic and pass cost ~86 ms of wall time each (thousands of topics a pass):
    the janitor's KafkaNotificationLog reads topic after topic on one consumer; a failed topic drops
    it, and the next topic is read by a fresh one."""
    made: list[NotificationConsumer] = []

    class Counted(NotificationConsumer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(log_module, "NotificationConsumer", Counted)
    admin = TopicAdmin(memq_config.kafka)
    storage = make_storage(memq_config)
    publisher = NotificationPublisher(memq_config.kafka, client_id="test-janitor-log")
    log = KafkaNotificationLog(memq_config, timeout_s=30)
    try:
        names = [unique_name(f"log{i}") for i in range(3)]
        keys: dict[str, set[str]] = {}
        for i, name in enumerate(names):
            kafka_topic = f"memq.test.{name}"
            admin.create_topic(kafka_topic, 2, retention_ms=3_600_000)
            locs = [await storage.put_batch(name, b"batch", first_request_id=time.time_ns() + j,
                                            timestamp_ms=1_000_000 * (i + 1) + j, broker_id="b1") for j in range(3)]
            for loc in locs:
                await publisher.publish(kafka_topic, _notification(name, loc))
            keys[name] = {loc.key for loc in locs}
        for i, name in enumerate(names):
            kafka_topic = f"memq.test.{name}"
            assert log.expire(kafka_topic, 0) == {f"topics/{name}": 1_000_000 * (i + 1)}   # nothing before 0
            assert log.references(kafka_topic, 0, 10**13) == keys[name]
        assert len(made) == 1
        with pytest.raises(MemqError, match="does not exist"):
            log.expire(f"memq.test.{unique_name('absent')}", 0)
        assert log.references(f"memq.test.{names[0]}", 100_000, 10**13) == keys[names[0]]
        assert len(made) == 2 and made[0]._closed
    finally:
        log.close()
        publisher.close()
        await storage.close()
