"""memq.broker.group.store: a group's state and offsets survive its coordinator, and a broker
that took the group over fences the previous coordinator's writes and commits (ZooKeeper for
real, and the memory store used without it)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import pytest

from memq.broker.group.store import GroupStore, MemoryGroupStore, ZooKeeperGroupStore
from memq.devcluster import DevCluster
from memq.errors import StateFencedError
from memq.governor.registry import Registry

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture(params=["memory", "zookeeper"])
def stores(request: pytest.FixtureRequest) -> Iterator[tuple[GroupStore, GroupStore]]:
    if request.param == "memory":
        one = MemoryGroupStore()
        yield one, one
        return
    devcluster: DevCluster = request.getfixturevalue("devcluster")
    config = devcluster.config(cluster=f"groupzk{uuid.uuid4().hex[:6]}")
    zk = dataclasses.replace(config.zookeeper, enabled=True)
    with Registry(zk, config.cluster.name) as r1, Registry(zk, config.cluster.name) as r2:
        yield ZooKeeperGroupStore(r1), ZooKeeperGroupStore(r2)


def test_takeover_loads_the_group_and_fences_the_old_coordinator(stores: tuple[GroupStore, GroupStore]) -> None:
    old, new = stores
    group = f"orders/{uuid.uuid4().hex[:4]}"   # any group name, slashes too
    first = old.claim(group, "b1")
    assert first.kind is None
    v = old.write(group, "b1", "consumer", {"epoch": 3}, first.version)
    old.commit(group, v, {("orders", 0): (10, ""), ("orders", 1): (20, "m"), ("audit.log", 0): (5, "")})
    old.commit(group, v, {("orders", 0): (11, "")})
    assert old.groups()[group] == "consumer"
    taken = new.claim(group, "b2")
    assert taken.kind == "consumer" and taken.state == {"epoch": 3}
    assert new.offsets(group) == {("orders", 0): (11, ""), ("orders", 1): (20, "m"), ("audit.log", 0): (5, "")}
    with pytest.raises(StateFencedError):
        old.commit(group, v, {("orders", 0): (99, "")})
    with pytest.raises(StateFencedError):
        old.write(group, "b1", "consumer", {"epoch": 4}, v)
    with pytest.raises(StateFencedError):
        old.delete(group, v)
    v2 = new.write(group, "b2", "classic", {"generation": 1}, taken.version)
    new.commit(group, v2, {("orders", 0): (12, ""), ("orders", 1): (-1, "")})   # -1: OffsetDelete
    old.commit(group, None, {("orders", 2): (7, "txn")})   # a transaction's, from any broker
    assert new.offsets(group) == {("orders", 0): (12, ""), ("orders", 2): (7, "txn"), ("audit.log", 0): (5, "")}
    back = new.claim(group, "b2")
    new.delete(group, back.version)
    assert group not in new.groups() and new.claim(group, "b2").kind is None and new.offsets(group) == {}


def test_a_group_is_known_once_claimed_or_committed_to_and_stays_known_when_deleted(
        stores: tuple[GroupStore, GroupStore]) -> None:
    store, _ = stores
    claimed, committed = f"c-{uuid.uuid4().hex[:4]}", f"t-{uuid.uuid4().hex[:4]}"
    assert not store.known(claimed)
    loaded = store.claim(claimed, "b1")
    assert store.known(claimed) and claimed not in store.groups()   # nothing stored yet
    store.commit(committed, None, {("orders", 0): (1, "")})   # a transaction's, before any claim
    assert store.known(committed) and store.groups()[committed] == ""
    store.delete(claimed, loaded.version)
    assert store.known(claimed)
