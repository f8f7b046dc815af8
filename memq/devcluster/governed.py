"""`GovernedCluster`: N broker processes registered in ZooKeeper, one of them the governor.

The one way `memq dev`, the benches, the tests and the fault harness start a governed cluster.
It takes the servers (S3, Kafka, ZooKeeper) from a `DevCluster` it starts itself, or from any
`Servers` the caller started (the fault harness runs them in network namespaces); starts
brokers `b1..bN` on racks round-robin (any two consecutive brokers differ), each where its
`BrokerHost` says; waits until every broker is registered and a governor is elected; creates
topics through the governor's topic admin (ZooKeeper topic + Kafka notification topic) and
waits until the brokers the governor chose host them. Faults: `kill_broker` (SIGKILL),
`stop_broker` (SIGTERM), `restart_broker` (same id, host and port, so clients' broker lists
stay valid), `add_broker`. Every wait is bounded; every process dies with this one
(`process.py`), and `stop()` leaves none behind.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, TypeVar

from memq.config import BrokerConfig, GovernorConfig, GroupConfig, MemqConfig, TopicConfig
from memq.devcluster.broker_process import BrokerProcess, config_toml, probe_trust
from memq.devcluster.cluster import DevCluster
from memq.errors import DevClusterError

if TYPE_CHECKING:
    from memq.devcluster.secure import DevSecurity
    from memq.governor.registry import Registry

RACKS = ("rack-a", "rack-b", "rack-c")
"""Broker i (from 1) runs on RACKS[(i - 1) % 3]: any two consecutive brokers differ."""
FAST_GOVERNOR = GovernorConfig(interval_s=1.0, reconcile_interval_s=0.5, drain_timeout_s=10.0, compaction_interval_s=2.0)
"""Faster cycles than production defaults, so placement shows within a second; drains on
shutdown are bounded so stopping never waits long."""
BROKER_STOP_S = 10.0

T = TypeVar("T")


class Servers(Protocol):
    """What a governed cluster needs of its servers: a config pointing at them."""

    def config(self, cluster: str = "dev") -> MemqConfig: ...


@dataclass(frozen=True)
class BrokerHost:
    """Where one broker runs: the address it binds and advertises (port 0: a free one, kept
    across restarts), and an argv prefix that puts it on that host (`ip netns exec NS`)."""

    host: str = "127.0.0.1"
    port: int = 0
    launcher: tuple[str, ...] = ()


def loopback(broker_id: str) -> BrokerHost:
    return BrokerHost()


class GovernedCluster:
    """Start with `start()` or `with GovernedCluster(run_dir, brokers=3) as gc:`.

    `servers`: started by the caller, who also stops them; None starts a `DevCluster` under
    `run_dir` for the lifetime of this cluster. `session_timeout_s` overrides the ZooKeeper
    session timeout (how long a dead broker keeps its topics); `broker` is the template for
    every broker's settings (id, rack, host and port are filled in), `group` their consumer
    groups' settings.
    """

    def __init__(self, run_dir: str | Path, brokers: int = 3, *, servers: Servers | None = None,
                 cluster: str = "dev", governor: GovernorConfig = FAST_GOVERNOR,
                 session_timeout_s: float | None = None, broker: BrokerConfig = BrokerConfig(),
                 placement: Callable[[str], BrokerHost] = loopback, ready_timeout_s: float = 30.0,
                 security: DevSecurity | None = None, group: GroupConfig = GroupConfig()) -> None:
        if brokers < 1:
            raise DevClusterError(f"a governed cluster needs at least 1 broker, not {brokers}")
        self.run_dir = Path(run_dir)
        self.cluster = cluster
        self.ready_timeout_s = ready_timeout_s
        self._initial = brokers
        self._owned: DevCluster | None = None
        if servers is None:
            servers = self._owned = DevCluster(self.run_dir / "servers")
        self.servers: Servers = servers
        self._governor = governor
        self._session_timeout_s = session_timeout_s
        self._template = broker
        self._group = group
        self._placement = placement
        self._security = security
        self._base: MemqConfig | None = None
        self._registry: Registry | None = None
        self.brokers: dict[str, BrokerProcess] = {}

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> GovernedCluster:
        """Servers (if owned), brokers, registry; returns once all are registered and governed."""
        from memq.governor.registry import Registry

        try:
            if self._owned is not None:
                self._owned.start()
            base = self.servers.config(cluster=self.cluster)
            zk = dataclasses.replace(base.zookeeper, enabled=True)
            if self._session_timeout_s is not None:
                zk = dataclasses.replace(zk, session_timeout_s=self._session_timeout_s)
            self._base = dataclasses.replace(base, zookeeper=zk, governor=self._governor)
            if self._security is not None:
                self._base = self._security.brokers(self._base)
            self._registry = Registry(zk, self.cluster).start()
            # launched together, then awaited: a start is mostly its interpreter's imports
            brokers = [self._broker(f"b{i + 1}").launch() for i in range(self._initial)]
            for broker in brokers:
                broker.ready(self.ready_timeout_s)
            self.wait_registered()
            self.governor()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the brokers (SIGTERM, bounded; resumed first if paused), then owned servers."""
        errors = []
        for broker in self.brokers.values():
            try:
                if broker.alive():
                    os.killpg(broker.pid, signal.SIGCONT)
                broker.stop(BROKER_STOP_S)
            except (DevClusterError, ProcessLookupError) as e:
                errors.append(str(e))
        self.brokers.clear()
        if self._registry is not None:
            self._registry.close()
            self._registry = None
        if self._owned is not None:
            self._owned.stop()
        if errors:
            raise DevClusterError("; ".join(errors))

    def __enter__(self) -> GovernedCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # --- configs -----------------------------------------------------------------------------

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            raise DevClusterError("the governed cluster is not started")
        return self._registry

    @property
    def base(self) -> MemqConfig:
        """The servers with ZooKeeper and the governor on: what each broker is given."""
        if self._base is None:
            raise DevClusterError("the governed cluster is not started")
        return self._base

    def config(self) -> MemqConfig:
        """Client config: `base` with producer.brokers = every broker's URL (dead ones too:
        a restarted broker comes back at the same URL), and the token when secured."""
        urls = ",".join(b.url for b in self.brokers.values() if b.url)
        config = dataclasses.replace(self.base, producer=dataclasses.replace(self.base.producer, brokers=urls))
        return self._security.client(config) if self._security is not None else config

    def write_client_config(self, path: str | Path) -> Path:
        """`config()` as a TOML file that `memq --config FILE` and `load_config` read (readable
        by its owner only: it may hold a token)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(config_toml(self.config()))
        return path

    # --- brokers -----------------------------------------------------------------------------

    def _next_id(self) -> str:
        return f"b{len(self.brokers) + 1}"

    def rack(self, broker_id: str) -> str:
        return self.broker(broker_id).config.broker.rack

    def broker(self, broker_id: str) -> BrokerProcess:
        try:
            return self.brokers[broker_id]
        except KeyError:
            raise DevClusterError(f"no broker {broker_id!r} (have {sorted(self.brokers)})") from None

    def _start_broker(self, broker_id: str, port: int | None = None) -> BrokerProcess:
        return self._broker(broker_id, port).start(self.ready_timeout_s)

    def _broker(self, broker_id: str, port: int | None = None) -> BrokerProcess:
        """`broker_id`'s process, not started yet, in `brokers` (its config: placement, rack, port)."""
        where = self._placement(broker_id)
        rack = RACKS[(int(broker_id[1:]) - 1) % len(RACKS)]
        settings = dataclasses.replace(self._template, broker_id=broker_id, rack=rack, host=where.host,
                                       port=where.port if port is None else port)
        proc = BrokerProcess(dataclasses.replace(self.base, broker=settings, group=self._group), self.run_dir / "brokers",
                             launcher=where.launcher)
        self.brokers[broker_id] = proc
        return proc

    def add_broker(self) -> str:
        """One more broker (next id, next rack); its id once it is registered."""
        broker_id = self._next_id()
        self._start_broker(broker_id)
        self.wait_registered()
        return broker_id

    def kill_broker(self, broker_id: str) -> None:
        """SIGKILL: a crash, nothing flushed; its ZooKeeper session expires later."""
        self.broker(broker_id).kill()

    def stop_broker(self, broker_id: str) -> None:
        """SIGTERM: the broker drains (flushes, stores, acks) and leaves ZooKeeper."""
        self.broker(broker_id).stop(BROKER_STOP_S)

    def restart_broker(self, broker_id: str) -> None:
        """Start a stopped or killed broker again with the same id, rack, host and port;
        returns once its new process is registered (its own session, not the dead one's)."""
        old = self.broker(broker_id)
        old.stop(BROKER_STOP_S)
        stale = self._session(broker_id)
        port = int(old.url.rsplit(":", 1)[1]) if old.url else None
        self._start_broker(broker_id, port)
        self._until(lambda: (s := self._session(broker_id)) is not None and s != stale,
                    lambda: f"restarted broker {broker_id} not registered in ZooKeeper")

    def _session(self, broker_id: str) -> int | None:
        """The ZooKeeper session owning `broker_id`'s registration (None: not registered)."""
        stat = self.registry.client.exists(f"{self.registry.brokers_path}/{broker_id}")
        return None if stat is None else int(stat.ephemeralOwner)

    def live(self) -> list[str]:
        return [bid for bid, b in self.brokers.items() if b.alive()]

    # --- governor and topics -----------------------------------------------------------------

    def wait_registered(self) -> set[str]:
        """The ids registered in ZooKeeper, once every live broker is."""
        def registered() -> set[str] | None:
            ids = set(self.registry.brokers())
            return ids if ids >= set(self.live()) else None
        return self._until(registered, lambda: f"brokers {self.live()} not all registered in ZooKeeper")

    def governor(self, exclude: str | None = None) -> str:
        """The elected governor's broker id, once one that is live (and not `exclude`) holds
        the election lock."""
        def elected() -> str | None:
            gov = self.registry.governor()
            return gov if gov is not None and gov != exclude and gov in self.live() else None
        return self._until(elected, lambda: f"no governor elected among live brokers {self.live()}")

    def create_topic(self, topic: TopicConfig, brokers: int | None = None) -> tuple[str, ...]:
        """Create `topic` through the governor's topic admin; its placement once hosted."""
        from memq.governor.topics import TopicManager
        from memq.notify import TopicAdmin

        TopicManager(self.registry, TopicAdmin(self.base.kafka), self.cluster).create(topic)
        return self.wait_placed(topic.name, brokers)

    def placement(self, topic: str) -> tuple[str, ...]:
        """The brokers the governor assigned `topic` to now (() if none)."""
        return self.registry.assignments().get(topic, ())

    def wait_placed(self, topic: str, brokers: int | None = None) -> tuple[str, ...]:
        """The placement once every assigned broker is live and hosts `topic` (and there are
        `brokers` of them, if given)."""
        from memq.governor.topics import hosted_topics

        trust = probe_trust(self.base)

        def placed() -> tuple[str, ...] | None:
            got = self.placement(topic)
            live = self.live()
            ok = (got and (brokers is None or len(got) == brokers)
                  and all(b in live and topic in hosted_topics(self.brokers[b].url, trust) for b in got))
            return got if ok else None
        return self._until(placed, lambda: f"topic {topic} not placed on live brokers "
                                           f"(assigned: {list(self.placement(topic)) or 'none'})")

    def _until(self, probe: Callable[[], T | None], what: Callable[[], str]) -> T:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            got = probe()
            if got:
                return got
            if time.monotonic() > deadline:
                raise DevClusterError(f"{what()} within {self.ready_timeout_s:g}s; "
                                      f"see the broker logs in {self.run_dir / 'brokers'}")
            time.sleep(0.1)
