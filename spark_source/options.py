"""Options of the "memq" DataSource: parsed and validated once, on the driver.

Names follow Spark's Kafka source where the meaning carries over (`startingOffsets`,
`endingOffsets`, `startingTimestamp`, `endingTimestamp`, `maxOffsetsPerTrigger`,
`minPartitions`, `failOnDataLoss`, `kafka.bootstrap.servers`). A bad option raises
`ConfigError` naming it, before any task runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Literal, Mapping

from memq.config import ClusterConfig, KafkaConfig, MemqConfig, S3Config, StorageConfig, TopicConfig, load_config
from memq.client.cluster import ResolvedTopic, broker_urls, resolve_topic
from memq.errors import BrokerUnavailableError, ConfigError
from spark_source.registry import read_schema
from spark_source.typed_values import ReadSchema

EARLIEST = -2  # Kafka's sentinels inside JSON offsets
LATEST = -1

# option name (lower case, as Spark hands them over) -> what it sets
_CONNECTION = {
    "memq.config": "a memq TOML config file (default: $MEMQ_CONFIG, as for the CLI)",
    "memq.broker": "a memq broker URL; Kafka, storage and cluster come from its /v1/metadata",
    "kafka.bootstrap.servers": "Kafka bootstrap servers",
    "kafka.request.timeout.ms": "timeout of each Kafka call",
    "cluster": "memq cluster name",
    "notificationtopic": "Kafka topic carrying the notifications",
    "storage.kind": "s3 or file",
    "storage.rootdir": "root directory of the file storage",
    "s3.endpoint": "S3 endpoint URL",
    "s3.bucket": "S3 bucket",
    "s3.region": "S3 region",
    "s3.accesskeyid": "S3 access key id",
    "s3.secretaccesskey": "S3 secret access key",
    "s3.connecttimeoutms": "S3 connect timeout",
    "s3.readtimeoutms": "S3 read timeout",
    "s3.maxattempts": "S3 attempts per request",
    "zookeeper.hosts": "ZooKeeper hosts (host:port,...): where a compacted topic's prefixes are named",
    "schema.registry.url": "memq broker URL(s) whose registry a typed read asks (default: memq.broker, producer.brokers)",
}
_READ = {"topic", "mode", "startingoffsets", "endingoffsets", "startingtimestamp", "endingtimestamp",
         "maxoffsetspertrigger", "minpartitions", "failondataloss", "fetchconcurrency",
         "s3list.slackms", "pushfilters", "dropduplicates", "valueformat", "valuesubject", "onerror"}
ON_ERROR = ("fail", "null", "skip")
KNOWN_OPTIONS = frozenset(_CONNECTION) | _READ


@dataclass(frozen=True)
class OffsetSpec:
    """`earliest`, `latest`, or explicit next offsets per read partition (-2/-1 = earliest/latest)."""

    kind: Literal["earliest", "latest", "json"]
    per_partition: tuple[tuple[int, int], ...] = ()

    def resolve(self, partition: int, low: int, high: int, *, default: int) -> int:
        """The offset this spec means for `partition` (log spans [low, high)); `default` if unnamed."""
        if self.kind == "earliest":
            return low
        if self.kind == "latest":
            return high
        value = dict(self.per_partition).get(partition, default)
        return low if value == EARLIEST else high if value == LATEST else value


@dataclass(frozen=True)
class SourceOptions:
    """Everything the reader needs; picklable, so it travels to the executors."""

    topic: str
    notification_topic: str
    config: MemqConfig
    mode: Literal["notifications", "s3list"] = "notifications"
    starting: OffsetSpec | None = None      # None = the mode's default (earliest batch, latest stream)
    ending: OffsetSpec = OffsetSpec("latest")
    starting_timestamp_ms: int | None = None
    ending_timestamp_ms: int | None = None
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    fetch_concurrency: int = 4
    s3list_slack_ms: int = 60_000
    push_filters: bool = True
    drop_duplicates: bool = True
    columns: tuple[str, ...] = ()           # the read schema's columns (a user-given schema); () = all
    compacted: bool | None = None           # the topic's cleanup_policy compacts (None: unknown, no metadata)
    dense: bool = False                     # the topic's offsets are record numbers (TopicConfig.offsets)
    brokers: tuple[str, ...] = ()           # broker URLs the driver asks where a dense topic's offsets stand
    typed: ReadSchema | None = None         # valueFormat=registry: values decoded into the merged schema
    on_error: Literal["fail", "null", "skip"] = "fail"   # a value that does not decode (typed reads)


def _int(options: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(f"option {name}: {raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"option {name}: {value} must be >= {minimum}")
    return value


def _or(value: int | None, default: int) -> int:
    """`value`, or `default` if the option was not given (0 is a value)."""
    return default if value is None else value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    s = str(raw).strip().lower()
    if s not in ("true", "false"):
        raise ConfigError(f"option {name}: {raw!r} must be true or false")
    return s == "true"


def parse_offsets(name: str, raw: str | None, topic: str, *, allow_earliest: bool = True) -> OffsetSpec | None:
    """Parse `earliest`, `latest`, `{"<topic>": {"0": 12}}` (Kafka's form) or `{"0": 12}`."""
    if raw is None:
        return None
    text = str(raw).strip()
    if text.lower() in ("earliest", "latest"):
        if text.lower() == "earliest" and not allow_earliest:
            raise ConfigError(f"option {name}: 'earliest' is not allowed here")
        return OffsetSpec(text.lower())  # type: ignore[arg-type]
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        raise ConfigError(f"option {name}: {raw!r} is not earliest, latest or JSON offsets") from None
    if isinstance(doc, dict) and len(doc) == 1 and isinstance(next(iter(doc.values())), dict):
        (named, doc), = doc.items()
        if named != topic:
            raise ConfigError(f"option {name}: names topic {named!r}, but the topic is {topic!r}")
    if not isinstance(doc, dict) or not doc:
        raise ConfigError(f'option {name}: JSON offsets must look like {{"0": 12, "1": -2}}')
    pairs = []
    for p, off in doc.items():
        try:
            part, value = int(p), off
        except ValueError:
            raise ConfigError(f"option {name}: partition {p!r} is not an integer") from None
        if not isinstance(value, int) or isinstance(value, bool) or value < EARLIEST:
            raise ConfigError(f"option {name}: offset {value!r} of partition {part} is not an offset, -1 or -2")
        if value == EARLIEST and not allow_earliest:
            raise ConfigError(f"option {name}: -2 (earliest) is not allowed here")
        pairs.append((part, value))
    return OffsetSpec("json", tuple(sorted(pairs)))


def _connection(options: Mapping[str, str], topic: str) -> tuple[MemqConfig, str, str, bool | None, ResolvedTopic]:
    """The MemqConfig, notification topic, storage group ("" when not shared or not known
    from brokers), whether the topic is compacted (None: not known) and the topic as resolved, by memq's one
    precedence rule (`memq.client.cluster`): these options > the broker's metadata > the config file (`memq.config`, else $MEMQ_CONFIG like the CLI's `--config`)."""
    path = options.get("memq.config") or os.environ.get("MEMQ_CONFIG")
    config = load_config(path, env={}) if path else MemqConfig()
    broker = options.get("memq.broker")
    try:
        resolved = resolve_topic(config, topic, brokers=str(broker) if broker else None,
                                 timeout_s=config.kafka.request_timeout_ms / 1000)
    except BrokerUnavailableError as e:
        raise ConfigError(f"option memq.broker: {e}") from None
    config = resolved.config
    kafka = dataclasses.asdict(config.kafka)
    s3 = dataclasses.asdict(config.s3)
    storage = dataclasses.asdict(config.storage)
    simple = {"kafka.bootstrap.servers": (kafka, "bootstrap_servers"), "storage.kind": (storage, "kind"),
              "storage.rootdir": (storage, "root_dir"), "s3.endpoint": (s3, "endpoint_url"),
              "s3.bucket": (s3, "bucket"), "s3.region": (s3, "region"),
              "s3.accesskeyid": (s3, "access_key_id"), "s3.secretaccesskey": (s3, "secret_access_key")}
    for opt, (section, field) in simple.items():
        if options.get(opt):
            section[field] = str(options[opt])
    for opt, (section, field) in {"kafka.request.timeout.ms": (kafka, "request_timeout_ms"),
                                  "s3.maxattempts": (s3, "max_attempts")}.items():
        value = _int(options, opt, minimum=1)
        if value is not None:
            section[field] = value
    for opt, field in (("s3.connectTimeoutMs", "connect_timeout_s"), ("s3.readTimeoutMs", "read_timeout_s")):
        value = _int(options, opt, minimum=1)
        if value is not None:
            s3[field] = value / 1000
    if storage["kind"] not in ("s3", "file"):
        raise ConfigError(f"option storage.kind: {storage['kind']!r} is not s3 or file")
    cluster = str(options.get("cluster") or config.cluster.name)
    notification_topic = str(options.get("notificationtopic") or "") or (
        TopicConfig(name=topic).notification_topic_for(cluster) if resolved.source == "default"
        else resolved.topic.notification_topic)
    zookeeper = config.zookeeper
    if options.get("zookeeper.hosts"):
        zookeeper = dataclasses.replace(zookeeper, enabled=True, hosts=str(options["zookeeper.hosts"]))
    config = dataclasses.replace(config, kafka=KafkaConfig(**kafka), s3=S3Config(**s3),
                                 storage=StorageConfig(**storage), cluster=ClusterConfig(name=cluster),
                                 zookeeper=zookeeper)
    if config.storage.kind == "s3":
        _require_credentials(config.s3)
    compacted = None if resolved.source == "default" else "compact" in resolved.topic.cleanup_policy
    return (config, notification_topic, resolved.topic.storage_group if resolved.source == "metadata" else "",
            compacted, resolved)


def _require_credentials(s3: S3Config) -> None:
    """Fail on the driver, naming every way to give them, when no S3 credentials are found:
    broker metadata never carries them, and executors would only fail much later."""
    if s3.access_key_id and s3.secret_access_key:
        return
    from memq.storage.s3_store import s3_session

    if s3_session(s3).get_credentials() is None:
        raise ConfigError("memq source: no S3 credentials (broker metadata carries none): set option "
                          "memq.config to a memq config file with [s3] access_key_id/secret_access_key "
                          "(memq dev writes one: .memq-run/dev/memq.toml) or [s3] profile, or options s3.accessKeyId and "
                          "s3.secretAccessKey, or the AWS chain (AWS_ACCESS_KEY_ID, AWS_PROFILE)")


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate Spark's (case-insensitive) options into `SourceOptions`."""
    opts = {str(k).lower(): v for k, v in options.items()}
    unknown = sorted(set(opts) - KNOWN_OPTIONS - {"path"})
    if unknown:
        raise ConfigError(f"memq source: unknown option(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(KNOWN_OPTIONS))}")
    topic = str(opts.get("topic") or opts.get("path") or "")
    if not topic:
        raise ConfigError("memq source: option topic is required")
    TopicConfig(name=topic)  # validates the name
    mode = str(opts.get("mode", "notifications")).lower()
    if mode not in ("notifications", "s3list"):
        raise ConfigError(f"option mode: {mode!r} is not notifications or s3list")
    config, notification_topic, group, compacted, resolved = _connection(opts, topic)
    if mode == "s3list" and group:
        raise ConfigError(f"option mode=s3list: topic {topic} is stored in storage group {group!r}, whose "
                          f"objects hold parts of several topics that only its notifications tell apart; "
                          f"use mode=notifications, or give the topic a group of its own (storage_group = \"\")")
    if compacted and mode == "s3list":
        raise ConfigError(f"option mode=s3list: topic {topic} is compacted: its objects hold every update, and "
                          f"compaction releases them; use mode=notifications")
    if compacted and not config.zookeeper.enabled:
        raise ConfigError(f"memq source: topic {topic} is compacted, and ZooKeeper names its compacted prefixes: "
                          f"set option zookeeper.hosts, or memq.config to a config with [zookeeper]")
    value_format = str(opts.get("valueformat", "bytes")).lower()
    if value_format not in ("bytes", "registry"):
        raise ConfigError(f"option valueFormat: {value_format!r} is not bytes or registry")
    on_error = str(opts.get("onerror", "fail")).lower()
    if on_error not in ON_ERROR:
        raise ConfigError(f"option onError: {on_error!r} is not {', '.join(ON_ERROR)}")
    registry = str(opts.get("schema.registry.url") or opts.get("memq.broker") or "")
    typed = read_schema(config, registry, str(opts.get("valuesubject") or f"{topic}-value")) \
        if value_format == "registry" else None
    start_ts = _int(opts, "startingTimestamp", minimum=0)
    end_ts = _int(opts, "endingTimestamp", minimum=0)
    if start_ts is not None and end_ts is not None and end_ts < start_ts:
        raise ConfigError(f"option endingTimestamp: {end_ts} is before startingTimestamp {start_ts}")
    return SourceOptions(
        topic=topic,
        notification_topic=notification_topic,
        config=config,
        mode=mode,  # type: ignore[arg-type]
        starting=parse_offsets("startingOffsets", opts.get("startingoffsets"), topic),
        ending=parse_offsets("endingOffsets", opts.get("endingoffsets"), topic, allow_earliest=False)
        or OffsetSpec("latest"),
        starting_timestamp_ms=start_ts,
        ending_timestamp_ms=end_ts,
        max_offsets_per_trigger=_int(opts, "maxOffsetsPerTrigger", minimum=1),
        min_partitions=_int(opts, "minPartitions", minimum=1),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        fetch_concurrency=_or(_int(opts, "fetchConcurrency", minimum=1), 4),
        s3list_slack_ms=_or(_int(opts, "s3list.slackMs", minimum=0), 60_000),
        push_filters=_bool(opts, "pushFilters", True),
        drop_duplicates=_bool(opts, "dropDuplicates", True),
        compacted=compacted,
        dense=resolved.topic.offsets == "dense",
        brokers=tuple(b.url for b in resolved.brokers if b.url) or tuple(broker_urls(str(opts.get("memq.broker") or "")))
        or tuple(broker_urls(config.producer.brokers)),
        typed=typed,
        on_error=on_error,  # type: ignore[arg-type]
    )
