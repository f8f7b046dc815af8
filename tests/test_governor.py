"""Registry, election and governor against a real ZooKeeper (no broker processes)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from memq.config import TopicConfig, ZooKeeperConfig
from memq.errors import CoordinationError, LeadershipLostError, UnknownTopicError
from memq.governor.assignment import BrokerInfo, CapacityAssignment
from memq.governor.governor import Governor
from memq.governor.registry import Registry
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def zk(devcluster) -> ZooKeeperConfig:
    """A fresh root per test, short sessions so expiry tests stay fast."""
    return ZooKeeperConfig(enabled=True, hosts=devcluster.zk_hosts, root=f"/t-{uuid.uuid4().hex[:8]}",
                           session_timeout_s=4.0, connect_timeout_s=5.0)


@pytest.fixture
def registries(zk: ZooKeeperConfig) -> Iterator[Callable[[], Registry]]:
    made: list[Registry] = []

    def make() -> Registry:
        r = Registry(zk, "c1").start()
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def broker(i: int, rack: str = "") -> BrokerInfo:
    return BrokerInfo(f"b{i}", f"http://127.0.0.1:{7000 + i}", rack, 100.0)


def test_registry_roundtrip_topics_brokers_drain(registries) -> None:
    r = registries()
    assert r.register_broker(broker(1, "ra")) is True
    assert r.register_broker(broker(1, "ra")) is False          # same session: nothing to do
    cfg = TopicConfig("orders", read_partitions=4, expected_mbps=30)
    r.create_topic(cfg)
    with pytest.raises(CoordinationError, match="already exists"):
        r.create_topic(cfg)
    assert r.topic("orders") == cfg
    r.alter_topic(TopicConfig("orders", read_partitions=4, expected_mbps=60))
    assert r.topics()["orders"].expected_mbps == 60
    r.set_drain("b1")
    assert r.brokers() == {"b1": BrokerInfo("b1", "http://127.0.0.1:7001", "ra", 100.0, draining=True)}
    r.set_drain("b1", False)
    assert not r.brokers()["b1"].draining
    r.delete_topic("orders")
    with pytest.raises(UnknownTopicError):
        r.topic("orders")
    with pytest.raises(UnknownTopicError):
        r.delete_topic("orders")


def test_ephemeral_registration_disappears_with_session_and_is_replaced_on_restart(registries) -> None:
    r1, observer = registries(), registries()
    r1.register_broker(broker(1))
    r1.close()                                       # process gone: session ends
    assert "b1" not in observer.brokers()
    # a SIGKILLed process leaves its znode until its session times out; a restart replaces it
    crashed = registries()
    crashed.register_broker(broker(2))
    restarted = registries()
    assert restarted.register_broker(broker(2)) is True
    assert observer.brokers()["b2"].url == broker(2).url


def test_unreachable_zookeeper_fails_with_clear_error() -> None:
    zk = ZooKeeperConfig(hosts="127.0.0.1:1", root="/x", session_timeout_s=4, connect_timeout_s=1)
    with pytest.raises(CoordinationError, match="connect_timeout_s"):
        Registry(zk, "c1").start()


def test_one_governor_assigns_and_successor_takes_over(registries) -> None:
    regs = [registries() for _ in range(3)]
    racks = ["ra", "rb", "rc"]
    for i, r in enumerate(regs):
        r.register_broker(broker(i, racks[i]))
    admin = registries()
    for n in range(4):
        admin.create_topic(TopicConfig(f"t{n}", expected_mbps=5))
    govs = [Governor(r, f"b{i}", interval_s=0.5) for i, r in enumerate(regs)]
    for g in govs:
        g.start()
    try:
        wait_for(lambda: len(admin.assignments()) == 4, 10, "assignments")
        assert sum(g.leading.is_set() for g in govs) == 1
        leader = next(i for i, g in enumerate(govs) if g.leading.is_set())
        assert admin.governor() == f"b{leader}"
        for t, bs in admin.assignments().items():
            assert len(bs) == 2 and len({racks[int(b[1:])] for b in bs}) == 2, (t, bs)
        # the governor's broker dies: its session ends, another governor takes over and
        # moves the dead broker's topics to the survivors
        govs[leader].stop()
        regs[leader].close()
        dead = f"b{leader}"
        new = wait_for(lambda: [i for i, g in enumerate(govs) if i != leader and g.leading.is_set()],
                       10, "a new governor")
        assert len(new) == 1
        wait_for(lambda: all(dead not in bs and len(bs) == 2 for bs in admin.assignments().values()),
                 10, "reassignment after governor death")
        # a later failure is still handled
        other = next(i for i in range(3) if i not in (leader, new[0]))
        regs[other].close()
        wait_for(lambda: all(bs == (f"b{new[0]}",) for bs in admin.assignments().values()),
                 10, "reassignment of the second failure")
        # topic deletion removes its assignment
        admin.delete_topic("t0")
        wait_for(lambda: "t0" not in admin.assignments(), 10, "assignment of a deleted topic removed")
    finally:
        for g in govs:
            g.stop()


def test_stopping_a_waiting_governor_logs_no_warning(registries, caplog: pytest.LogCaptureFixture) -> None:
    leader, waiting = Governor(registries(), "b1", interval_s=0.5), Governor(registries(), "b2", interval_s=5)
    leader.start()
    try:
        wait_for(leader.leading.is_set, 10, "a governor")
        waiting.start()
        def contenders() -> int:
            return len(leader.registry.client.get_children(leader.registry.election_path))

        wait_for(lambda: contenders() == 2, 10, "the second contender")
        with caplog.at_level(logging.WARNING, logger="memq.governor.governor"):
            waiting.stop()               # cancels its lock wait: kazoo raises an empty CancelledError
        assert caplog.records == []
        wait_for(lambda: contenders() == 1, 10, "the stopped contender's znode removed")
        assert leader.leading.is_set()
    finally:
        leader.stop()


def test_a_governor_takes_up_its_own_contender_znode_left_in_a_live_session(registries) -> None:
    # a create whose reply was lost (or a cleanup delete that failed) on a flapping connection leaves
    # the governor's contender znode in a session that lives on: first in line, nobody may lead
    r = registries()
    g = Governor(r, "b1", interval_s=0.3)
    r.client.create(f"{r.election_path}/{g.election_lock.prefix}", b"b1", ephemeral=True, sequence=True,
                    makepath=True)
    g.start()
    try:
        wait_for(g.leading.is_set, 15, "the governor to lead past its own leftover znode")
        assert len(r.client.get_children(r.election_path)) == 1
    finally:
        g.stop()


def test_stale_governor_cannot_write(registries) -> None:
    r = registries()
    r.register_broker(broker(1))
    lock = r.client.Lock(r.election_path, "b1")
    assert lock.acquire(timeout=5)
    fence = f"{r.election_path}/{lock.node}"
    r.write_assignments({"a": ("b1",)}, fence=fence)
    assert r.assignments() == {"a": ("b1",)}
    lock.release()
    with pytest.raises(LeadershipLostError):
        r.write_assignments({"a": ("b2",)}, fence=fence)
    assert r.assignments() == {"a": ("b1",)}


def test_drain_flag_moves_topics_and_rebalance_is_rate_limited(registries) -> None:
    regs = [registries() for _ in range(3)]
    for i, r in enumerate(regs):
        r.register_broker(broker(i))
    admin = registries()
    for n in range(6):
        admin.create_topic(TopicConfig(f"t{n}", expected_mbps=12))
    strategy = CapacityAssignment(max_rebalance_moves=1, imbalance_threshold=0.05)
    gov = Governor(regs[0], "b0", strategy=strategy, interval_s=0.3, rebalance_interval_s=1.5)
    gov.start()
    try:
        wait_for(lambda: len(admin.assignments()) == 6, 10, "assignments")
        admin.set_drain("b1")
        wait_for(lambda: all("b1" not in bs for bs in admin.assignments().values()), 5, "drain")
        # b1 comes back (flag cleared): load is uneven, at most 1 topic per 1.5 s moves back
        before = admin.assignments()
        admin.set_drain("b1", False)
        history: list[tuple[float, dict[str, tuple[str, ...]]]] = [(time.monotonic(), before)]
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            a = admin.assignments()
            if a != history[-1][1]:
                history.append((time.monotonic(), a))
            time.sleep(0.05)
        changes = history[1:]
        assert len(changes) >= 2, "rebalance did not happen"
        for (_, a0), (_, a1) in zip(history, history[1:]):
            moved = [t for t in a1 if a1[t] != a0.get(t)]
            assert len(moved) == 1, moved
        gaps = [t1 - t0 for (t0, _), (t1, _) in zip(changes, changes[1:])]
        assert all(g > 1.2 for g in gaps), gaps
        assert any("b1" in bs for bs in history[-1][1].values())
    finally:
        gov.stop()


def test_cli_drain_status_undrain(registries, zk: ZooKeeperConfig) -> None:
    from click.testing import CliRunner

    from memq.cli import main
    from memq.cli._common import CliState
    from memq.cli.governor import governor

    regs = [registries() for _ in range(2)]
    for i, r in enumerate(regs):
        r.register_broker(broker(i, f"r{i}"))
    admin = registries()
    admin.create_topic(TopicConfig("cli-topic", expected_mbps=5))
    gov = Governor(regs[0], "b0", interval_s=0.3)
    gov.start()
    env = {"MEMQ_ZOOKEEPER_HOSTS": zk.hosts, "MEMQ_ZOOKEEPER_ROOT": zk.root, "MEMQ_CLUSTER_NAME": "c1"}
    runner = CliRunner()
    try:
        wait_for(lambda: admin.assignments().get("cli-topic"), 10, "assignment")
        out = runner.invoke(governor, ["status"], obj=CliState(None), env=env, terminal_width=200)
        assert out.exit_code == 0, out.output
        assert "governor: b0" in out.output and "cli-topic" in out.output
        # one broker drained: with only one other broker the topic shrinks onto it
        out = runner.invoke(main, ["broker", "drain", "b1", "--timeout", "10"], env=env)
        assert out.exit_code == 0, out.output
        assert "no topics assigned" in out.output
        assert admin.assignments()["cli-topic"] == ("b0",)
        out = runner.invoke(governor, ["undrain", "b1"], obj=CliState(None), env=env)
        assert out.exit_code == 0 and not admin.drains()
        wait_for(lambda: len(admin.assignments()["cli-topic"]) == 2, 10, "topic back on 2 brokers")
        out = runner.invoke(governor, ["topic", "create", "bad", "--set", "batch_ms=-1"],
                            obj=CliState(None), env=env)
        assert out.exit_code != 0 and "batch_ms" in (out.output + str(out.exception))
    finally:
        gov.stop()


def test_registry_reads_each_znode_once_per_change(registries) -> None:
    """Cycles read the whole registry; only what a watch reported changed is read again, and
    changes by another process and by this one are seen."""
    r, other = registries(), registries()
    for i in range(30):
        r.create_topic(TopicConfig(f"t{i}"))
    r.write_assignments({f"t{i}": ("b1",) for i in range(30)})
    r.register_broker(broker(1))
    events: list[object] = []
    first = r.snapshot(watch=events.append)
    assert len(first.topics) == 30 and first.assignments["t7"] == ("b1",)
    loads = r.cache.loads
    assert r.snapshot() == first
    assert r.cache.loads == loads                           # nothing changed: nothing read

    other.alter_topic(TopicConfig("t3", expected_mbps=42))  # another process: by watch
    wait_for(lambda: r.snapshot().topics["t3"].expected_mbps == 42, timeout_s=10, what="altered topic seen")
    assert events, "the subscriber was not told"
    assert r.cache.loads - loads <= 2                      # the changed znode (a racing read at most twice)

    r.write_assignments({"t4": ("b2",), "t5": None})         # this process: seen at once, no wait
    state = r.snapshot()
    assert state.assignments["t4"] == ("b2",) and "t5" not in state.assignments
    other.delete_topic("t6")
    wait_for(lambda: "t6" not in r.topics(), timeout_s=10, what="deleted topic gone")
    other.set_drain("b1")
    wait_for(lambda: r.brokers()["b1"].draining, timeout_s=10, what="drain flag seen")


def test_registry_cache_is_read_again_after_session_loss(registries, zk: ZooKeeperConfig) -> None:
    r, other = registries(), registries()
    r.create_topic(TopicConfig("a"))
    assert set(r.topics()) == {"a"}
    r.client.stop()                  # watches go with the connection: nothing cached may outlive it
    assert len(r.cache) == 0
    other.create_topic(TopicConfig("b"))
    r.client.start(timeout=zk.connect_timeout_s)
    assert set(r.topics()) == {"a", "b"}
