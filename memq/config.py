"""Configuration: dataclasses, loaded from a TOML file and `MEMQ_*` environment variables.

One naming scheme everywhere: the TOML key `[section] field` is the environment variable
`MEMQ_SECTION_FIELD` (upper case). Environment wins over the file. Unknown keys and bad
values fail at start with a `ConfigError` that names the setting, never later at run time.
Topic settings live in `TopicConfig` only, so the governor can own them later.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

from memq.errors import ConfigError
from memq.security.acl import parse_rules
from memq.security.quota import QuotaTable, parse_overrides
from memq.security.tokens import parse_entries

MiB = 1024 * 1024
INTERNAL_PREFIX = "__"      # topic names reserved for memq's own topics (the audit topic)
DEFAULT_STORAGE_GROUP = "shared"   # the cluster's one shared storage group, unless a topic names another
_KEY_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
_log = logging.getLogger(__name__)


def setting(default: Any, *, ge: float | None = None, gt: float | None = None,
            le: float | None = None) -> Any:
    """A numeric field with its allowed range (`ge` <= v, `gt` < v, v <= `le`) in its metadata,
    so `check_ranges` validates every setting the same way."""
    return field(default=default, metadata={"ge": ge, "gt": gt, "le": le})


def allowed_range(f: dataclasses.Field[Any]) -> str:
    """The range of a `setting` field in words, e.g. ">= 0" or "between 1 and 65535"."""
    ge, gt, le = (f.metadata.get(k) for k in ("ge", "gt", "le"))
    if ge is not None and le is not None:
        return f"between {ge} and {le}"
    bounds = ((">=", ge), (">", gt), ("<=", le))
    return " and ".join(f"{op} {b}" for op, b in bounds if b is not None)


def check_ranges(obj: Any, where: str) -> None:
    """ConfigError naming the first field of dataclass `obj` outside its `setting` range."""
    for f in dataclasses.fields(obj):
        ge, gt, le = (f.metadata.get(k) for k in ("ge", "gt", "le"))
        v = getattr(obj, f.name)
        if v is None:
            continue
        if ((ge is not None and v < ge) or (gt is not None and v <= gt) or (le is not None and v > le)):
            raise ConfigError(f"{where}.{f.name} = {v!r} is out of range: must be {allowed_range(f)}")


def check_choice(obj: Any, name: str, where: str) -> None:
    """ConfigError unless the `Literal` field `name` of dataclass `obj` holds one of its values
    (`build` checks what it loads; this catches a value set in code)."""
    allowed = typing.get_args(typing.get_type_hints(type(obj))[name])
    if getattr(obj, name) not in allowed:
        raise ConfigError(f"{where}.{name} = {getattr(obj, name)!r} is not one of {', '.join(allowed)}")


def check_files(obj: Any, where: str, names: tuple[str, ...]) -> None:
    """ConfigError naming the first of the path settings `names` of `obj` that is set but is no file."""
    for name in names:
        path = getattr(obj, name)
        if path and not Path(path).is_file():
            raise ConfigError(f"{where}.{name} = {path!r}: no such file")


@dataclass(frozen=True)
class S3Config:
    """An S3 endpoint (AWS, MinIO, moto). `endpoint_url=None` means AWS itself. Credentials:
    `access_key_id`/`secret_access_key` (+ `session_token`), else `profile`, else the AWS chain
    (environment, web identity, instance or task role); every S3 client memq creates uses them
    (`memq.storage.s3_store.s3_session`).

    A call retries with backoff until `retry_budget_s` after its start (at most `max_attempts`
    tries); a broker caps the budget at 2/3 of producer.request_timeout_ms so acks stay on time.
    """

    endpoint_url: str | None = None
    bucket: str = "memq"
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)   # temporary credentials (STS)
    # A named profile of the AWS config files (~/.aws/config, credentials): static keys, SSO, or a
    # role to assume (`role_arn` + `source_profile`/`credential_source`, refreshed by boto3).
    profile: str | None = None
    connect_timeout_s: float = setting(5.0, gt=0)
    read_timeout_s: float = setting(30.0, gt=0)
    max_attempts: int = setting(50, ge=1)
    base_backoff_s: float = setting(0.05, ge=0)
    max_backoff_s: float = setting(2.0, ge=0)
    max_pool_connections: int = setting(32, ge=1)
    retry_budget_s: float = setting(20.0, gt=0)
    # A PEM file of CA certificates trusted for an HTTPS endpoint (a private CA in front of MinIO or
    # a proxy), added to the system's roots. Unset: the AWS_CA_BUNDLE environment variable, if any.
    ca_bundle: str | None = None
    # Path-style URLs (http://host/bucket/key) rather than virtual-hosted (http://bucket.host/key).
    # Unset: path-style when endpoint_url is set (S3-compatible stores), virtual-hosted on AWS.
    path_style: bool | None = None
    # Hedged requests: when a PUT or GET has waited longer than this percentile of the recent
    # latencies of its kind (op and size class), a second attempt is sent and the first answer
    # wins. At most `hedge_max_share` of requests are hedged (0 turns hedging off), never sooner
    # than `hedge_min_delay_s`, and not until `HEDGE_MIN_SAMPLES` latencies of that kind are known.
    hedge_percentile: float = setting(95.0, ge=50.0, le=99.9)
    hedge_max_share: float = setting(0.05, ge=0.0, le=0.5)
    hedge_min_delay_s: float = setting(0.02, ge=0.0)


@dataclass(frozen=True)
class StorageConfig:
    """Where batches are stored: `s3`, or `file` (a local/NFS directory at `root_dir`)."""

    kind: Literal["s3", "file"] = "s3"
    root_dir: str | None = None


@dataclass(frozen=True)
class KafkaConfig:
    """The notification queue. `properties`: extra librdkafka settings `key=value` given to every
    Kafka client memq creates (publisher, consumers, admin, audit), e.g. SASL/SSL:
    `security.protocol=SASL_SSL`, `sasl.mechanism=SCRAM-SHA-512`, `sasl.username=...`,
    `sasl.password=...`, `ssl.ca.location=...` (hidden from repr)."""

    bootstrap_servers: str = "127.0.0.1:9092"
    request_timeout_ms: int = setting(30_000, ge=10, le=300_000)   # librdkafka's socket.timeout.ms range
    replication_factor: int = setting(1, ge=1)
    # Consumer group session. tansu lets a new member join only after about half of it, so
    # the default is far below Kafka's 45 s; the heartbeats run on librdkafka's own thread.
    session_timeout_ms: int = setting(6_000, ge=1, le=3_600_000)
    properties: tuple[str, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        self.librdkafka()

    def librdkafka(self) -> dict[str, str]:
        """`properties` as a dict; ConfigError naming a malformed one or one memq sets itself."""
        out: dict[str, str] = {}
        for i, line in enumerate(self.properties):
            key, sep, value = line.partition("=")
            key = key.strip()
            if not sep or not key:
                raise ConfigError(f"kafka.properties[{i}]: {line.split('=')[0]!r}... is not 'key=value'")
            if key in OWN_KAFKA_KEYS:
                raise ConfigError(f"kafka.properties[{i}]: set {key} with kafka.{OWN_KAFKA_KEYS[key]}")
            out[key] = value.strip()
        return out


OWN_KAFKA_KEYS = {"bootstrap.servers": "bootstrap_servers", "socket.timeout.ms": "request_timeout_ms"}


@dataclass(frozen=True)
class ZooKeeperConfig:
    """`enabled`: brokers register in ZooKeeper and follow the governor's assignments.
    `missing_broker_grace_s` (None: `session_timeout_s`): how long a governor on a new session
    waits for assigned brokers to re-register before moving their topics."""

    enabled: bool = False
    hosts: str = "127.0.0.1:2181"
    root: str = "/memq"
    session_timeout_s: float = setting(6.0, gt=0)
    connect_timeout_s: float = setting(10.0, gt=0)
    missing_broker_grace_s: float | None = setting(None, ge=0)


@dataclass(frozen=True)
class GovernorConfig:
    """Placement: a topic gets ceil(expected_mbps / topic_share_mbps) brokers (at least 2);
    at most `max_rebalance_moves` optional moves per `rebalance_interval_s`."""

    interval_s: float = setting(5.0, gt=0)
    reconcile_interval_s: float = setting(2.0, gt=0)
    topic_share_mbps: float = setting(25.0, gt=0)
    max_rebalance_moves: int = setting(2, ge=0)
    rebalance_interval_s: float = setting(10.0, gt=0)
    imbalance_threshold: float = setting(0.2, ge=0)
    drain_timeout_s: float = setting(30.0, ge=0)
    # The janitor (retention, orphan collection, compaction's release), run by the elected governor only.
    janitor_interval_s: float = setting(300.0, gt=0)
    retention_grace_s: float = setting(600.0, ge=0)   # an object outlives its notification this long
    orphan_grace_s: float = setting(600.0, gt=0)      # an unreferenced object is kept this long
    janitor_timeout_s: float = setting(300.0, gt=0)   # bound on one topic's pass
    # Compaction (memq.compaction), run by every broker over its share of the partitions: how often
    # it looks for partitions due, and the bytes each broker's compactor reads and writes per second,
    # so that produce and fetch never starve
    compaction_interval_s: float = setting(30.0, gt=0)
    compaction_mbps: float = setting(50.0, gt=0)


@dataclass(frozen=True)
class ClusterConfig:
    name: str = "dev"


SUBJECT_NAME_STRATEGIES = ("TopicNameStrategy", "RecordNameStrategy", "TopicRecordNameStrategy")

#: The offsets of a topic whose stored settings do not state them (a ZooKeeper topic written before
#: the setting existed): sparse, the offsets its records were read at, whatever a new topic's default.
UNSTATED_OFFSETS: Literal["sparse"] = "sparse"


@dataclass(frozen=True)
class TopicConfig:
    """A topic's settings. Batches seal at `batch_bytes`, `batch_messages` or `batch_ms` age.

    Retention: notifications older than `retention_ms` expire, and so do the oldest beyond
    `retention_bytes` of objects (None: no byte limit); objects follow `governor.retention_grace_s` later.

    The latency budget (off by default): a batch `batch_ms` old holding fewer than
    `min_batch_bytes` keeps filling until `max_batch_ms`, so a trickle topic writes fewer,
    larger objects (fewer PUTs and notifications) and pays for it in latency. A producer's
    flush still seals at once. Keep `max_batch_ms` under producers' request_timeout_ms.
    """

    name: str
    read_partitions: int = setting(3, ge=1)
    batch_bytes: int = setting(8 * MiB, ge=1)
    batch_messages: int = setting(1_000_000, ge=1)
    batch_ms: int = setting(250, ge=1)
    # latency budget: min_batch_bytes 0 = off; max_batch_ms None = batch_ms
    min_batch_bytes: int = setting(0, ge=0)
    max_batch_ms: int | None = setting(None, ge=1)
    ring_slots: int = setting(4, ge=2)     # one filling, one uploading
    max_message_bytes: int = setting(4 * MiB, ge=1)
    expected_mbps: float = setting(1.0, ge=0)
    notification_topic: str = ""
    # retention (the governor's janitor enforces it)
    retention_ms: int = setting(7 * 24 * 3_600_000, ge=1)
    retention_bytes: int | None = setting(None, ge=1)
    storage_group: str = DEFAULT_STORAGE_GROUP
    # the codec of the Kafka batches memq frames this topic's own records in for Kafka readers
    # (kafka_api.records); "auto" = broker.kafka_compression. Kafka producers' batches go as they came.
    kafka_compression: Literal["auto", "none", "gzip", "snappy", "lz4", "zstd"] = "auto"
    # compaction (memq.compaction, docs/guides/retention.md): "compact" keeps the latest record per key;
    # "compact,delete" also expires by retention_ms/bytes
    cleanup_policy: Literal["delete", "compact", "compact,delete"] = "delete"
    min_compaction_lag_ms: int = setting(0, ge=0)            # a record stays uncompacted at least this long
    max_compaction_lag_ms: int | None = setting(None, ge=1)  # ... and at most this long (None: no bound)
    delete_retention_ms: int = setting(86_400_000, ge=0)     # a tombstone stays readable this long past its timestamp
    min_cleanable_dirty_ratio: float = setting(0.5, ge=0)   # compact once this share of the log is dirty (<= 1)
    # produce-time schema checks (memq.schema.check, docs/guides/schemas.md): each record's key / value must
    # carry a schema id registered under the topic's subject and decode with that schema
    value_schema_validation: bool = False                   # confluent.value.schema.validation
    key_schema_validation: bool = False                     # confluent.key.schema.validation
    value_subject_name_strategy: str = "TopicNameStrategy"   # or RecordNameStrategy, TopicRecordNameStrategy
    key_subject_name_strategy: str = "TopicNameStrategy"
    schema_validation_action: Literal["reject", "warn", "dlq"] = "reject"   # memq.schema.validation.action
    # Kafka settings that have no effect on memq (segment.ms, min.insync.replicas, ...), kept as
    # (name, value) so Kafka's tools read back what they set (memq.kafka_api.topic_configs.INERT)
    kafka_inert: tuple[tuple[str, str], ...] = ()
    # Kafka offsets of its records (memq.log): "dense" (the default) numbers a partition's records
    # 0, 1, 2, ... (memq.kafka_api.dense); "sparse", notification offset << 24 | index
    # (memq.kafka_api.offsets), is what a topic stored before the setting existed reads as
    # (UNSTATED_OFFSETS). Fixed at creation: offsets once given stay.
    offsets: Literal["sparse", "dense"] = "dense"

    def __post_init__(self) -> None:
        check_choice(self, "kafka_compression", f"topic {self.name}")
        check_choice(self, "cleanup_policy", f"topic {self.name}")
        check_choice(self, "schema_validation_action", f"topic {self.name}")
        check_choice(self, "offsets", f"topic {self.name}")
        for strategy in ("value_subject_name_strategy", "key_subject_name_strategy"):
            if getattr(self, strategy) not in SUBJECT_NAME_STRATEGIES:
                raise ConfigError(f"topic {self.name}.{strategy} = {getattr(self, strategy)!r} is not one of "
                                  f"{', '.join(SUBJECT_NAME_STRATEGIES)}")
        if not self.name or not all(c.isalnum() or c in "._-" for c in self.name):
            raise ConfigError(f"topic name {self.name!r}: use letters, digits, '.', '_', '-'")
        if self.storage_group and not _KEY_SEGMENT.fullmatch(self.storage_group):
            raise ConfigError(f"topic {self.name}: storage_group {self.storage_group!r} is used in object keys: "
                              "use ASCII letters, digits, '.', '_', '-' (or \"\" for the topic's own objects)")
        if self.storage_group.startswith("compacted."):
            raise ConfigError(f"topic {self.name}: storage_group {self.storage_group!r}: names starting with "
                              "'compacted.' hold compacted topics' parts")
        if self.name.startswith(INTERNAL_PREFIX):
            raise ConfigError(f"topic name {self.name!r}: names starting with {INTERNAL_PREFIX!r} "
                              "are reserved for memq's internal topics")
        check_ranges(self, f"topic {self.name}")
        if self.max_message_bytes > self.batch_bytes:
            raise ConfigError(f"topic {self.name}: max_message_bytes must be <= batch_bytes")
        self._check_latency_budget()
        if self.min_cleanable_dirty_ratio > 1:
            raise ConfigError(f"topic {self.name}: min_cleanable_dirty_ratio {self.min_cleanable_dirty_ratio} must be "
                              "between 0 and 1 (a share of the log)")
        if self.max_compaction_lag_ms is not None and self.max_compaction_lag_ms < self.min_compaction_lag_ms:
            raise ConfigError(f"topic {self.name}: max_compaction_lag_ms {self.max_compaction_lag_ms} must be >= "
                              f"min_compaction_lag_ms {self.min_compaction_lag_ms}")

    def _check_latency_budget(self) -> None:
        where = f"topic {self.name}"
        if self.max_batch_ms is not None and self.max_batch_ms < self.batch_ms:
            raise ConfigError(f"{where}: max_batch_ms {self.max_batch_ms} must be >= batch_ms {self.batch_ms}")
        if self.min_batch_bytes > self.batch_bytes:
            raise ConfigError(f"{where}: min_batch_bytes {self.min_batch_bytes} must be <= batch_bytes "
                              f"{self.batch_bytes} (a batch seals at batch_bytes anyway)")
        if self.min_batch_bytes and self.hold_until_ms == self.batch_ms:
            raise ConfigError(f"{where}: min_batch_bytes {self.min_batch_bytes} needs max_batch_ms > batch_ms "
                              f"{self.batch_ms}: how long a small batch may keep filling")

    def check_byte_retention(self) -> None:
        """ConfigError if `retention_bytes` is set on a topic of a shared storage group: the janitor
        counts a topic's own objects, not its parts of shared objects, so the limit would do
        nothing. Checked where topics are created or altered (config file, `memq topic`), not on
        every read, so a topic stored before storage groups existed keeps being served."""
        if self.retention_bytes is not None and self.storage_group:
            raise ConfigError(
                f"topic {self.name}: retention_bytes counts a topic's own objects only, and in storage group "
                f"{self.storage_group!r} its data is in shared objects, which expire by retention_ms: set "
                f'storage_group = "" (objects of its own) or use retention_ms alone')

    def check_altered_from(self, current: TopicConfig) -> None:
        """ConfigError if altering `current` into these settings would leave a key's records in
        two read partitions: compaction works per partition and would keep a value in each.
        A compacted topic's partitions do not grow (Kafka allows it and warns: keys move), and a
        topic of several partitions, whose records memq spread without regard to keys, does not
        become compacted. Checked where topics are altered (`memq topic alter`, Kafka's calls)."""
        if current.compacted and self.read_partitions > current.read_partitions:
            raise ConfigError(f"topic {self.name} is compacted: its read_partitions do not grow ({current.read_partitions} "
                              f"-> {self.read_partitions}): records are placed by a hash of their key over the "
                              "partitions, so more partitions would move keys and compaction would keep two values "
                              "of a key; create a new topic with more partitions and copy the records into it")
        if self.compacted and not current.compacted and self.read_partitions > 1:
            raise ConfigError(f"topic {self.name}: cleanup_policy {self.cleanup_policy!r} on a topic of "
                              f"{self.read_partitions} read partitions written as {current.cleanup_policy!r}: its "
                              "records are spread over partitions without regard to keys, so compaction would keep "
                              "a value of a key per partition; create a new compacted topic and copy the records")

    def created(self, chosen: typing.Collection[str]) -> TopicConfig:
        """These settings as a new topic gets them, `chosen` naming the fields its creator set: a
        compacted topic whose storage group nobody chose keeps objects of its own. Compaction
        releases a topic's own plain objects; a shared group's expire only by the group's rule,
        so a compacted topic there would save no storage (Kafka Connect and Streams create their
        compacted topics with Kafka's settings alone)."""
        if self.compacted and self.storage_group and "storage_group" not in chosen:
            return dataclasses.replace(self, storage_group="")
        return self

    @property
    def compacted(self) -> bool:
        """Whether the topic keeps the latest record per key (records need keys)."""
        return self.cleanup_policy != "delete"

    @property
    def expires(self) -> bool:
        """Whether retention_ms/bytes expire the topic's records ("delete" in cleanup_policy)."""
        return "delete" in self.cleanup_policy

    @property
    def hold_until_ms(self) -> int:
        """The age at which a batch seals whatever its size: max_batch_ms, or batch_ms when unset."""
        return self.batch_ms if self.max_batch_ms is None else self.max_batch_ms

    def notification_topic_for(self, cluster: str) -> str:
        """The Kafka topic that carries this topic's notifications."""
        return self.notification_topic or f"memq.{cluster}.{self.name}"


def memq_topic_of(kafka_topic: str, cluster: str) -> str | None:
    """The user topic whose default notification topic is `kafka_topic`, or None for any other
    Kafka topic, including memq's internal ones such as `memq.<cluster>.__audit`."""
    prefix = f"memq.{cluster}."
    if not kafka_topic.startswith(prefix):
        return None
    name = kafka_topic[len(prefix):]
    return None if name.startswith(INTERNAL_PREFIX) else name


@dataclass(frozen=True)
class BrokerConfig:
    broker_id: str = "b1"
    host: str = "127.0.0.1"
    port: int = setting(0, ge=0, le=65_535)
    rack: str = ""
    capacity_mbps: float = setting(100.0, gt=0)
    advertised_url: str = ""
    max_frame_bytes: int = setting(16 * MiB, ge=1)   # larger WebSocket frames close the connection (1009)
    busy_wait_ms: int = setting(5_000, ge=0)          # wait for a free batch slot, then answer BUSY
    ack_write_timeout_ms: int = setting(10_000, ge=1)  # a client not reading its acks this long is closed
    max_pending_acks: int = setting(100_000, ge=1)    # per connection; more means a slow client: closed
    shutdown_timeout_ms: int = setting(30_000, ge=0)  # SIGTERM: time to flush, store and ack in-flight batches
    dedup_messages: int = setting(50_000, ge=1)      # per topic: stored Message ids remembered to drop resends
    dedup_window_ms: int = setting(300_000, ge=0)    # ... for at most this long (producers resend within delivery_timeout_ms)
    notify_retry_ms: int = setting(120_000, ge=0)    # a failed notification is published again this long (Messages held)
    # librdkafka producers publishing notifications, each Kafka topic always through the same one.
    # With 1000s of topics more producers cost less CPU (a producer's sender walks all its
    # partitions per wake-up) but open more connections; on the dev Kafka (tansu) 4 cut the
    # trickle bench's broker CPU 0.27 -> 0.16 and slowed its notifications (docs/DECISIONS.md)
    notify_producers: int = setting(1, ge=1, le=64)
    # Kafka wire-protocol listener (memq.kafka_api): -1 = off, 0 = any free port. Its largest
    # request is max_frame_bytes; it advertises kafka_advertised_host (default: host).
    kafka_port: int = setting(-1, ge=-1, le=65_535)
    kafka_advertised_host: str = ""
    # A Kafka connection quiet this long while its acks=all Messages wait is a producer waiting
    # on us (Kafka has no flush to say so): their topics' batches seal now if they hold at least
    # kafka_idle_seal_bytes, or whatever they hold once the connection sent that many bytes since
    # its last idle seal (a bulk producer's tail). So early objects are at most one per that many
    # bytes a connection sends, and a trickle still waits for batch_ms. 0 ms = off.
    kafka_idle_seal_ms: int = setting(20, ge=0)
    kafka_idle_seal_bytes: int = setting(1 * MiB, ge=1)
    # Parts kept in memory for Kafka readers (memq.broker.read_cache): what the broker just stored
    # and what readers asked for, least recently used out first. 0 = keep nothing (a GET per read).
    read_cache_bytes: int = setting(256 * MiB, ge=0)
    # The codec memq frames its own records in for Kafka readers, for topics that leave it "auto":
    # gzip, the one every Kafka client decodes without a plug-in (kafkajs: gzip alone), measured
    # in docs/DECISIONS.md ("Records for every reader").
    kafka_compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "gzip"
    # Transactions (memq.broker.txn): how often a broker finishes decided transactions and aborts
    # those past their transaction.timeout.ms, and the longest timeout a producer may ask
    # (Kafka's transaction.max.timeout.ms)
    txn_scan_ms: int = setting(1_000, ge=1)
    txn_max_timeout_ms: int = setting(900_000, ge=1)
    txn_id_expiration_ms: int = setting(604_800_000, ge=1)   # an id unused this long is forgotten (Kafka's too)

    def __post_init__(self) -> None:
        check_choice(self, "kafka_compression", "broker")


@dataclass(frozen=True)
class ShareConfig:
    """Share groups on the Kafka listener (memq.broker.share): KIP-932's group settings.
    `dead_letter_suffix`: rejected and over-limit records go to topic `<group><suffix>` when it
    exists ("" = none)."""

    record_lock_ms: int = setting(30_000, ge=1)          # group.share.record.lock.duration.ms
    delivery_count_limit: int = setting(5, ge=1)         # group.share.delivery.count.limit
    max_in_flight: int = setting(2_000, ge=1)            # records in flight per share-partition
    session_timeout_ms: int = setting(45_000, ge=1)      # a member silent this long is dropped
    heartbeat_interval_ms: int = setting(5_000, ge=1)
    flush_ms: int = setting(50, ge=0)                    # state changes are written together this often
    auto_offset_reset: Literal["earliest", "latest"] = "latest"   # share.auto.offset.reset
    dead_letter_suffix: str = "-dlq"


@dataclass(frozen=True)
class GroupConfig:
    """Kafka consumer groups coordinated by memq (memq.broker.group): KIP-848 consumer groups
    and classic ones, with Kafka's names for the same settings."""

    session_timeout_ms: int = setting(45_000, ge=1)          # group.consumer.session.timeout.ms
    heartbeat_interval_ms: int = setting(1_000, ge=1)        # group.consumer.heartbeat.interval.ms
    initial_rebalance_delay_ms: int = setting(300, ge=0)     # group.initial.rebalance.delay.ms (classic)
    tick_ms: int = setting(100, ge=1)                        # how often timeouts are checked
    # A member that does not speak again this long after the connection it spoke on closed (its
    # process killed) leaves then, not at the end of its session; static members keep their
    # session. Longer than the members' heartbeat interval; 0: sessions only.
    disconnect_grace_ms: int = setting(5_000, ge=0)
    # group.consumer.migration.policy: whether a group with members changes protocol as they do
    # (upgrade: a classic group to a consumer group when a consumer-protocol member joins;
    # downgrade: back when its last consumer-protocol member leaves); Kafka 4's default
    migration_policy: Literal["bidirectional", "upgrade", "downgrade", "disabled"] = "bidirectional"

    def __post_init__(self) -> None:
        check_choice(self, "migration_policy", "group")


@dataclass(frozen=True)
class ProducerConfig:
    """Client-side produce settings. `brokers`: comma-separated broker URLs (http://host:port)."""

    brokers: str = ""
    ack: Literal["0", "1", "all"] = "all"
    codec: Literal["none", "zstd", "gzip", "arrow"] = "zstd"   # arrow: Arrow columns, for topics read by Spark
    linger_ms: int = setting(5, ge=0)
    max_message_bytes: int = setting(1 * MiB, ge=1)
    max_in_flight_bytes: int = setting(64 * MiB, ge=1)
    max_block_ms: int = setting(60_000, ge=0)
    request_timeout_ms: int = setting(30_000, ge=1)
    retries: int = setting(5, ge=0)
    retry_backoff_ms: int = setting(100, ge=0)
    delivery_timeout_ms: int = setting(120_000, ge=1)  # from seal to acked or failed, retries included (Kafka's default)
    # Credentials for every client that talks to brokers (Producer, Consumer and Spark metadata,
    # CLI): a bearer token (`memq token create`), the CA that signed brokers' certificates
    # (https:// broker URLs), and optionally a client certificate whose CN is the principal.
    token: str = field(default="", repr=False)
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""

    def __post_init__(self) -> None:
        check_files(self, "producer", ("tls_ca_file", "tls_cert_file", "tls_key_file"))


@dataclass(frozen=True)
class ConsumerConfig:
    """`auto_offset_reset`: where a group starts without a committed offset, or when its
    position is outside the retained notifications (Kafka's OffsetOutOfRange): `earliest`,
    `latest`, or `error` (raise `OffsetOutOfRangeError`). `dedup`: drop retried Messages by
    (producer id, epoch, sequence), remembering the last `dedup_window` sequences (a bitmap:
    `dedup_window` / 8 bytes at most) of each of the `dedup_max_producers` most recent
    producer instances. `read_path`: where parts are read (`memq.client.read_path`): `auto`
    through a broker's read cache while a part is younger than `broker_read_max_age_ms`, from
    storage directly when older (catch-up); `broker` always through a broker; `s3` never. A
    broker read that does not answer within `broker_read_timeout_ms` goes to storage. `rack`:
    the consumer's rack, so it reads through a broker there when the metadata names racks."""

    group_id: str = "memq-consumer"
    auto_offset_reset: Literal["earliest", "latest", "error"] = "earliest"
    enable_auto_commit: bool = False
    auto_commit_interval_ms: int = setting(5_000, ge=1)
    prefetch_bytes: int = setting(64 * MiB, ge=1)
    fetch_concurrency: int = setting(8, ge=1)
    dedup: bool = True
    dedup_max_producers: int = setting(4_096, ge=1)
    dedup_window: int = setting(65_536, ge=64)
    on_data_loss: Literal["raise", "skip"] = "raise"
    read_path: Literal["auto", "broker", "s3"] = "auto"
    broker_read_max_age_ms: int = setting(30_000, ge=0)
    broker_read_timeout_ms: int = setting(2_000, ge=1)
    rack: str = ""

    def __post_init__(self) -> None:
        check_ranges(self, "consumer")
        check_choice(self, "read_path", "consumer")


@dataclass(frozen=True)
class AuditConfig:
    """End-to-end audit: clients emit records to the audit topic, the auditor balances the books.

    `enabled = false` means clients get no audit emitter at all (zero cost). `topic` defaults to
    `memq.<cluster>.__audit`. Times: a Message is lost when `grace_s` after its ack a group has
    consumed Messages sealed `partition_skew_s` later (the partitions one consumer reads
    interleave that much) but not it; matching state is kept `retention_s`; a backlog older than
    `warn_lag_s` is LAG, older than `stall_s` STALLED, and with no consumption for `stall_s` STOPPED.
    """

    enabled: bool = True
    topic: str = ""
    partitions: int = setting(1, ge=1)
    buffer_records: int = setting(100_000, ge=1)
    flush_ms: int = setting(200, ge=1)
    grace_s: float = setting(60.0, gt=0)
    retention_s: float = setting(900.0, gt=0)
    warn_lag_s: float = setting(30.0, gt=0)
    stall_s: float = setting(60.0, gt=0)
    partition_skew_s: float = setting(5.0, ge=0)
    db_path: str = "memq-audit.db"
    http_host: str = "127.0.0.1"
    http_port: int = setting(8090, ge=0, le=65_535)

    def __post_init__(self) -> None:
        check_ranges(self, "audit")
        if self.retention_s < self.grace_s:
            raise ConfigError("audit.retention_s must be >= audit.grace_s")

    def topic_for(self, cluster: str) -> str:
        """The Kafka topic that carries this cluster's audit records."""
        return self.topic or f"memq.{cluster}.__audit"


@dataclass(frozen=True)
class CostConfig:
    """The price table and workload model of `memq cost`, in USD (see docs/ARCHITECTURE.md, Cost).

    Defaults are public AWS list prices (us-east-1): S3 Standard requests and storage for memq;
    for the Kafka it is compared with, EBS gp3 storage and inter-AZ transfer ($0.01 per GB
    charged on each side of a crossing). A GB is 2^30 bytes, a month 730 hours. Put your own
    (negotiated, another region or store) in a `[cost]` section.
    """

    s3_put_per_1000: float = setting(0.005, ge=0)       # PUT, COPY, POST
    s3_list_per_1000: float = setting(0.005, ge=0)
    s3_get_per_1000: float = setting(0.0004, ge=0)
    s3_delete_per_1000: float = setting(0.0, ge=0)      # DELETE is free on S3
    s3_gb_month: float = setting(0.023, ge=0)
    ebs_gb_month: float = setting(0.08, ge=0)           # gp3
    cross_az_gb: float = setting(0.01, ge=0)            # per GB, charged out and again in
    kafka_replicas: int = setting(3, ge=1)              # one per zone (rack-aware placement)
    kafka_disk_utilization: float = setting(1.0, ge=0.01, le=1)   # < 1 adds free-space headroom
    cross_az_fraction: float = setting(2 / 3, ge=0, le=1)     # clients whose broker is in another zone
    consumer_groups: int = setting(1, ge=0)             # groups reading every byte once
    # how they read: "broker" through the brokers' read cache (memq's Consumer at the tail, Kafka
    # readers: their GETs are the brokers' cache misses, counted on the brokers), "s3" one GET per
    # object per group (Spark, catch-up, consumer.read_path = "s3")
    consumer_read_path: Literal["broker", "s3"] = "broker"


@dataclass(frozen=True)
class SecurityConfig:
    """The broker's side of security; off by default (behaviour as without it).

    TLS is on when `tls_cert_file` is set; with `tls_client_ca_file` a client certificate it
    signed is accepted as the principal named by its subject CN. `enabled`: every request
    needs a principal (a token listed in `tokens` as `PRINCIPAL:SHA256HEX`, or a client
    certificate) and, per topic, an allow rule in `acls` (see memq.security.acl).
    """

    enabled: bool = False
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    tokens: tuple[str, ...] = ()
    acls: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_files(self, "security", ("tls_cert_file", "tls_key_file", "tls_client_ca_file"))
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigError("security.tls_cert_file and security.tls_key_file must be set together")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ConfigError("security.tls_client_ca_file needs TLS: set security.tls_cert_file and tls_key_file")
        parse_entries(self.tokens)
        parse_rules(self.acls)


@dataclass(frozen=True)
class QuotaConfig:
    """Produce byte-rate quotas, enforced by each broker on its own traffic by delaying, never
    failing, requests (memq.security.quota). Rates are bytes/s of Messages as sent (after the
    producer's compression); 0 = no quota. `principal_byte_rate` applies to each principal
    (all its topics; "anonymous" with security off), `topic_byte_rate` to each topic (all its
    principals); `principals` / `topics` override them, one `NAME=BYTES_PER_S` each (`=0`:
    exempt). A client may run `burst_s` of its rate ahead; a connection over its quota is not
    read for up to `max_throttle_ms` at a time: keep it under producers' request_timeout_ms, and
    their max_message_bytes under rate x max_throttle_ms, or larger Messages overrun the quota.
    """

    principal_byte_rate: float = setting(0.0, ge=0)
    topic_byte_rate: float = setting(0.0, ge=0)
    principals: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()
    burst_s: float = setting(1.0, ge=0.01, le=60)
    max_throttle_ms: int = setting(10_000, ge=1, le=30_000)   # beyond, an unread WebSocket misses its heartbeat

    def __post_init__(self) -> None:
        check_ranges(self, "quota")
        self.table()

    def table(self) -> QuotaTable:
        """The rates in force (ConfigError naming the override that is malformed)."""
        return QuotaTable(self.principal_byte_rate, self.topic_byte_rate,
                          parse_overrides(self.principals, "quota.principals"),
                          parse_overrides(self.topics, "quota.topics"))


@dataclass(frozen=True)
class MemqConfig:
    """Everything a memq process needs; `topics` are the statically configured topics."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    s3: S3Config = field(default_factory=S3Config)
    storage: StorageConfig = field(default_factory=StorageConfig)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    zookeeper: ZooKeeperConfig = field(default_factory=ZooKeeperConfig)
    governor: GovernorConfig = field(default_factory=GovernorConfig)
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    share: ShareConfig = field(default_factory=ShareConfig)
    group: GroupConfig = field(default_factory=GroupConfig)
    producer: ProducerConfig = field(default_factory=ProducerConfig)
    consumer: ConsumerConfig = field(default_factory=ConsumerConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    quota: QuotaConfig = field(default_factory=QuotaConfig)
    topics: tuple[TopicConfig, ...] = ()

    def topic(self, name: str) -> TopicConfig:
        for t in self.topics:
            if t.name == name:
                return t
        raise ConfigError(f"topic {name!r} is not configured")


# --- loading ---------------------------------------------------------------------------------


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Turn a TOML or environment value into the field's type, or raise naming `where`."""
    origin = typing.get_origin(tp)
    if origin is tuple:   # tuple[str, ...]: a TOML array, or a comma-separated environment value
        items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)):
            raise ConfigError(f"{where}: {value!r} is not a list")
        return tuple(_coerce(v, typing.get_args(tp)[0], f"{where}[{i}]") for i, v in enumerate(items))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value == "" and type(None) in typing.get_args(tp)):
            return None
        return _coerce(value, args[0], where)
    if origin is Literal:
        allowed = typing.get_args(tp)
        sval = str(value).lower() if not isinstance(value, bool) else str(value)
        for a in allowed:
            if str(a) == sval:
                return a
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(str, allowed))}")
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if tp is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(value)
            return int(value)
        if tp is float:
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        if tp is str:
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError(value)
            return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {value!r} is not a valid {tp.__name__}") from None
    raise ConfigError(f"{where}: unsupported setting type {tp!r}")


def build(cls: type, values: Mapping[str, Any], where: str) -> Any:
    """Build dataclass `cls` from a mapping, rejecting unknown keys and bad or out-of-range values."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) "
                          + ", ".join(k + _did_you_mean(k, names) for k in unknown))
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in values.items()}
    try:
        obj = cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None
    check_ranges(obj, where)
    return obj


def _did_you_mean(name: str, valid: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


ENV_PREFIX = "MEMQ_"
CONFIG_FILE_VAR = "MEMQ_CONFIG"    # read by the `memq` command (--config), not by load_config


def env_var(section: str, name: str) -> str:
    """The environment variable of setting `[section] name`."""
    return f"{ENV_PREFIX}{section}_{name}".upper()


_SECTIONS: dict[str, type] = {name: tp for name, tp in typing.get_type_hints(MemqConfig).items()
                              if name != "topics"}


def load_config(path: str | os.PathLike[str] | None = None,
                env: Mapping[str, str] | None = None) -> MemqConfig:
    """Load a config from an optional TOML file, then `MEMQ_SECTION_FIELD` variables.

    Topics come from `[[topics]]` tables in the file. A missing or unreadable file, an
    unknown section or key, or a bad value raises `ConfigError` naming it.
    """
    env = _settings_env(os.environ if env is None else env)
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            raw = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {p} does not exist") from None
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"config file {p}: {e}") from None
    unknown = sorted(set(raw) - set(_SECTIONS) - {"topics"})
    if unknown:
        raise ConfigError("config: unknown section(s) "
                          + ", ".join(k + _did_you_mean(k, [*_SECTIONS, "topics"]) for k in unknown))
    sections: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        values = dict(raw.get(name, {}))
        if not isinstance(raw.get(name, {}), dict):
            raise ConfigError(f"config: [{name}] must be a table")
        for fld in dataclasses.fields(cls):
            var = env_var(name, fld.name)
            if var in env:
                values[fld.name] = env[var]
        sections[name] = build(cls, values, name)
    topics_raw = raw.get("topics", [])
    if not isinstance(topics_raw, list):
        raise ConfigError("config: topics must be an array of tables ([[topics]])")
    topics = []
    for i, t in enumerate(topics_raw):
        if not isinstance(t, dict) or "name" not in t:
            raise ConfigError(f"config: topics[{i}] needs a name")
        topic = build(TopicConfig, t, f"topics[{i}]")
        topic.check_byte_retention()
        topics.append(topic)
    return MemqConfig(**sections, topics=tuple(topics))


#: Variables Kubernetes injects for every Service in a pod's namespace: for a Service `memq`,
#: MEMQ_SERVICE_HOST, MEMQ_SERVICE_PORT[_NAME], MEMQ_PORT and MEMQ_PORT_8080_TCP[_ADDR|_PORT|_PROTO].
_SERVICE_LINK = re.compile(r"(?:\w+_)?(?:SERVICE_HOST|SERVICE_PORT(?:_\w+)?"
                           r"|PORT_\d+_(?:TCP|UDP|SCTP)(?:_(?:ADDR|PORT|PROTO))?)")
#: A link's bare `NAME_PORT` counts only with a link's value (tcp://10.0.0.7:8080): MEMQ_BROKER_PORT
#: from a Service `memq-broker` is such a link, never broker.port; MEMQ_BROKER_HTTP_PORT=8081 is a typo.
_SERVICE_LINK_PORT = re.compile(r"(?:\w+_)?PORT")
_SERVICE_LINK_URL = re.compile(r"(?:tcp|udp|sctp)://[^/\s]+:\d+")
#: How close a name that does not start with a section must be to a setting to count as its typo.
_TYPO_CUTOFF = 0.9


def _is_service_link(var: str, value: str) -> bool:
    name = var[len(ENV_PREFIX):]
    return bool(_SERVICE_LINK.fullmatch(name)
                or _SERVICE_LINK_PORT.fullmatch(name) and _SERVICE_LINK_URL.fullmatch(value))


def _settings_env(env: Mapping[str, str]) -> dict[str, str]:
    """The MEMQ_* variables of `env` that configure memq; other MEMQ_* names are ignored.

    A process shares its environment with things that are not memq's settings: Kubernetes
    injects service links (MEMQ_PORT, MEMQ_BROKER_SERVICE_HOST, ... for Services named memq*)
    and a shell may hold MEMQ_SRC or MEMQ_HOME. Such names are logged at debug and ignored.
    A name that starts with a section (MEMQ_PRODUCER_LINGERMS), or nearly spells a setting,
    is a typo that would silently do nothing: it fails, naming the closest valid variable.
    """
    valid = {env_var(name, f.name) for name, cls in _SECTIONS.items() for f in dataclasses.fields(cls)}
    sections = tuple(f"{ENV_PREFIX}{name.upper()}_" for name in _SECTIONS)
    settings: dict[str, str] = {}
    typos: list[str] = []
    for var, value in env.items():
        if not var.startswith(ENV_PREFIX) or var == CONFIG_FILE_VAR:
            continue
        if _is_service_link(var, value):
            _log.debug("ignoring %s: a Kubernetes service link, not a memq setting", var)
        elif var in valid:
            settings[var] = value
        elif var.startswith(sections) or difflib.get_close_matches(var, valid, n=1, cutoff=_TYPO_CUTOFF):
            typos.append(var)
        else:
            _log.debug("ignoring %s: names no config section, so it is not a memq setting", var)
    if typos:
        raise ConfigError("unknown environment variable(s) "
                          + ", ".join(v + _did_you_mean(v, valid) for v in sorted(typos)))
    return settings
