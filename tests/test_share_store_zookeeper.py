"""memq.broker.share.store.ZooKeeperStateStore on a real ZooKeeper: a share-partition's state
survives its owner, and a broker that took it over fences the previous owner's writes."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from memq.broker.share.partition import AckOutcome, RecordState, SharePartition
from memq.broker.share.store import ZooKeeperStateStore
from memq.devcluster import DevCluster
from memq.errors import StateFencedError
from memq.governor.registry import Registry
from tests.support.clock import FakeClock

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_state_survives_and_a_takeover_fences_the_old_owner(devcluster: DevCluster) -> None:
    config = devcluster.config(cluster=f"sharezk{uuid.uuid4().hex[:6]}")
    zk = dataclasses.replace(config.zookeeper, enabled=True)
    with Registry(zk, config.cluster.name) as r1, Registry(zk, config.cluster.name) as r2:
        old, new = ZooKeeperStateStore(r1), ZooKeeperStateStore(r2)
        key = ("orders-workers", "orders", 3)
        state, v = old.claim(key, "b1")
        assert state is None
        clock = FakeClock()
        sp = SharePartition(clock)
        sp.begin(0)
        sp.acquire("m", [0, 1, 2])
        sp.acknowledge("m", 0, 1, AckOutcome.ACCEPT)
        v = old.write(key, "b1", sp.snapshot(), v)
        taken, v2 = new.claim(key, "b2")   # b2 leads the partition now
        assert taken is not None and (taken.start, taken.end) == (2, 3)
        back = SharePartition(clock, snapshot=taken)
        assert back.state_of(2) == (RecordState.AVAILABLE, 1) and back.redeliverable(5) == [2]
        with pytest.raises(StateFencedError):
            old.write(key, "b1", sp.snapshot(), v)
        assert new.write(key, "b2", back.snapshot(), v2) > v2
