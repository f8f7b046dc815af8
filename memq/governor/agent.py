"""The broker's side of the governor: registration, election, and following assignments.

Runs inside a broker process when `zookeeper.enabled` is set. Kazoo calls run in threads;
watch callbacks only wake the asyncio reconcile loop, which reads the registry, re-registers
the broker if its session expired (no restart needed), and starts or stops TopicProcessors
to match the broker's assignment. It also runs a `Governor` (one broker wins the election),
the `Janitor`, which works only while this broker is the governor. It tells the broker which
partitions of the compacted topics are its share to compact (`compaction.plan.compactor_of`, in
its view of the cluster): every broker compacts, each with its own compactor (built by the
broker on its storage handler and read path), paced by its own byte budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from kazoo.protocol.states import KazooState
from prometheus_client import CollectorRegistry

from memq.compaction.manifest import ManifestPointers
from memq.compaction.plan import compactor_of
from memq.config import MemqConfig, TopicConfig
from memq.errors import CoordinationError, MemqError
from memq.format.metadata import BrokerMetadata, ClusterView, TopicMetadata
from memq.storage import StorageMetrics

from .assignment import BrokerInfo, CapacityAssignment
from .governor import Governor, GovernorMetrics
from .janitor import Janitor
from .registry import ClusterState, Registry

log = logging.getLogger(__name__)


class HostingBroker(Protocol):
    """What the agent drives (memq.broker.Broker fits)."""

    broker_id: str
    url: str

    @property
    def kafka_address(self) -> str: ...   # "" without a Kafka listener

    async def add_topics(self, topics: Iterable[TopicConfig]) -> None: ...
    async def remove_topic(self, name: str, *, moved_to: tuple[str, ...] = ()) -> None: ...
    def health(self) -> str | None: ...

    def compact_share(self, topics: Callable[[], Mapping[str, TopicConfig]],
                      mine: Callable[[str, int], bool]) -> None:
        """Compact the partitions of `topics()` that are `mine` (asked again before each)."""


class BrokerAgent:
    """One broker's membership: keeps it registered, in the election, and hosting its assignment."""

    def __init__(self, broker: HostingBroker, config: MemqConfig,
                 metrics: GovernorMetrics | None = None, storage_metrics: StorageMetrics | None = None) -> None:
        self.broker = broker
        self.config = config
        gc = config.governor
        self.registry = Registry(config.zookeeper, config.cluster.name)
        self.governor = Governor(
            self.registry, broker.broker_id,
            strategy=CapacityAssignment(topic_share_mbps=gc.topic_share_mbps,
                                        max_rebalance_moves=gc.max_rebalance_moves,
                                        imbalance_threshold=gc.imbalance_threshold),
            interval_s=gc.interval_s, rebalance_interval_s=gc.rebalance_interval_s, metrics=metrics)
        self.janitor = Janitor(config, self.governor.metrics.registry, storage_metrics=storage_metrics,
                               manifests=ManifestPointers(self.registry))
        self._janitor_stop = asyncio.Event()
        self._janitor_task: asyncio.Task[None] | None = None
        self.view: ClusterState | None = None
        self.hosted: dict[str, TopicConfig] = {}
        self.registrations = 0
        self._poke = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._drain_task: asyncio.Future[bool] | None = None
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unhealthy_since: float | None = None
        self._reported_health: str | None = None

    @property
    def info(self) -> BrokerInfo:
        bc = self.config.broker
        return BrokerInfo(self.broker.broker_id, self.broker.url, bc.rack, bc.capacity_mbps,
                          max_frame_bytes=bc.max_frame_bytes, kafka_address=self.broker.kafka_address)

    async def start(self) -> None:
        """Connect, register, clear a drain flag left by an earlier run, join the election.

        Topics of the config file are created in ZooKeeper if missing and count as hosted
        here, so the assignment decides whether the broker keeps them.
        """
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(self.registry.start)
        self.registry.add_listener(self._on_state)
        await asyncio.to_thread(self.registry.set_drain, self.broker.broker_id, False)
        known = await asyncio.to_thread(self.registry.topics)
        for cfg in self.config.topics:
            if cfg.name not in known:
                await asyncio.to_thread(self.registry.create_topic, cfg)
            self.hosted[cfg.name] = cfg
        await self._reconcile()
        self.governor.start()
        self._task = asyncio.create_task(self._run(), name=f"memq-agent-{self.broker.broker_id}")
        self._janitor_task = asyncio.create_task(
            self.janitor.run(self.registry.topics, self.governor.leading.is_set, self._janitor_stop),
            name=f"memq-janitor-{self.broker.broker_id}")
        self.broker.compact_share(self._topics, self.compacts)

    async def stop(self) -> None:
        """Leave the election and the registry; hosted topics stay with the broker."""
        self._closing = True
        self._poke.set()
        self._janitor_stop.set()
        tasks = {t for t in (self._task, self._janitor_task) if t is not None}
        if tasks:
            # a flag, not cancel(): wait_for() in 3.11 can swallow a cancel racing a wake-up
            _, pending = await asyncio.wait(tasks, timeout=10)
            for task in pending:
                task.cancel()
        await self.janitor.close()
        await asyncio.to_thread(self.governor.stop)
        await asyncio.to_thread(self.registry.close)

    def request_drain(self) -> None:
        """Signal handler (SIGUSR1): start draining; the broker keeps running, empty."""
        self._drain_task = asyncio.ensure_future(self.drain(self.config.governor.drain_timeout_s))

    async def close(self, *, drain: bool) -> None:
        """Before the broker stops: optionally drain (bounded), then leave the registry."""
        if drain:
            done = await self.drain(self.config.governor.drain_timeout_s)
            log.info("broker %s drained: %s", self.broker.broker_id, "yes" if done else "no (timeout)")
        await self.stop()

    async def drain(self, timeout_s: float = 30.0) -> bool:
        """Ask the governor to move this broker's topics away; wait until they are gone.

        Returns True once nothing is hosted here, False on timeout or when no other broker
        could take the topics (then the broker keeps them: stopping would drop service).
        """
        await asyncio.to_thread(self.registry.set_drain, self.broker.broker_id, True)
        self._poke.set()
        deadline = time.monotonic() + timeout_s
        while self.hosted:
            view = self.view
            if view is not None and not any(not b.draining and b.id != self.broker.broker_id
                                            for b in view.brokers.values()):
                log.warning("drain of %s: no other broker can take its topics", self.broker.broker_id)
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(remaining, 1.0))
            except TimeoutError:
                pass
        return True

    def metadata(self) -> ClusterView | None:
        """The cluster part of /v1/metadata, from the registry view: every live broker, and every
        topic (an unassigned one with no brokers, so readers still learn its notification topic)."""
        view = self.view
        if view is None:
            return None
        cluster = self.config.cluster.name
        return ClusterView(
            brokers=tuple(BrokerMetadata(b.id, b.url, b.rack, b.max_frame_bytes, b.kafka_address)
                          for b in view.brokers.values()),
            topics={name: TopicMetadata(name, cfg.notification_topic_for(cluster), cfg.read_partitions,
                                        tuple(view.topic_urls(name)), cfg.retention_ms, cfg.storage_group,
                                        tuple(sorted(view.log_starts.get(name, {}).items())),
                                        cfg.cleanup_policy, cfg.offsets)
                    for name, cfg in view.topics.items()})

    def _topics(self) -> Mapping[str, TopicConfig]:
        """Every topic, as the last view read them (none before it, or once the agent stops)."""
        view = self.view
        return {} if view is None or self._closing else view.topics

    def compacts(self, topic: str, partition: int) -> bool:
        """Whether this broker compacts `topic`'s `partition` now, in its view of the cluster
        (the share the broker's compactor asks about before each partition)."""
        view = self.view
        if view is None or self._closing:
            return False
        hosts = [b for b in view.assignments.get(topic, ()) if b in view.brokers]
        return compactor_of(topic, partition, hosts, list(view.brokers)) == self.broker.broker_id

    # --- internals -------------------------------------------------------------------------
    def _wake(self, *_: object) -> None:
        """Called from kazoo threads: wake the reconcile loop."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._poke.set)

    def _on_state(self, state: KazooState) -> None:
        log.info("broker %s: ZooKeeper session %s", self.broker.broker_id, state)
        self._wake()

    async def _run(self) -> None:
        interval = self.config.governor.reconcile_interval_s
        while not self._closing:
            try:
                await asyncio.wait_for(self._poke.wait(), interval)
            except TimeoutError:
                pass
            self._poke.clear()
            if self._closing:
                return
            try:
                await self._reconcile()
            except MemqError as e:
                log.warning("broker %s: reconcile failed, retrying: %s", self.broker.broker_id, e)
            except Exception:  # the loop must outlive any one failure: the broker depends on it
                log.exception("broker %s: reconcile failed, retrying", self.broker.broker_id)

    def _health(self) -> str | None:
        """The broker's health as the governor should see it: unhealthy once it has lasted a
        reconcile interval, so one failed publish does not move topics."""
        why = self.broker.health()
        now = time.monotonic()
        if why is None:
            self._unhealthy_since = None
        elif self._unhealthy_since is None:
            self._unhealthy_since = now
        lasted = self._unhealthy_since is not None and \
            now - self._unhealthy_since >= self.config.governor.reconcile_interval_s
        return why if lasted else None

    def _read(self, health: str | None) -> ClusterState:
        if not self.registry.connected:
            raise CoordinationError("ZooKeeper not connected")
        if self.registry.register_broker(self.info, health):
            self.registrations += 1
            log.info("broker %s registered (%d)", self.broker.broker_id, self.registrations)
        elif health != self._reported_health:
            self.registry.set_broker_health(self.info, health)
            log.warning("broker %s reports itself %s", self.broker.broker_id,
                        f"unhealthy: {health}" if health else "healthy again")
        self._reported_health = health
        return self.registry.snapshot(watch=self._wake)

    async def _reconcile(self) -> None:
        state = await asyncio.to_thread(self._read, self._health())
        self.view = state
        me = self.broker.broker_id
        mine = {t: state.topics[t] for t, bs in state.assignments.items() if me in bs and t in state.topics}
        gone = sorted(set(self.hosted) - set(mine))
        for name in gone:
            log.info("broker %s: topic %s moves to %s", me, name, state.topic_urls(name))
        await asyncio.gather(*(self.broker.remove_topic(
            name, moved_to=tuple(u for u in state.topic_urls(name) if u != self.broker.url))
            for name in gone))
        for name in gone:
            del self.hosted[name]
        # `is` first: an unchanged topic's config is the registry cache's same object, and
        # comparing a thousand configs field by field each reconcile showed in profiles
        added = [cfg for name, cfg in sorted(mine.items())
                 if (held := self.hosted.get(name)) is not cfg and held != cfg]
        for cfg in added:
            if cfg.name in self.hosted:  # altered: restart its processor with the new settings
                await self.broker.remove_topic(cfg.name, moved_to=tuple(state.topic_urls(cfg.name)))
                del self.hosted[cfg.name]
        if added:
            log.info("broker %s: hosting %d topics: %s", me, len(added), ", ".join(c.name for c in added[:20])
                     + (", ..." if len(added) > 20 else ""))
        # all at once: their notification topics are created in one Kafka request; if some
        # fail, the others are hosted and the next reconcile retries the rest
        await self.broker.add_topics(added)
        self.hosted.update((cfg.name, cfg) for cfg in added)
        self._changed.set()


async def start_agent(broker: HostingBroker, config: MemqConfig, registry: CollectorRegistry | None = None,
                      storage_metrics: StorageMetrics | None = None) -> BrokerAgent | None:
    """The broker's hook: with `zookeeper.enabled`, start an agent; SIGUSR1 drains. Given the
    broker's registry and storage metrics, the governor's and janitor's metrics are served on
    the broker's /metrics (the janitor's LIST/DELETE requests in the same storage counters)."""
    if not config.zookeeper.enabled:
        return None
    agent = BrokerAgent(broker, config, GovernorMetrics(registry) if registry is not None else None, storage_metrics)
    await agent.start()
    with contextlib.suppress(ValueError, NotImplementedError):  # not the main thread / platform
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, agent.request_drain)
    return agent
