"""GovernedCluster on the real path: election, placement across racks, governor failover,
restart under the same id and URL, a broker added later, and a stop that leaves no process."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from memq.client.consumer import Consumer
from memq.client.producer import Producer
from memq.config import TopicConfig, load_config
from memq.devcluster import BrokerHost, DevCluster, GovernedCluster
from memq.errors import DevClusterError


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _round_trip(gc: GovernedCluster, topic: str, values: list[bytes]) -> set[bytes]:
    """Send `values` at ack=all through the client config, read them back with a fresh group."""
    config = gc.config()

    async def send() -> None:
        async with Producer(config.producer) as producer:
            await asyncio.gather(*[await producer.send(topic, v) for v in values])

    asyncio.run(send())
    seen: set[bytes] = set()
    with Consumer(config, topic, group_id=f"{topic}-check") as consumer:
        for _ in range(60):
            seen.update(bytes(r.value) for r in consumer.poll(0.5))
            if seen >= set(values):
                break
    return seen


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_governed_cluster_fails_over_restarts_grows_and_stops_clean(
        devcluster: DevCluster, tmp_path: Path, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("gov")
    gc = GovernedCluster(tmp_path, brokers=3, servers=devcluster, cluster=unique_name("c"), session_timeout_s=2.0)
    with gc:
        governor = gc.governor()
        assert governor in {"b1", "b2", "b3"}
        assert [gc.rack(b) for b in ("b1", "b2", "b3")] == ["rack-a", "rack-b", "rack-c"]
        placed = gc.create_topic(TopicConfig(name=topic, read_partitions=2), brokers=2)
        assert len({gc.rack(b) for b in placed}) == 2
        client = load_config(gc.write_client_config(tmp_path / "client.toml"))
        assert client.zookeeper.enabled and client.cluster.name == gc.cluster
        assert set(client.producer.brokers.split(",")) == {b.url for b in gc.brokers.values()}

        # the governor's broker dies: another is elected and the topic leaves the dead broker
        gc.kill_broker(governor)
        assert gc.governor(exclude=governor) != governor
        after = gc.wait_placed(topic, brokers=2)
        assert governor not in after and set(after) <= set(gc.live())

        # it comes back under its id and URL, registered by its own new session
        url = gc.broker(governor).url
        gc.restart_broker(governor)
        assert gc.broker(governor).alive() and gc.broker(governor).url == url
        assert governor in gc.wait_registered()

        # a fourth broker joins on the next rack; the topic still takes writes
        assert gc.add_broker() == "b4" and gc.rack("b4") == "rack-a"
        assert "b4" in gc.registry.brokers()
        values = [f"{topic}-{i}".encode() for i in range(20)]
        assert _round_trip(gc, topic, values) >= set(values)
        pids = [b.pid for b in gc.brokers.values() if b.alive()]
    assert gc.brokers == {}
    assert all(_gone(pid) for pid in pids)
    assert devcluster.pids and all(not _gone(pid) for pid in devcluster.pids.values())  # not ours to stop


def test_a_cluster_without_brokers_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DevClusterError, match="at least 1 broker"):
        GovernedCluster(tmp_path, brokers=0)


def test_a_broker_that_cannot_start_names_itself_and_stops_the_rest(
        devcluster: DevCluster, tmp_path: Path, unique_name: Callable[[str], str]) -> None:
    """A launcher that fails (here: `false`) ends start() with the broker's name; nothing is left."""
    gc = GovernedCluster(tmp_path, brokers=2, servers=devcluster, cluster=unique_name("c"), ready_timeout_s=10,
                         placement=lambda bid: BrokerHost(launcher=("false",) if bid == "b2" else ()))
    with pytest.raises(DevClusterError, match="broker b2 did not start"):
        gc.start()
    assert gc.brokers == {}
