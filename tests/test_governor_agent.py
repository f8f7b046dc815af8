"""The broker agent in-process against a real ZooKeeper, driving a broker that records calls.

The broker processes themselves are covered by test_governor_cluster.py; here the agent's
own rules are pinned down fast: following assignments, drain, and session expiry.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping

import pytest
from kazoo.client import KazooClient

from memq.config import GovernorConfig, MemqConfig, TopicConfig, ZooKeeperConfig, ClusterConfig, BrokerConfig
from memq.governor.agent import BrokerAgent
from memq.governor.registry import Registry
from tests.support.waiting import async_wait_for

pytestmark = pytest.mark.integration


class RecordingBroker:
    """Hosts topics as a set; what a real Broker does with them is tested elsewhere."""

    def __init__(self, broker_id: str) -> None:
        self.broker_id = broker_id
        self.url = f"http://{broker_id}.invalid:1"
        self.kafka_address = ""
        self.topics: dict[str, TopicConfig] = {}
        self.removed: list[tuple[str, tuple[str, ...]]] = []
        self.unhealthy: str | None = None
        self.share: tuple[Callable[[], Mapping[str, TopicConfig]], Callable[[str, int], bool]] | None = None

    def compact_share(self, topics: Callable[[], Mapping[str, TopicConfig]],
                      mine: Callable[[str, int], bool]) -> None:
        self.share = (topics, mine)

    def health(self) -> str | None:
        return self.unhealthy

    async def add_topics(self, topics: Iterable[TopicConfig]) -> None:
        self.topics.update((t.name, t) for t in topics)

    async def remove_topic(self, name: str, *, moved_to: tuple[str, ...] = ()) -> None:
        self.topics.pop(name, None)
        self.removed.append((name, moved_to))


@pytest.fixture
async def setup(devcluster) -> AsyncIterator[tuple[MemqConfig, Registry, list]]:
    zk = ZooKeeperConfig(enabled=True, hosts=devcluster.zk_hosts, root=f"/a-{uuid.uuid4().hex[:8]}",
                         session_timeout_s=2.0, connect_timeout_s=5.0)
    config = MemqConfig(cluster=ClusterConfig("c1"), zookeeper=zk,
                        governor=GovernorConfig(interval_s=0.5, reconcile_interval_s=0.3, drain_timeout_s=10))
    admin = Registry(zk, "c1").start()
    agents: list[BrokerAgent] = []
    yield config, admin, agents
    for a in agents:
        await a.stop()
    admin.close()


async def start(config: MemqConfig, agents: list, bid: str, rack: str) -> tuple[BrokerAgent, RecordingBroker]:
    broker = RecordingBroker(bid)
    cfg = MemqConfig(cluster=config.cluster, zookeeper=config.zookeeper, governor=config.governor,
                     broker=BrokerConfig(broker_id=bid, rack=rack))
    agent = BrokerAgent(broker, cfg)
    await agent.start()
    agents.append(agent)
    return agent, broker


async def test_agents_follow_assignments_and_drain(setup) -> None:
    config, admin, agents = setup
    a1, b1 = await start(config, agents, "b1", "ra")
    a2, b2 = await start(config, agents, "b2", "rb")
    a3, b3 = await start(config, agents, "b3", "rc")
    admin.create_topic(TopicConfig("x", expected_mbps=5))
    await async_wait_for(lambda: sum("x" in b.topics for b in (b1, b2, b3)) == 2, 10, "x on two brokers")
    spare = next(a for a, b in ((a1, b1), (a2, b2), (a3, b3)) if "x" not in b.topics)
    # the spare broker learns the placement from its own ZooKeeper watch, a moment later

    def hosts_of_x() -> tuple[str, ...]:
        view = spare.metadata()
        x = view.topics.get("x") if view is not None else None
        return x.brokers if x is not None else ()

    await async_wait_for(lambda: bool(hosts_of_x()), 10, "x in the spare's metadata")
    assert sorted(hosts_of_x()) == sorted(b.url for b in (b1, b2, b3) if "x" in b.topics)
    host_agent, host = next((a, b) for a, b in ((a1, b1), (a2, b2), (a3, b3)) if "x" in b.topics)
    assert await host_agent.drain(timeout_s=10)
    assert "x" not in host.topics
    name, moved_to = host.removed[-1]
    assert name == "x" and len(moved_to) == 2 and host.url not in moved_to
    await async_wait_for(lambda: sum("x" in b.topics for b in (b1, b2, b3)) == 2, 10, "x back on two brokers")
    # altering a topic restarts its processors with the new settings
    admin.alter_topic(TopicConfig("x", expected_mbps=5, batch_ms=50))
    await async_wait_for(lambda: all(b.topics["x"].batch_ms == 50 for b in (b1, b2, b3) if "x" in b.topics),
                         10, "altered settings applied")
    admin.delete_topic("x")
    await async_wait_for(lambda: not any("x" in b.topics for b in (b1, b2, b3)), 10, "deleted topic stopped")


async def test_session_expiry_reregisters_and_resumes(setup, devcluster) -> None:
    config, admin, agents = setup
    a1, b1 = await start(config, agents, "b1", "ra")
    a2, b2 = await start(config, agents, "b2", "rb")
    admin.create_topic(TopicConfig("y", expected_mbps=5))
    await async_wait_for(lambda: "y" in b1.topics and "y" in b2.topics, 10, "y placed")
    old_session = a1.registry.client.client_id
    # kazoo's documented trick: a second client on the same session id closes it -> expiry
    thief = KazooClient(hosts=devcluster.zk_hosts, client_id=old_session, timeout=2.0)
    await asyncio.to_thread(thief.start, 5)
    await asyncio.to_thread(thief.stop)
    await async_wait_for(lambda: a1.registrations >= 2, 15, "re-registration after expiry")
    assert a1.registry.client.client_id[0] != old_session[0]
    assert "b1" in admin.brokers()
    # and it still follows the governor: a new topic lands on both brokers
    admin.create_topic(TopicConfig("z", expected_mbps=5))
    await async_wait_for(lambda: "z" in b1.topics and "z" in b2.topics, 10, "new topic after expiry")
    assert a1.governor.leading.is_set() or a2.governor.leading.is_set()


async def test_a_broker_that_reports_itself_unhealthy_loses_its_topics_until_it_recovers(setup) -> None:
    config, admin, agents = setup
    pairs = [await start(config, agents, f"b{i}", f"r{i}") for i in range(1, 4)]
    admin.create_topic(TopicConfig("h", expected_mbps=5))
    await async_wait_for(lambda: sum("h" in b.topics for _, b in pairs) == 2, 10, "h on two brokers")
    sick = next(b for _, b in pairs if "h" in b.topics)
    sick.unhealthy = "publishing notifications to Kafka fails: Local: Message timed out"
    await async_wait_for(lambda: "h" not in sick.topics and sum("h" in b.topics for _, b in pairs) == 2,
                         10, "h moved off the unhealthy broker")
    assert admin.snapshot().unhealthy == {sick.broker_id: sick.unhealthy}
    sick.unhealthy = None
    await async_wait_for(lambda: not admin.snapshot().unhealthy, 10, "health reported again")


async def test_the_agent_tells_its_broker_which_compacted_partitions_are_its_share(setup) -> None:
    """The broker compacts (its own compactor); the agent only says which partitions are its
    share: every partition of a compacted topic is exactly one broker's, among those hosting it."""
    config, admin, agents = setup
    pairs = [await start(config, agents, f"b{i}", f"r{i}") for i in range(1, 4)]
    admin.create_topic(TopicConfig("c", expected_mbps=5, read_partitions=4, cleanup_policy="compact"))
    await async_wait_for(lambda: sum("c" in b.topics for _, b in pairs) == 2, 10, "c on two brokers")
    shares = [b.share for _, b in pairs]
    assert all(s is not None for s in shares)

    def owners(p: int) -> list[str]:
        return [b.broker_id for (_, b), s in zip(pairs, shares) if s is not None and "c" in s[0]() and s[1]("c", p)]

    await async_wait_for(lambda: all(len(owners(p)) == 1 for p in range(4)), 10, "each partition one broker's")
    assert {o for p in range(4) for o in owners(p)} == {b.broker_id for _, b in pairs if "c" in b.topics}
    agent, broker = pairs[0]
    await agent.stop()
    agents.remove(agent)
    topics, mine = shares[0]   # type: ignore[misc]
    assert topics() == {} and not any(mine("c", p) for p in range(4))   # a stopped agent gives no share
