"""A ZooKeeper pause longer than the session timeout expires every session at once; the first
broker back wins the election while the others are still re-registering. The new governor
must not move topics off those healthy brokers, yet still repair a broker that stays gone."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memq.config import TopicConfig, ZooKeeperConfig
from memq.devcluster import DevCluster
from memq.governor.assignment import AssignmentResult, BrokerInfo, Move
from memq.governor.governor import Governor, avoid_unhealthy, hold_missing
from memq.governor.registry import Registry
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

SESSION_S = 4.0                 # ZooKeeper's minimum with its default 2 s tick
GRACE_S = 10.0


@pytest.fixture
def own_zk(tmp_path: Path) -> Iterator[DevCluster]:
    """A ZooKeeper of this test's own: pausing it must not expire other tests' sessions."""
    with DevCluster(tmp_path / "zk", s3=False, kafka=False) as dc:
        yield dc


def info(bid: str) -> BrokerInfo:
    return BrokerInfo(bid, f"http://127.0.0.1:{7100 + int(bid[1:])}", f"r{bid}", 100.0)


@pytest.mark.slow   # a soak (faults or scale played out for 20-60 s): `python -m bench soak`
def test_a_new_governor_waits_for_brokers_to_reregister_after_a_zookeeper_pause(own_zk: DevCluster) -> None:
    # the grace runs from the new session's start; the steps before `back` re-registers take a
    # few seconds on a loaded machine, so it is longer than the session here (default: equal)
    zk = ZooKeeperConfig(enabled=True, hosts=own_zk.zk_hosts or "", root="/grace", session_timeout_s=SESSION_S,
                         connect_timeout_s=5.0, missing_broker_grace_s=GRACE_S)
    regs = {f"b{i}": Registry(zk, "c1") for i in range(3)}
    admin = Registry(zk, "c1")
    govs: list[Governor] = []
    try:
        for bid, r in regs.items():
            r.start().register_broker(info(bid))
        admin.start()
        for n in range(6):
            admin.create_topic(TopicConfig(f"t{n}", expected_mbps=5))
        # built before their sessions begin, as a broker's agent does: each sees its own session start
        govs = [Governor(r, bid, interval_s=0.3) for bid, r in regs.items()]
        for g in govs:
            g.start()
        wait_for(lambda: len(admin.assignments()) == 6 and all(len(bs) == 2 for bs in admin.assignments().values()),
                 15, "initial placement")
        before = admin.assignments()
        assert all(len(bs) == 2 for bs in before.values())

        os.kill(own_zk.pids["zookeeper"], signal.SIGSTOP)
        try:
            time.sleep(2 * SESSION_S)              # every session expires
        finally:
            os.kill(own_zk.pids["zookeeper"], signal.SIGCONT)
        wait_for(lambda: all(r.connected for r in regs.values()) and admin.connected, 20, "reconnection")
        leader = wait_for(lambda: next((g.identifier for g in govs if g.leading.is_set()), None), 20, "a governor")
        others = sorted(b for b in regs if b != leader)
        back, gone = others[0], others[1]
        govs[int(gone[1:])].stop()
        regs.pop(gone).close()                          # this one never comes back

        moves: list[dict[str, tuple[str, ...]]] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                moves.append(admin.assignments())
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        regs[leader].register_broker(info(leader))     # the first back: it won the election
        time.sleep(1.5)
        regs[back].register_broker(info(back))          # still within the grace: nothing moved meanwhile
        # once the grace is over, the topics of the broker that stayed gone are repaired
        wait_for(lambda: all(gone not in bs and len(bs) == 2 for bs in admin.assignments().values()),
                 GRACE_S + 10, f"repair of {gone}'s topics after the grace")
        stop.set()
        watcher.join()
        for seen in moves:                              # the healthy brokers never lost a topic
            for t, bs in before.items():
                for b in (leader, back):
                    assert b not in bs or b in seen[t], (t, b, before[t], seen[t])
    finally:
        for g in govs:
            g.stop()
        for r in (*regs.values(), admin):
            r.close()


def test_hold_missing_keeps_only_the_topics_of_missing_brokers_in_place() -> None:
    current = {"a": ("b0", "b1"), "b": ("b0", "b2"), "gone": ("b1", "b2")}
    result = AssignmentResult({"a": ("b0", "b2"), "b": ("b0", "b2"), "new": ("b0", "b2")},
                              moves=(Move("a", ("b1",), ("b2",), "broker-lost"),
                                     Move("new", (), ("b0", "b2"), "new-topic")))
    held = hold_missing(result, current, {"b1"})
    assert held.assignment == {"a": ("b0", "b1"), "b": ("b0", "b2"), "new": ("b0", "b2")}   # a deleted topic still goes
    assert [m.topic for m in held.moves] == ["new"]


def test_unhealthy_brokers_get_no_topics_unless_every_broker_is_unhealthy() -> None:
    brokers = [info("b0"), info("b1"), dataclasses.replace(info("b2"), draining=True)]
    marked = avoid_unhealthy(brokers, {"b1": "kafka"})
    assert [b.draining for b in marked] == [False, True, True]
    assert avoid_unhealthy(brokers, {"b0": "kafka", "b1": "kafka"}) == brokers   # moving would help nobody
