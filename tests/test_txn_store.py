"""memq.broker.txn.store: the memory store and the ZooKeeper store (real ZooKeeper of the dev
cluster) keep one contract: versioned records, pending entries only at the checked version."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from memq.broker.txn.service import ProducerIds, Transactions
from memq.broker.txn.state import GroupOffsets, TxnRecord, TxnState
from memq.broker.txn.store import (
    Audited,
    MemoryTxnStore,
    TxnStore,
    ZooKeeperTxnStore,
    decode,
    decode_pending,
    encode,
)
from memq.devcluster import DevCluster
from memq.errors import CorruptDataError, TxnConflictError, UnsupportedVersionError
from memq.format.notification import Notification
from memq.governor.registry import Registry
from tests.support.clock import FakeClock
from tests.support.txn_fakes import FakePublisher, FakeRelay, publish_path

FULL = TxnRecord(123, 4, TxnState.PREPARE_COMMIT, 30_000, 1_800_000_000_000, 3, 1_800_000_000_001,
                 frozenset({("orders", 0), ("orders", 2)}), frozenset({"g", "native"}),
                 {"g": GroupOffsets(7, "member-1", "static-1", {("in", 0): (41, "meta")}),
                  "native": GroupOffsets(offsets={("in", 1): (9, "")}, native=True)})


def note(key: str) -> Notification:
    return Notification(2, "orders", "bucket", key, 10, 4, 1, 0, 1, 2, 3, "b1", 0, 5, offset=16)


def test_a_record_round_trips_and_foreign_bytes_are_refused() -> None:
    assert decode(encode(FULL), "here") == FULL
    with pytest.raises(UnsupportedVersionError):
        decode(encode(FULL).replace(b'"v":1', b'"v":2'), "here")
    with pytest.raises(CorruptDataError):
        decode(b'{"v":1,"producer_id":1}', "here")
    with pytest.raises(CorruptDataError):
        decode_pending(b"not json", "here")


def contract(store: TxnStore, txn: str) -> None:
    assert store.read(txn) == (None, -1)
    v = store.write(txn, TxnRecord(1, 0), -1)
    with pytest.raises(TxnConflictError):
        store.write(txn, TxnRecord(2, 0), -1)   # created meanwhile by another broker
    assert store.read(txn) == (TxnRecord(1, 0), v)
    v2 = store.write(txn, FULL, v)
    with pytest.raises(TxnConflictError):
        store.write(txn, TxnRecord(1, 1), v)
    store.add_pending(txn, v2, [("memq.c.orders", note("a")), ("memq.c.orders", note("b"))])
    audited = [Audited("orders", 2**64 - 1, 3, 17, 100, 0xFFFFFFFF, 1_800_000_000_000)]
    store.add_pending(txn, v2, [("memq.c.orders", note("c"))], audited)
    store.add_pending(txn, v2, [("memq.c.orders", note("d"))], partition=2)   # a compacted topic's partition 2
    with pytest.raises(TxnConflictError):
        store.add_pending(txn, v, [("memq.c.orders", note("stale"))])
    assert [(t, n.key) for t, n in store.pending(txn)] == [("memq.c.orders", k) for k in "abcd"]
    assert store.pending(txn)[0][1] == note("a")
    assert [e.audited for e in store.entries(txn)] == [[], audited, []]   # an entry without: the field absent
    assert [e.partition for e in store.entries(txn)] == [-1, -1, 2]       # likewise: Kafka's pick
    assert {"a", "b", "c", "d"} <= store.pending_objects()
    assert txn in store.ids()
    assert store.drop_pending(txn) == 3 and store.pending(txn) == [] and store.drop_pending(txn) == 0
    assert store.read(txn) == (FULL, v2)
    with pytest.raises(TxnConflictError):
        store.delete(txn, v)
    store.delete(txn, v2)
    assert store.read(txn) == (None, -1) and txn not in store.ids()


def test_memory_store() -> None:
    contract(MemoryTxnStore(), "app/1 tx")


@pytest.fixture(scope="module")
def registry(devcluster: DevCluster) -> Iterator[Registry]:
    config = devcluster.config(cluster=f"txnzk{uuid.uuid4().hex[:6]}")
    with Registry(dataclasses.replace(config.zookeeper, enabled=True), config.cluster.name) as r:
        yield r


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_zookeeper_store(registry: Registry) -> None:
    store = ZooKeeperTxnStore(registry)
    contract(store, "app/1 tx")   # an id with '/' and ' ': quoted into one znode name
    assert "app/1 tx" not in store.ids()   # deleted, pending folder and all
    v = store.write("app/1 tx", FULL, -1)   # an id used again
    assert "app/1 tx" in store.ids()
    assert ZooKeeperTxnStore(registry).read("app/1 tx") == (FULL, v)   # another broker sees the same state


@pytest.mark.integration
@pytest.mark.timeout(120)
async def test_a_transaction_over_zookeeper_commits_what_two_brokers_stored(registry: Registry) -> None:
    """The coordinator and a partition leader (two services, one ZooKeeper): the leader's entries,
    checked against its cached state, are published at the coordinator's commit, once."""
    published = FakePublisher()
    coordinator, leader = (Transactions(ZooKeeperTxnStore(registry), publish_path(pub), FakeRelay(), FakeClock(),
                                        registry=CollectorRegistry()) for pub in (published, FakePublisher()))
    txn = f"zk-{uuid.uuid4().hex[:6]}"
    ids = await coordinator.init_producer_id(txn, 10_000)
    assert isinstance(ids, ProducerIds)
    assert await coordinator.add_partitions(txn, ids, [("orders", 0)]) is None
    for key in ("a", "b"):
        assert await leader.check_produce(txn, ids, "orders", 0) is None
        assert await leader.add_pending(txn, ids, "orders", 0, [("memq.c.orders", note(key))]) is None
    assert {"a", "b"} <= ZooKeeperTxnStore(registry).pending_objects()
    assert await coordinator.end(txn, ids, commit=True) is None
    assert [n.key for _, n in published.published] == ["a", "b"]
    assert ZooKeeperTxnStore(registry).pending(txn) == []
    assert await leader.add_pending(txn, ids, "orders", 0, [("memq.c.orders", note("late"))]) is not None
