"""The janitor never collects an object a pending entry of an open transaction names (`Janitor.held`):
stored at once, it is published only at the commit, after the orphan grace may have passed."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from memq.broker.txn.state import TxnRecord
from memq.broker.txn.store import MemoryTxnStore
from memq.config import GovernorConfig, MemqConfig, TopicConfig
from memq.errors import CoordinationError
from memq.format.notification import Notification
from memq.governor.janitor import Janitor
from memq.storage.base import DeleteFailure, ObjectInfo, ObjectLocation
from tests.support.clock import FakeClock

NOW = 1_800_000_000_000


def obj(name: str) -> ObjectInfo:   # 90 s old: in the sweep window of a 60 s orphan grace
    ts = NOW - 90_000
    return ObjectInfo(ObjectLocation("b", f"00/c/topics/t/{ts:013d}-b1-{name}-a0"), 10, ts)


class Storage:
    def __init__(self, objects: Sequence[ObjectInfo]) -> None:
        self.objects = {o.location.key: o for o in objects}

    async def list_topic(self, topic: str, start_ms: int, end_ms: int, *, all_attempts: bool = False) -> list[ObjectInfo]:
        return [o for o in self.objects.values() if start_ms <= o.timestamp_ms < end_ms]

    async def list_group(self, group: str, start_ms: int, end_ms: int, *, all_attempts: bool = False) -> list[ObjectInfo]:
        return []

    async def delete_many(self, locs: Sequence[ObjectLocation]) -> list[DeleteFailure]:
        for loc in locs:
            self.objects.pop(loc.key, None)
        return []

    async def close(self) -> None:
        pass


class NoPointers:
    def sync_retention(self, kafka_topic: str, retention_ms: int) -> None:
        pass

    def expire(self, kafka_topic: str, before_ms: int) -> dict[str, int]:
        return {}

    def references(self, kafka_topic: str, start_ms: int, end_ms: int) -> set[str]:
        return set()

    def close(self) -> None:
        pass


def janitor(storage: Storage) -> Janitor:
    config = MemqConfig(governor=GovernorConfig(retention_grace_s=60, orphan_grace_s=60))
    return Janitor(config, CollectorRegistry(), storage=storage, notifications=NoPointers(),
                   clock=FakeClock(wall_s=NOW / 1000))


def pending_store(key: str) -> MemoryTxnStore:
    store = MemoryTxnStore()
    v = store.write("tx", TxnRecord(1, 0), -1)
    store.add_pending("tx", v, [("memq.dev.t", Notification(2, "t", "b", key, 10, 4, 1, 0, 1, 2, 3, "b1", 0, 5))])
    return store


TOPICS = {"t": TopicConfig("t", storage_group="")}


async def test_an_object_pending_in_a_transaction_is_no_orphan() -> None:
    held, orphan = obj("held"), obj("orphan")
    storage = Storage([held, orphan])
    j = janitor(storage)
    j.held = pending_store(held.location.key).pending_objects
    [report] = await j.run_once(TOPICS)
    assert [o.location.key for o in report.orphans] == [orphan.location.key]
    assert list(storage.objects) == [held.location.key]


async def test_without_the_rule_both_go_and_an_unreadable_store_deletes_nothing() -> None:
    storage = Storage([obj("held"), obj("orphan")])
    j = janitor(storage)

    def down() -> set[str]:
        raise CoordinationError("ZooKeeper: no answer within 5s")

    j.held = down
    assert await j.run_once(TOPICS) == [] and len(storage.objects) == 2   # the pass failed: retried, nothing lost
    [report] = await janitor(storage).run_once(TOPICS)   # no rule

    assert len(report.orphans) == 2 and not storage.objects

