"""The broker: the core (TopicProcessors, their groups, admission) assembled with its doors.

`Broker` is the composition root and implements `memq.broker.seam.BrokerCore`, the one thing
its doors (`doors.http`, `doors.websocket`, the Kafka listener) are given.

`Broker` owns the hosted topics (`add_topics` / `remove_topic`, which the governor drives;
until then the topics of the config), the storage handler, the notification publisher and its
publish path (`publish.PublishPath`), and, with ZooKeeper, the compactor of its share of the
compacted partitions (`compact_share`, which the governor's agent calls), built on the same
storage handler and read path.
Ready means ready: `/healthz` answers 200 only once the broker hosts what it must (the
config's topics; governed, also its assignment: `start(ready=False)`, then `set_ready()`).
`stop()` is the graceful shutdown: refuse new connections, answer CLOSING to new writes,
seal, store, notify and ack every batch in flight, then close the connections.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence

from aiohttp import web

from memq.audit.emitter import AuditEmitter, make_audit_sink
from memq.clock import Clock, SystemClock
from memq.compaction.manifest import ManifestPointers
from memq.compaction.run import Compactor
from memq.config import MemqConfig, TopicConfig
from memq.errors import NotifyError
from memq.format.kafka_records import KafkaCodec
from memq.format.metadata import BrokerMetadata, ClusterMetadata, ClusterView, StorageMetadata, TopicMetadata
from memq.kafka_api.records import framing_codec
from memq.format.wire import AckCode
from memq.governor.registry import Registry
from memq.notify import KafkaTopic, NotificationPublisher, TopicAdmin, TopicCreator
from memq.schema.check import Checker
from memq.schema.service import SchemaRegistry
from memq.schema.store import MemorySchemaStore, SchemaStore, ZooKeeperSchemaStore
from memq.security.quota import Throttler
from memq.security.tls import server_context
from memq.storage import StorageHandler, StorageMetrics, make_storage

from .cluster_admin import ClusterAdmin
from .admission import Admission, Check
from .coordinator import coordinator_of
from .doors.http import HttpDoor
from .doors.kafka import KafkaListener
from .consumer_groups import Groups
from .doors.schema_registry import SchemaRegistryDoor
from .guard import Guard
from .metrics import BrokerMetrics
from .storage_group import GroupWriter, GroupWriters
from .processor import TopicProcessor
from .publish import Publisher, PublishPath
from .read_cache import ReadCache
from .bases import Bases, Counting, MemoryCheckpoints
from .logs import Logs
from .reads import Reads
from .share.metrics import register as register_share_metrics
from .share.service import Shares
from .share.store import MemoryStateStore, ShareStateStore, ZooKeeperStateStore
from .txn.relay import GroupOffsetRelay
from .group.legacy import LegacyOffsets
from .group.service import GroupCoordinator
from .group.store import GroupStore, MemoryGroupStore, ZooKeeperGroupStore
from .group.txn_offsets import TxnGroupOffsets
from .txn.service import Transactions
from .txn.store import MemoryTxnStore, TxnStore, ZooKeeperTxnStore

log = logging.getLogger(__name__)


class Broker:
    """`storage`, `publisher`, `admin` and `clock` default to the real ones (made on `start`);
    `checks` are extra admission rules every produce door applies (memq.broker.admission)."""

    def __init__(self, config: MemqConfig, *, storage: StorageHandler | None = None,
                 publisher: Publisher | None = None, admin: TopicCreator | None = None,
                 clock: Clock | None = None, checks: Sequence[Check] = ()) -> None:
        self.config = config
        self.broker_id = config.broker.broker_id
        self.metrics = BrokerMetrics(self.broker_id)
        self._clock = clock or SystemClock()
        self.storage_metrics = StorageMetrics(self.metrics.registry)   # shared with the janitor, if any
        self._storage = storage
        self._publisher = publisher
        self._admin = admin
        self._processors: dict[str, TopicProcessor] = {}
        self._groups: GroupWriters | None = None
        self._moved: dict[str, tuple[str, ...]] = {}
        self._draining = False
        self._runner: web.AppRunner | None = None
        self._kafka: KafkaListener | None = None   # broker.kafka_port >= 0: the Kafka wire protocol
        self._kafka_audit: AuditEmitter | None = None
        self._reads: Reads | None = None   # made on start, with the storage
        self._logs: Logs | None = None     # ... over the reads
        self._counting: Counting | None = None   # ... its hosted dense partitions kept counted
        self._shares: Shares | None = None   # made on start: share groups on the Kafka listener
        self._share_registry: Registry | None = None   # ZooKeeper for share groups and transactions
        self._txns: Transactions | None = None   # made on start, with the publisher
        self._group_coordinator: GroupCoordinator | None = None   # made on start: Kafka clients' groups
        self._path: PublishPath | None = None   # made on start: every notification goes through it
        self._pointers: ManifestPointers | None = None   # compacted topics' manifests (with ZooKeeper)
        self.compactor: Compactor | None = None   # made on start with ZooKeeper; runs once told its share
        self._schemas: SchemaRegistry | None = None   # made on start: the registry over the cluster's store
        self.groups = Groups(config.kafka.bootstrap_servers, config.cluster.name, self.broker_id)
        self.cluster_view: Callable[[], ClusterView | None] | None = None   # governed: from ZooKeeper
        self.cluster_admin: ClusterAdmin | None = None   # governed: topics and ACLs through ZooKeeper
        self.url = ""
        self.guard = Guard(config.security, self.metrics.denials)
        self.quotas = Throttler(config.quota.table(), burst_s=config.quota.burst_s,
                                max_delay_s=config.quota.max_throttle_ms / 1000)
        self.admission = Admission(guard=self.guard, quotas=self.quotas, metrics=self.metrics, clock=self._clock,
                                   processor=self._processors.get, where_is=self.where_is, checks=checks)
        self.app = web.Application(middlewares=[self.guard.middleware])
        self._http = HttpDoor(self, self.app)
        SchemaRegistryDoor(self, self.app)

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self, *, ready: bool = True) -> str:
        """Listen on the configured host/port (0 = any free port), host the configured topics.

        `ready=False` (a governed broker): /healthz answers 503 "starting" until `set_ready()`,
        once the broker hosts its assignment; process managers and the dev cluster wait on it.
        """
        if not ready:
            self._http.starting = "starting: waiting to host the topics assigned to it"
        bc = self.config.broker
        if self._storage is None:
            self._storage = make_storage(self.config, metrics=self.storage_metrics)
        if self._publisher is None:
            self._publisher = NotificationPublisher(self.config.kafka, client_id=f"memq-broker-{self.broker_id}",
                                                    producers=self.config.broker.notify_producers)
        if self._admin is None:
            self._admin = TopicAdmin(self.config.kafka)
        self._reads = Reads(self.config.kafka, self._storage, ReadCache(bc.read_cache_bytes, self.metrics),
                            self.metrics, broker_id=self.broker_id, compression=self._framing_codec)
        # every notification, a storage group's parts and a transaction's at its commit alike
        self._path = PublishPath(self._publisher, self.metrics, clock=self._clock,
                                 republish_s=bc.notify_retry_ms / 1000, reads=self._reads)
        if bc.kafka_port >= 0:
            # Kafka clients carry no memq audit emitter: the broker reports their Messages.
            self._kafka_audit = make_audit_sink(self.config, client_id=f"memq-broker-{self.broker_id}-audit")
        self._group_coordinator = await self._make_group_coordinator()
        self._txns = await self._make_txns()
        # dense topics' offsets: counted from checkpoints in ZooKeeper (the share groups' session) when there is one
        self._logs = Logs(self._reads, Bases(self._reads, self._share_registry or MemoryCheckpoints()))
        if bc.kafka_port >= 0:   # dense offsets serve Kafka readers: keep the hosted partitions counted
            self._counting = Counting(self._logs.bases, lambda: [t for name, t in self.metadata().topics.items()
                                                                 if name in self._processors])
            self._counting.start()
        if self._share_registry is not None:   # ZooKeeper: compacted topics' manifests are there
            self.compactor = Compactor(self.config, self._manifest_pointers(), self.metrics.registry,
                                       storage=self._storage, reads=self._reads, clock=self._clock,
                                       broker_id=self.broker_id, base_of=self._dense_base)
        self._schemas = await self._make_schemas()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bc.host, bc.port))
        sc = self.config.security
        tls = server_context(sc.tls_cert_file, sc.tls_key_file, sc.tls_client_ca_file) if sc.tls_cert_file else None
        scheme = "https" if tls is not None else "http"
        self.url = bc.advertised_url or f"{scheme}://{bc.host}:{sock.getsockname()[1]}"
        # Accept connections only once the configured topics are open: a client (or a process
        # manager polling /healthz) that reached us earlier would be told the topic is unknown.
        # The port is bound first, so a clash fails fast; until listen() clients see "refused".
        try:
            await self.add_topics(self.config.topics)
            if bc.kafka_port >= 0:
                self._shares = await self._make_shares()
                self._kafka = KafkaListener(self, self._kafka_audit)
                await self._kafka.start(bc.host, bc.kafka_port, bc.kafka_advertised_host, tls)
        except BaseException:
            sock.close()
            raise
        self._runner = web.AppRunner(self.app, handle_signals=False, access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, sock, ssl_context=tls).start()
        self._txns.start(self._coordinates)
        self.group_coordinator.start()
        log.info("broker %s listening on %s, topics %s", self.broker_id, self.url, sorted(self._processors))
        return self.url

    async def stop(self) -> None:
        """Graceful shutdown: flush and ack everything in flight, then close."""
        self._draining = True
        timeout = self.config.broker.shutdown_timeout_ms / 1000
        deadline = self._clock.monotonic() + timeout
        names = list(self._processors)
        try:
            async with asyncio.timeout(timeout):
                await asyncio.gather(*(self.remove_topic(n) for n in names))
        except TimeoutError:
            log.error("shutdown: batches of %s not finished within %gs", names, timeout)
        await self._http.shutdown(max(deadline - self._clock.monotonic(), 0.5))
        if self._kafka is not None:
            await self._kafka.stop()
        if self._kafka_audit is not None:
            await asyncio.to_thread(self._kafka_audit.close)
        if self._counting is not None:
            await self._counting.close()
        if self.compactor is not None:
            await self.compactor.close()
        if self._shares is not None:
            await self._shares.close()
        if self._txns is not None:
            await self._txns.close()
        if self._group_coordinator is not None:
            await self._group_coordinator.close()
        if self._share_registry is not None:
            await asyncio.to_thread(self._share_registry.close)
        if self._reads is not None:
            await self._reads.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._publisher is not None:
            await asyncio.to_thread(self._publisher.close)
        if self._storage is not None:
            await self._storage.close()

    async def __aenter__(self) -> Broker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _make_shares(self) -> Shares:
        """Share-partition state in ZooKeeper when the cluster has it (its own session), else in memory."""
        store: ShareStateStore = MemoryStateStore()
        if self.config.zookeeper.enabled:
            if self._share_registry is None:
                self._share_registry = await asyncio.to_thread(
                    Registry(self.config.zookeeper, self.config.cluster.name).start)
            store = ZooKeeperStateStore(self._share_registry)
            self.reads.use_manifests(self._manifest_pointers())   # compacted topics' prefixes
        shares = Shares(self.config.share, store, self._clock, self.broker_id, self)
        register_share_metrics(shares, self.metrics.registry)
        return shares

    async def _make_group_coordinator(self) -> GroupCoordinator:
        """Kafka clients' groups in ZooKeeper when the cluster has it (shared with share groups'
        session), else in memory (one broker); a group's offsets committed through the relay
        before are taken over on its first load (`legacy_offsets`)."""
        store: GroupStore = MemoryGroupStore()
        if self.config.zookeeper.enabled:
            if self._share_registry is None:
                self._share_registry = await asyncio.to_thread(
                    Registry(self.config.zookeeper, self.config.cluster.name).start)
            store = ZooKeeperGroupStore(self._share_registry)
        legacy = LegacyOffsets(self.groups, self._topics)
        return GroupCoordinator(self.config.group, store, self._clock, self.broker_id, self.metadata, legacy.read)

    async def _make_txns(self) -> Transactions:
        """Transaction state in ZooKeeper when the cluster has it (shared with share groups' session),
        else in memory (one broker); group offsets relayed as the Kafka door's are."""
        store: TxnStore = MemoryTxnStore()
        if self.config.zookeeper.enabled:
            if self._share_registry is None:
                self._share_registry = await asyncio.to_thread(
                    Registry(self.config.zookeeper, self.config.cluster.name).start)
            store = ZooKeeperTxnStore(self._share_registry)
        assert self._path is not None
        relay = TxnGroupOffsets(self.group_coordinator, GroupOffsetRelay(
            self.groups, self._topics, f"memq-broker-{self.broker_id}-txn"), self._topics)
        bc = self.config.broker
        return Transactions(store, self._path, relay, self._clock, registry=self.metrics.registry,
                            max_timeout_ms=bc.txn_max_timeout_ms, scan_s=bc.txn_scan_ms / 1000,
                            full_scan_s=30 * bc.txn_scan_ms / 1000, id_expiration_ms=bc.txn_id_expiration_ms,
                            audit=self._kafka_audit)

    def _manifest_pointers(self) -> ManifestPointers:
        """The compacted topics' manifest pointers on the broker's ZooKeeper session (one watch set)."""
        assert self._share_registry is not None
        if self._pointers is None:
            self._pointers = ManifestPointers(self._share_registry)
        return self._pointers

    async def _dense_base(self, cfg: TopicConfig, partition: int, note: int) -> int:
        """Where a dense partition's notification `note` starts, as this broker counts it (its compactor's
        start when retention took notifications after the compacted prefix)."""
        assert self._logs is not None   # made before the compactor
        scheme = await self._logs.bases.scheme(self.metadata().topics[cfg.name], partition, note + 1)
        return scheme.start_of(note)

    def compact_share(self, topics: Callable[[], Mapping[str, TopicConfig]],
                      mine: Callable[[str, int], bool]) -> None:
        """Compact the partitions of `topics()` that are `mine` (this broker's share, as the
        governor's agent sees it), a pass every `governor.compaction_interval_s` until `stop`.
        Without ZooKeeper (no manifests) there is nothing to compact: logged, ignored."""
        if self.compactor is None:
            log.warning("broker %s: told to compact, but it has no ZooKeeper for manifests", self.broker_id)
            return
        self.compactor.start(topics, mine)
    async def _make_schemas(self) -> SchemaRegistry:
        """The registry over the cluster's store in ZooKeeper (the session share groups and
        transactions use), else over this broker's memory (a broker without ZooKeeper)."""
        store: SchemaStore = MemorySchemaStore()
        if self.config.zookeeper.enabled:
            assert self._share_registry is not None, "the transactions' store opened the session"
            store = await asyncio.to_thread(ZooKeeperSchemaStore, self._share_registry)
        registry = SchemaRegistry(store, cluster=self.config.cluster.name)
        self.admission.payloads = Checker(registry)
        return registry

    @property
    def schemas(self) -> SchemaRegistry:
        assert self._schemas is not None, "start() first"
        return self._schemas

    def _coordinates(self, txn_id: str) -> bool:
        """This broker coordinates `txn_id` (or no broker has a Kafka listener: any may)."""
        return coordinator_of(self.metadata(), txn_id) in (None, self.broker_id)

    @property
    def txns(self) -> Transactions:
        assert self._txns is not None, "start() first"
        return self._txns

    # --- topics (the governor drives these) ----------------------------------------------------

    def set_ready(self) -> None:
        """The broker hosts what it must: /healthz may answer 200."""
        self._http.starting = None

    async def add_topic(self, topic: TopicConfig) -> None:
        await self.add_topics((topic,))

    async def add_topics(self, topics: Iterable[TopicConfig]) -> None:
        """Host `topics` here (those not hosted yet); first their notification topics are created
        with `read_partitions` partitions, all in one Kafka request. NotifyError names those whose
        notification topic could not be created; the others are hosted all the same."""
        new = {t.name: t for t in topics if t.name not in self._processors}
        if not new:
            return
        assert self._storage is not None and self._path is not None and self._admin is not None, "start() first"
        if self._groups is None:
            # readers at the tail (Kafka's, memq's Consumers through /v1/read) want what was just
            # stored: keep it (the read cache's fill on write)
            self._groups = GroupWriters(storage=self._storage, path=self._path, broker_id=self.broker_id,
                                        metrics=self.metrics, clock=self._clock, reads=self._reads)
        cluster = self.config.cluster.name
        failed = await asyncio.to_thread(self._admin.create_topics, [
            KafkaTopic(t.notification_topic_for(cluster), t.read_partitions) for t in new.values()])
        for topic in new.values():
            if topic.notification_topic_for(cluster) in failed:
                continue
            self._processors[topic.name] = self._new_processor(topic, self._groups.writer(topic))
            self.metrics.hosted(topic)
            self._moved.pop(topic.name, None)
        if failed:
            more = f" (and {len(failed) - 3} more)" if len(failed) > 3 else ""
            raise NotifyError(f"broker {self.broker_id} cannot host {len(failed)} topics: "
                              + "; ".join(list(failed.values())[:3]) + more)

    def _new_processor(self, topic: TopicConfig, writer: GroupWriter) -> TopicProcessor:
        assert self._storage is not None and self._publisher is not None, "start() first"
        bc = self.config.broker
        return TopicProcessor(topic, cluster=self.config.cluster.name, broker_id=self.broker_id, storage=self._storage,
                              publisher=self._publisher, metrics=self.metrics, busy_wait_s=bc.busy_wait_ms / 1000,
                              dedup_capacity=bc.dedup_messages, dedup_window_s=bc.dedup_window_ms / 1000, group=writer,
                              clock=self._clock)

    async def remove_topic(self, name: str, *, moved_to: tuple[str, ...] = ()) -> None:
        """Stop writes (later requests get NOT_HERE naming `moved_to`), seal, upload, ack, drop."""
        proc = self._processors.pop(name, None)
        if proc is None:
            return
        self._moved[name] = tuple(moved_to)
        self.metrics.unhosted(proc.config)
        await proc.close()

    @property
    def kafka_address(self) -> str:
        """"host:port" of this broker's Kafka listener, "" when it has none."""
        return self._kafka.address if self._kafka is not None else ""

    def processor(self, topic: str) -> TopicProcessor | None:
        return self._processors.get(topic)

    def _framing_codec(self, topic: str) -> KafkaCodec:
        """The codec a topic's own records go to Kafka readers in: as hosted here, else as the
        config file says, else the broker default (a topic read here but hosted elsewhere)."""
        p = self._processors.get(topic)
        cfg = p.config if p is not None else next((t for t in self.config.topics if t.name == topic), None)
        return framing_codec(cfg, self.config.broker)

    def where_is(self, topic: str) -> tuple[AckCode, str, tuple[str, ...]]:
        """The error ack for a topic not hosted here: (code, reason, brokers that host it)."""
        if topic in self._moved:
            return AckCode.NOT_HERE, f"topic {topic} is not hosted on broker {self.broker_id}", self._moved[topic]
        if self._draining:
            return AckCode.CLOSING, f"broker {self.broker_id} is shutting down", ()
        return AckCode.UNKNOWN_TOPIC, f"topic {topic!r} is not known to broker {self.broker_id}", ()

    # --- what the doors may ask (memq.broker.seam.BrokerCore) ----------------------------------

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def shares(self) -> Shares:
        assert self._shares is not None, "start() with a Kafka listener first"
        return self._shares

    @property
    def group_coordinator(self) -> GroupCoordinator:
        assert self._group_coordinator is not None, "start() first"
        return self._group_coordinator

    @property
    def reads(self) -> Reads:
        assert self._reads is not None, "start() first"
        return self._reads

    @property
    def logs(self) -> Logs:
        assert self._logs is not None, "start() first"
        return self._logs

    def _topics(self) -> Mapping[str, TopicMetadata]:
        return self.metadata().topics

    def hosted(self) -> list[str]:
        return sorted(self._processors)

    def metadata(self) -> ClusterMetadata:
        """This broker's view (its own topics), overlaid with the cluster's when governed."""
        c = self.config
        own = ClusterMetadata(
            cluster=c.cluster.name, broker_id=self.broker_id, kafka_bootstrap_servers=c.kafka.bootstrap_servers,
            storage=StorageMetadata(kind=c.storage.kind, bucket=c.s3.bucket, endpoint_url=c.s3.endpoint_url,
                                    region=c.s3.region, root_dir=c.storage.root_dir),
            brokers=(BrokerMetadata(self.broker_id, self.url, c.broker.rack, c.broker.max_frame_bytes,
                                    self.kafka_address),),
            topics={name: TopicMetadata(name, p.notification_topic, p.config.read_partitions, (self.url,),
                                          p.config.retention_ms, p.config.storage_group,
                                          cleanup_policy=p.config.cleanup_policy, offsets=p.config.offsets)
                    for name, p in self._processors.items()})
        return own.overlaid(self.cluster_view() if self.cluster_view is not None else None)

    def health(self) -> str | None:
        """None when this broker can take ack=all writes; otherwise why it cannot."""
        if self._draining:
            return f"broker {self.broker_id} is shutting down"
        return self._publisher.health() if self._publisher is not None else None
