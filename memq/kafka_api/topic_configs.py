"""memq's topic settings under Kafka's config names, both ways (pure: no I/O).

Kafka's admin tools read and change a topic's settings as named strings (DescribeConfigs,
AlterConfigs, IncrementalAlterConfigs, CreateTopics' configs). Every `TopicConfig` field is one
setting here: under Kafka's name where Kafka has one with the same meaning (`retention.ms`,
`retention.bytes` (-1 = no limit), `max.message.bytes`), under `memq.<field with dots>`
otherwise (`memq.batch.bytes`, `memq.storage.group`, ...). Compaction's settings keep Kafka's
names: `cleanup.policy` (a list: `delete`, `compact` or both, in any order; APPEND and
SUBTRACT change it as in Kafka), `min.compaction.lag.ms`, `max.compaction.lag.ms` (Kafka's
Long.MAX_VALUE = no bound), `delete.retention.ms`, `min.cleanable.dirty.ratio`. One Kafka setting
has one value memq serves: `message.timestamp.type` (`CreateTime`, read-only). `memq.read.partitions`
(grown by CreatePartitions) and `memq.notification.topic` are read-only, as in `memq topic alter`.

Kafka defines settings that mean nothing on memq (`segment.*`, `flush.*`, `min.insync.replicas`,
...: `INERT`). Tools and applications pass them when they create topics (Kafka Streams and Quix
set `segment.ms` on changelogs), so they are accepted with a value of their type, stored
(`TopicConfig.kafka_inert`) and described back, Kafka's default when unset, each with a
documentation line saying why it has no effect.

As Kafka reports them: a setting whose value differs from memq's default is
DYNAMIC_TOPIC_CONFIG, any other DEFAULT_CONFIG; only the read-only ones say read_only. Setting
a read-only one to the value it has is accepted (a tool writing back what it read), any other
value, a setting memq does not have, or an APPEND/SUBTRACT to a setting that is not a list is a
ConfigError naming it: never a silent no-op. The result of any change is built and checked as the config file and `memq topic
alter` check it (`altered`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from memq.config import TopicConfig, build
from memq.errors import ConfigError


class ConfigSource(IntEnum):
    """Kafka's DescribeConfigs config_source."""

    DYNAMIC_TOPIC_CONFIG = 1
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


class ConfigType(IntEnum):
    """Kafka's DescribeConfigs config_type (v3+)."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    LONG = 5
    DOUBLE = 6
    LIST = 7


class AlterOp(IntEnum):
    """IncrementalAlterConfigs' config_operation."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


@dataclass(frozen=True)
class Setting:
    """One topic setting: its Kafka name and the `TopicConfig` field behind it ("" = none: `FIXED`)."""

    name: str
    field: str
    type: ConfigType
    doc: str
    read_only: bool = False
    at_creation: bool = False   # set when the topic is created, kept after (`memq.governor.topics.FIXED_FIELDS`):
                                # AlterConfigs' replacement and a DELETE leave it, as they leave read-only ones

    @property
    def resettable(self) -> bool:
        """Whether AlterConfigs' replacement and IncrementalAlterConfigs' DELETE return it to memq's default."""
        return bool(self.field) and not self.read_only and not self.at_creation


@dataclass(frozen=True)
class ConfigEntry:
    """One setting as DescribeConfigs reports it."""

    name: str
    value: str | None
    source: ConfigSource
    read_only: bool
    type: ConfigType
    doc: str

    @property
    def is_default(self) -> bool:
        return self.source is ConfigSource.DEFAULT_CONFIG


#: Kafka's `max.compaction.lag.ms` default, Long.MAX_VALUE: no bound (memq's None).
NO_LAG_BOUND = (1 << 63) - 1
#: Kafka's cleanup policies, in memq's spelling of each combination.
POLICIES: Mapping[frozenset[str], str] = {frozenset({"delete"}): "delete", frozenset({"compact"}): "compact",
                                         frozenset({"compact", "delete"}): "compact,delete"}

#: How Confluent's settings name a subject name strategy (memq keeps the class's short name).
STRATEGY_PACKAGE = "io.confluent.kafka.serializers.subject."

SETTINGS: tuple[Setting, ...] = (
    Setting("cleanup.policy", "cleanup_policy", ConfigType.LIST,
            "delete (retention.ms/bytes), compact (the latest record per key) or both"),
    Setting("confluent.key.schema.validation", "key_schema_validation", ConfigType.BOOLEAN,
            "each record's key must carry a schema id registered under the topic's key subject and decode with it"),
    Setting("confluent.key.subject.name.strategy", "key_subject_name_strategy", ConfigType.STRING,
            "the key subject: TopicNameStrategy (<topic>-key), RecordNameStrategy, TopicRecordNameStrategy"),
    Setting("confluent.value.schema.validation", "value_schema_validation", ConfigType.BOOLEAN,
            "each record's value must carry a schema id registered under the topic's value subject and decode "
            "with it"),
    Setting("confluent.value.subject.name.strategy", "value_subject_name_strategy", ConfigType.STRING,
            "the value subject: TopicNameStrategy (<topic>-value), RecordNameStrategy, TopicRecordNameStrategy"),
    Setting("delete.retention.ms", "delete_retention_ms", ConfigType.LONG,
            "a compacted topic keeps a tombstone (null value) this long past its timestamp"),
    Setting("max.message.bytes", "max_message_bytes", ConfigType.INT,
            "largest Message (a producer's request for one partition) the broker takes"),
    Setting("max.compaction.lag.ms", "max_compaction_lag_ms", ConfigType.LONG,
            f"a record stays uncompacted at most this long ({NO_LAG_BOUND}: no bound)"),
    Setting("message.timestamp.type", "", ConfigType.STRING,
            "CreateTime: records keep their producers' timestamps", read_only=True),
    Setting("min.cleanable.dirty.ratio", "min_cleanable_dirty_ratio", ConfigType.DOUBLE,
            "a partition is compacted once this share of its log is not compacted yet"),
    Setting("min.compaction.lag.ms", "min_compaction_lag_ms", ConfigType.LONG,
            "a record stays uncompacted at least this long"),
    Setting("retention.bytes", "retention_bytes", ConfigType.LONG,
            "oldest objects beyond this many bytes expire (-1: no limit; topics with objects of their own)"),
    Setting("retention.ms", "retention_ms", ConfigType.LONG,
            "notifications expire after this long, their objects a grace period later"),
    Setting("memq.batch.bytes", "batch_bytes", ConfigType.INT, "a batch seals at this size"),
    Setting("memq.batch.messages", "batch_messages", ConfigType.INT, "a batch seals at this many Messages"),
    Setting("memq.batch.ms", "batch_ms", ConfigType.INT, "a batch seals at this age"),
    Setting("memq.expected.mbps", "expected_mbps", ConfigType.DOUBLE,
            "expected traffic (MB/s): the governor places the topic on enough brokers for it"),
    Setting("memq.kafka.compression", "kafka_compression", ConfigType.STRING,
            "codec of the Kafka batches memq frames its own records in for Kafka readers (auto: the broker's)"),
    Setting("memq.max.batch.ms", "max_batch_ms", ConfigType.INT,
            "latency budget: a small batch may keep filling until this age (null: memq.batch.ms)"),
    Setting("memq.min.batch.bytes", "min_batch_bytes", ConfigType.INT,
            "latency budget: a batch under this size keeps filling until memq.max.batch.ms (0: off)"),
    Setting("memq.offsets", "offsets", ConfigType.STRING,
            "Kafka offsets of its records: dense (record numbers 0, 1, 2, ... per partition) or sparse "
            "(notification offset << 24 | index: topics created before dense offsets); fixed at creation",
            at_creation=True),
    Setting("memq.notification.topic", "notification_topic", ConfigType.STRING,
            "the Kafka topic carrying this topic's notifications", read_only=True),
    Setting("memq.schema.validation.action", "schema_validation_action", ConfigType.STRING,
            "a record failing the schema checks: reject (the request, INVALID_RECORD), warn (stored, counted) or "
            "dlq (to <topic>.dlq, the rest stored)"),
    Setting("memq.read.partitions", "read_partitions", ConfigType.INT,
            "read partitions (the Kafka partitions): grown with CreatePartitions", read_only=True),
    Setting("memq.ring.slots", "ring_slots", ConfigType.INT, "batch slots per broker: one filling, others uploading"),
    Setting("memq.storage.group", "storage_group", ConfigType.STRING,
            "storage group whose shared objects hold this topic's batches (empty: objects of its own)"),
)
BY_NAME: Mapping[str, Setting] = {s.name: s for s in SETTINGS}


@dataclass(frozen=True)
class Inert:
    """A Kafka topic setting with no effect on memq: its type, Kafka's default and why it has none."""

    name: str
    type: ConfigType
    default: str
    why: str

    @property
    def doc(self) -> str:
        return f"no effect on memq: {self.why}"


_NO_SEGMENTS = "memq has no log segments: a batch is one object (memq.batch.bytes, memq.batch.ms)"
_NO_FLUSH = "no local log to flush: an ack=all waits for the batch to be in object storage and notified"
_NO_REPLICAS = "object storage replicates every batch; memq has no follower replicas"
_NOT_ENFORCED = "not enforced: records keep their producers' timestamps (CreateTime)"
_LONG_MAX = str(NO_LAG_BOUND)
INERT: tuple[Inert, ...] = (
    Inert("file.delete.delay.ms", ConfigType.LONG, "60000",
          "objects are deleted by the janitor a grace period after they expire (governor.retention_grace_s)"),
    Inert("flush.messages", ConfigType.LONG, _LONG_MAX, _NO_FLUSH),
    Inert("flush.ms", ConfigType.LONG, _LONG_MAX, _NO_FLUSH),
    Inert("follower.replication.throttled.replicas", ConfigType.LIST, "", _NO_REPLICAS),
    Inert("index.interval.bytes", ConfigType.INT, "4096", "a part's index is in its object, one entry per Message"),
    Inert("leader.replication.throttled.replicas", ConfigType.LIST, "", _NO_REPLICAS),
    Inert("local.retention.bytes", ConfigType.LONG, "-2", "every record is in object storage (retention.bytes)"),
    Inert("local.retention.ms", ConfigType.LONG, "-2", "every record is in object storage (retention.ms)"),
    Inert("message.downconversion.enable", ConfigType.BOOLEAN, "true",
          "Fetch serves RecordBatch v2 (Fetch v4 and later), never down-converted"),
    Inert("message.format.version", ConfigType.STRING, "3.0-IV1", "batches are RecordBatch v2"),
    Inert("message.timestamp.after.max.ms", ConfigType.LONG, _LONG_MAX, _NOT_ENFORCED),
    Inert("message.timestamp.before.max.ms", ConfigType.LONG, _LONG_MAX, _NOT_ENFORCED),
    Inert("message.timestamp.difference.max.ms", ConfigType.LONG, _LONG_MAX, _NOT_ENFORCED),
    Inert("min.insync.replicas", ConfigType.INT, "1", _NO_REPLICAS),
    Inert("preallocate", ConfigType.BOOLEAN, "false", "no log files to preallocate"),
    Inert("remote.storage.enable", ConfigType.BOOLEAN, "false", "every topic is in object storage"),
    Inert("segment.bytes", ConfigType.INT, "1073741824", _NO_SEGMENTS),
    Inert("segment.index.bytes", ConfigType.INT, "10485760", _NO_SEGMENTS),
    Inert("segment.jitter.ms", ConfigType.LONG, "0", _NO_SEGMENTS),
    Inert("segment.ms", ConfigType.LONG, "604800000", _NO_SEGMENTS),
    Inert("unclean.leader.election.enable", ConfigType.BOOLEAN, "false", _NO_REPLICAS),
)
INERT_BY_NAME: Mapping[str, Inert] = {i.name: i for i in INERT}
FIXED: Mapping[str, str] = {"message.timestamp.type": "CreateTime"}
"""The settings memq has one value of."""

_DEFAULTS: Mapping[str, Any] = {f.name: f.default for f in dataclasses.fields(TopicConfig) if f.name != "name"}
_INERT_FIELD = "kafka_inert"


def value_of(cfg: TopicConfig, s: Setting, cluster: str) -> str | None:
    """`s`'s value on topic `cfg` as Kafka's string (None: unset)."""
    if not s.field:
        return FIXED[s.name]
    if s.field == "notification_topic":
        return cfg.notification_topic_for(cluster)
    v = getattr(cfg, s.field)
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return {"retention_bytes": "-1", "max_compaction_lag_ms": str(NO_LAG_BOUND)}.get(s.field)
    return str(v)


def describe(cfg: TopicConfig, cluster: str, names: Iterable[str] | None = None) -> list[ConfigEntry]:
    """Topic `cfg`'s settings, then Kafka's inert ones (only `names` if given: names memq does not
    have are left out, as Kafka does)."""
    wanted = list(SETTINGS) + list(INERT) if names is None else [
        s for n in dict.fromkeys(names) if (s := BY_NAME.get(n) or INERT_BY_NAME.get(n)) is not None]
    stored = dict(cfg.kafka_inert)
    out = []
    for s in wanted:
        if isinstance(s, Inert):
            out.append(ConfigEntry(s.name, stored.get(s.name, s.default),
                                   _source(s.name in stored), False, s.type, s.doc))
            continue
        changed = bool(s.field) and getattr(cfg, s.field) != _DEFAULTS[s.field]
        out.append(ConfigEntry(s.name, value_of(cfg, s, cluster), _source(changed), s.read_only, s.type, s.doc))
    return out


def _source(changed: bool) -> ConfigSource:
    return ConfigSource.DYNAMIC_TOPIC_CONFIG if changed else ConfigSource.DEFAULT_CONFIG


def _setting(name: str) -> Setting | Inert:
    s = BY_NAME.get(name) or INERT_BY_NAME.get(name)
    if s is None:
        close = difflib.get_close_matches(name, [*BY_NAME, *INERT_BY_NAME], n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ConfigError(f"{name}: memq has no such topic setting ({hint}DescribeConfigs lists the ones it "
                          "has: Kafka's topic settings and memq.*)")
    return s


def _inert_value(s: Inert, value: str | None) -> str | None:
    """`value` checked against `s`'s type (None: back to Kafka's default, nothing stored)."""
    if value is None:
        return None
    if s.type in (ConfigType.INT, ConfigType.LONG):
        try:
            int(value)
        except ValueError:
            raise ConfigError(f"{s.name}={value!r}: not a number") from None
    elif s.type is ConfigType.BOOLEAN and value.lower() not in ("true", "false"):
        raise ConfigError(f"{s.name}={value!r}: want true or false")
    return value.lower() if s.type is ConfigType.BOOLEAN else value


def _set_inert(current: TopicConfig, s: Inert, value: str | None, out: dict[str, Any]) -> None:
    """Store (or, with None, drop) inert setting `s` in the changes `out`."""
    kept = dict(out.get(_INERT_FIELD, current.kafka_inert))
    checked = _inert_value(s, value)
    if checked is None:
        kept.pop(s.name, None)
    else:
        kept[s.name] = checked
    out[_INERT_FIELD] = tuple(sorted(kept.items()))


def _parse(s: Setting, value: str | None) -> Any:
    """The field value `value` sets for `s` (a writable setting with a field)."""
    if value is None or (value == "" and s.type is not ConfigType.STRING):
        return _DEFAULTS[s.field]
    try:
        if s.type is ConfigType.DOUBLE:
            return float(value)
        if s.type in (ConfigType.INT, ConfigType.LONG):
            n = int(value)
            if (s.field, n) in (("retention_bytes", -1), ("max_compaction_lag_ms", NO_LAG_BOUND)):
                return None
            return n
    except ValueError:
        raise ConfigError(f"{s.name}={value!r}: not a number") from None
    if s.type is ConfigType.BOOLEAN:
        if value.lower() not in ("true", "false"):
            raise ConfigError(f"{s.name}={value!r}: true or false")
        return value.lower() == "true"
    if s.field == "cleanup_policy":
        return cleanup_policy(list_items(value), s.name)
    return value.removeprefix(STRATEGY_PACKAGE) if s.field.endswith("_subject_name_strategy") else value


def list_items(value: str) -> frozenset[str]:
    """The items of a list setting's string (Kafka's list: comma-separated, any order)."""
    return frozenset(p.strip() for p in value.split(",") if p.strip())


def cleanup_policy(policies: frozenset[str], name: str = "cleanup.policy") -> str:
    """memq's spelling of a set of cleanup policies; ConfigError for an empty or unknown one."""
    got = POLICIES.get(policies)
    if got is None:
        raise ConfigError(f"{name}={','.join(sorted(policies))}: want delete, compact or compact,delete")
    return got


def _check_fixed(s: Setting, value: str | None, current: TopicConfig, cluster: str) -> None:
    """ConfigError unless `value` is what read-only or one-valued `s` has."""
    have = value_of(current, s, cluster)
    if value != have:
        why = "has one value in memq" if s.name in FIXED else "is read-only"
        hint = " (grow it with CreatePartitions)" if s.field == "read_partitions" else ""
        raise ConfigError(f"{s.name}={value}: {s.name} {why}: {have}{hint}")


def _assign(current: TopicConfig, name: str, value: str | None, cluster: str, out: dict[str, Any]) -> None:
    s = _setting(name)
    if isinstance(s, Inert):
        _set_inert(current, s, value, out)
    elif s.read_only or not s.field:
        _check_fixed(s, value, current, cluster)
    else:
        out[s.field] = _parse(s, value)


def assigned(current: TopicConfig, configs: Iterable[tuple[str, str | None]], cluster: str) -> dict[str, Any]:
    """The field changes that setting each (name, value) of `configs` on `current` makes (CreateTopics)."""
    out: dict[str, Any] = {}
    for name, value in configs:
        _assign(current, name, value, cluster, out)
    return out


def incremental(current: TopicConfig, ops: Iterable[tuple[str, int, str | None]], cluster: str) -> dict[str, Any]:
    """The field changes of IncrementalAlterConfigs' (name, operation, value) on `current`: SET
    sets, DELETE returns to memq's default (nothing for a read-only one); APPEND and SUBTRACT add
    and remove items of a list setting (memq's one: cleanup.policy), ConfigError for any other."""
    out: dict[str, Any] = {}
    for name, op, value in ops:
        s = _setting(name)
        if op == AlterOp.SET:
            _assign(current, name, value, cluster, out)
        elif op == AlterOp.DELETE:
            if isinstance(s, Inert):
                _set_inert(current, s, None, out)
            elif s.resettable:
                out[s.field] = _DEFAULTS[s.field]
        elif op in (AlterOp.APPEND, AlterOp.SUBTRACT):
            if s.type is not ConfigType.LIST:
                raise ConfigError(f"{name}: {AlterOp(op).name} is for list settings (memq's one is "
                                  "cleanup.policy): use SET or DELETE")
            if isinstance(s, Inert):
                kept = dict(out.get(_INERT_FIELD, current.kafka_inert)).get(s.name, s.default)
                have_items, items = list_items(kept), list_items(value or "")
                joined = ",".join(sorted(have_items | items if op == AlterOp.APPEND else have_items - items))
                _set_inert(current, s, joined, out)
                continue
            have = list_items(out.get(s.field, getattr(current, s.field)))
            items = list_items(value or "")
            out[s.field] = cleanup_policy(have | items if op == AlterOp.APPEND else have - items, name)
        else:
            raise ConfigError(f"{name}: unknown config operation {op}")
    return out


def replacement(current: TopicConfig, configs: Iterable[tuple[str, str | None]], cluster: str) -> dict[str, Any]:
    """The field changes of AlterConfigs' full replacement: the settings listed take their
    values, every other writable one returns to memq's default (as in Kafka), but those set at
    creation (`memq.offsets`): a topic's offsets keep naming the same records."""
    out = {s.field: _DEFAULTS[s.field] for s in SETTINGS if s.resettable} | {_INERT_FIELD: ()}
    for name, value in configs:
        _assign(current, name, value, cluster, out)
    return out


def altered(current: TopicConfig, changes: Mapping[str, Any]) -> TopicConfig:
    """`current` with `changes`, checked as the config file and `memq topic alter` check it; the
    ConfigError names the Kafka settings of the fields it names."""
    try:
        cfg: TopicConfig = build(TopicConfig, dataclasses.asdict(current) | dict(changes), f"topic {current.name}")
        cfg.check_byte_retention()
    except ConfigError as e:
        named = [f"{s.field} is {s.name}" for s in SETTINGS if s.field and re.search(rf"\b{s.field}\b", str(e))]
        raise ConfigError(f"{e}" + (f" ({'; '.join(named)})" if named else "")) from None
    return cfg


def broker_entries(node: int, broker_id: str, rack: str, max_frame_bytes: int, cluster: str) -> list[ConfigEntry]:
    """A broker's read-only view (DescribeConfigs of resource type BROKER): what it is, not
    settings Kafka's tools could change (a memq broker takes its settings from its config file)."""
    def entry(name: str, value: str, kind: ConfigType, doc: str) -> ConfigEntry:
        return ConfigEntry(name, value, ConfigSource.STATIC_BROKER_CONFIG, True, kind, doc)
    return [entry("broker.id", str(node), ConfigType.INT, "Kafka node id: derived from memq's broker id"),
            entry("broker.rack", rack, ConfigType.STRING, "the broker's rack (zone)"),
            entry("socket.request.max.bytes", str(max_frame_bytes), ConfigType.INT,
                  "largest request the broker reads (broker.max_frame_bytes)"),
            entry("memq.broker.id", broker_id, ConfigType.STRING, "memq's broker id"),
            entry("memq.cluster", cluster, ConfigType.STRING, "memq's cluster name")]
