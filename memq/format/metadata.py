"""ClusterMetadata: the typed, versioned cluster view that brokers serve on `/v1/metadata`.

Every client (Producer, Consumer, Spark source, CLI) learns a topic's brokers, Kafka topic
and storage from this one model. JSON on the wire, versioned by "v": a reader accepts
fields it does not know (additions never bump "v"), and raises UnsupportedVersionError
only for a "v" newer than it knows (an incompatible change). A document without "v" is
version 1 (what brokers served before the field existed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memq.errors import CorruptDataError, UnsupportedVersionError

METADATA_VERSION = 1


@dataclass(frozen=True, slots=True)
class BrokerMetadata:
    id: str
    url: str
    rack: str = ""
    max_frame_bytes: int = 0             # the largest produce frame it reads; 0 = not said (older broker)
    kafka_address: str = ""              # "host:port" of its Kafka listener; "" = none


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    """Where one topic lives: the broker URLs hosting it (empty while it is unassigned) and
    the Kafka topic carrying its notifications, with that topic's partition count."""

    name: str
    notification_topic: str
    read_partitions: int
    brokers: tuple[str, ...] = ()
    retention_ms: int | None = None      # readers count objects older than this as expired, not lost
    storage_group: str = ""              # "" = objects of its own (the s3list read mode needs that)
    log_start: tuple[tuple[int, int], ...] = ()   # (partition, Kafka offset) DeleteRecords moved it to:
                                                  # readers get nothing before it (as expired)
    cleanup_policy: str = "delete"       # "compact" in it: producers refuse records without a key
    offsets: str = "sparse"              # "dense": Kafka offsets are record numbers (TopicConfig.offsets);
                                         # a document without the field (sparse is left out, as brokers
                                         # from before dense offsets left it) reads sparse


@dataclass(frozen=True, slots=True)
class TopicRefusal:
    """A topic the client asked for by name that its principal may not `operation` (Kafka's
    TOPIC_AUTHORIZATION_FAILED): answered the same whether the topic exists or not."""

    principal: str
    operation: str


@dataclass(frozen=True, slots=True)
class StorageMetadata:
    """Where batch objects are stored (no credentials: those stay in each client's config)."""

    kind: str = "s3"
    bucket: str = ""
    endpoint_url: str | None = None
    region: str = ""
    root_dir: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The part of the metadata a governed cluster knows better than one broker: every live
    broker and every topic's placement (from ZooKeeper)."""

    brokers: tuple[BrokerMetadata, ...]
    topics: Mapping[str, TopicMetadata]


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    cluster: str
    broker_id: str                       # the broker that answered
    kafka_bootstrap_servers: str
    storage: StorageMetadata
    brokers: tuple[BrokerMetadata, ...] = ()
    topics: Mapping[str, TopicMetadata] = field(default_factory=dict)
    refused: Mapping[str, TopicRefusal] = field(default_factory=dict)   # requested topics not visible
    v: int = METADATA_VERSION

    def overlaid(self, view: ClusterView | None) -> ClusterMetadata:
        """This broker's own metadata with the cluster's brokers and placements in place of its own."""
        if view is None:
            return self
        return dataclasses.replace(self, brokers=view.brokers, topics=dict(view.topics))

    def to_dict(self) -> dict[str, Any]:
        """The JSON document served on /v1/metadata."""
        return {
            "v": self.v,
            "cluster": self.cluster,
            "broker_id": self.broker_id,
            "brokers": [{"id": b.id, "url": b.url, "rack": b.rack, "max_frame_bytes": b.max_frame_bytes,
                         "kafka_address": b.kafka_address}
                        for b in self.brokers],
            "topics": {name: {"brokers": list(t.brokers), "notification_topic": t.notification_topic,
                              "read_partitions": t.read_partitions, "retention_ms": t.retention_ms,
                              "storage_group": t.storage_group,
                              **({"log_start": {str(p): o for p, o in t.log_start}} if t.log_start else {}),
                              **({"cleanup_policy": t.cleanup_policy} if t.cleanup_policy != "delete" else {}),
                              **({"offsets": t.offsets} if t.offsets != "sparse" else {})}
                       for name, t in self.topics.items()},
            "refused": {name: {"principal": r.principal, "operation": r.operation} for name, r in self.refused.items()},
            "kafka": {"bootstrap_servers": self.kafka_bootstrap_servers},
            "storage": {f.name: getattr(self.storage, f.name) for f in dataclasses.fields(StorageMetadata)},
        }

    @classmethod
    def from_dict(cls, doc: object) -> ClusterMetadata:
        """Parse and type-check a /v1/metadata document; unknown fields are ignored."""
        d = _obj(doc, "metadata")
        v = d.get("v", 1)
        if type(v) is not int or v < 1:
            raise CorruptDataError(f"metadata field 'v' is {v!r}, want a positive int")
        if v > METADATA_VERSION:
            raise UnsupportedVersionError(f"metadata version {v}, this reader knows up to {METADATA_VERSION}")
        kafka = _obj(d.get("kafka", {}), "metadata field 'kafka'")
        st = _obj(d.get("storage", {}), "metadata field 'storage'")
        return cls(
            cluster=_str(d, "cluster", "metadata"),
            broker_id=_str(d, "broker_id", "metadata", ""),
            kafka_bootstrap_servers=_str(kafka, "bootstrap_servers", "metadata field 'kafka'"),
            storage=StorageMetadata(
                kind=_str(st, "kind", "metadata field 'storage'", "s3"),
                bucket=_str(st, "bucket", "metadata field 'storage'", ""),
                endpoint_url=_opt_str(st, "endpoint_url", "metadata field 'storage'"),
                region=_str(st, "region", "metadata field 'storage'", ""),
                root_dir=_opt_str(st, "root_dir", "metadata field 'storage'")),
            brokers=tuple(_broker(b) for b in _list(d.get("brokers", []), "metadata field 'brokers'")),
            topics={name: _topic(name, t)
                    for name, t in _obj(d.get("topics", {}), "metadata field 'topics'").items()},
            refused={name: _refusal(name, r)
                     for name, r in _obj(d.get("refused", {}), "metadata field 'refused'").items()},
            v=v,
        )


def _broker(doc: object) -> BrokerMetadata:
    b = _obj(doc, "metadata broker")
    limit = b.get("max_frame_bytes", 0)
    if type(limit) is not int or limit < 0:
        raise CorruptDataError(f"metadata broker: max_frame_bytes is {limit!r}, want an int >= 0")
    return BrokerMetadata(id=_str(b, "id", "metadata broker"), url=_str(b, "url", "metadata broker"),
                          rack=_str(b, "rack", "metadata broker", ""), max_frame_bytes=limit,
                          kafka_address=_str(b, "kafka_address", "metadata broker", ""))


def _topic(name: str, doc: object) -> TopicMetadata:
    where = f"metadata topic {name!r}"
    t = _obj(doc, where)
    partitions = t.get("read_partitions")
    if type(partitions) is not int or partitions < 1:
        raise CorruptDataError(f"{where}: read_partitions is {partitions!r}, want a positive int")
    urls = _list(t.get("brokers", []), f"{where} brokers")
    if not all(isinstance(u, str) for u in urls):
        raise CorruptDataError(f"{where}: brokers must be URL strings, not {urls!r}")
    retention = t.get("retention_ms")
    if retention is not None and (type(retention) is not int or retention < 1):
        raise CorruptDataError(f"{where}: retention_ms is {retention!r}, want a positive int or null")
    starts = _obj(t.get("log_start", {}), f"{where} log_start")
    try:
        log_start = tuple(sorted((int(p), o) for p, o in starts.items()))
    except ValueError:
        raise CorruptDataError(f"{where}: log_start keys must be partition numbers, not {list(starts)}") from None
    if not all(type(o) is int and o >= 0 and p >= 0 for p, o in log_start):
        raise CorruptDataError(f"{where}: log_start is {dict(starts)!r}, want partition -> offset >= 0")
    return TopicMetadata(name=name, notification_topic=_str(t, "notification_topic", where),
                         read_partitions=partitions, brokers=tuple(u.rstrip("/") for u in urls), retention_ms=retention,
                         storage_group=_str(t, "storage_group", where, ""), log_start=log_start,
                         cleanup_policy=_str(t, "cleanup_policy", where, "delete"),
                         offsets=_str(t, "offsets", where, "sparse"))


def _refusal(name: str, doc: object) -> TopicRefusal:
    where = f"metadata refused topic {name!r}"
    r = _obj(doc, where)
    return TopicRefusal(principal=_str(r, "principal", where), operation=_str(r, "operation", where))


def _obj(doc: object, where: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise CorruptDataError(f"{where} is a JSON {type(doc).__name__}, not an object")
    return doc


def _list(doc: object, where: str) -> list[Any]:
    if not isinstance(doc, list):
        raise CorruptDataError(f"{where} is a JSON {type(doc).__name__}, not a list")
    return doc


_MISSING = object()


def _str(d: Mapping[str, Any], name: str, where: str, default: object = _MISSING) -> str:
    value = d.get(name, default)
    if value is _MISSING:
        raise CorruptDataError(f"{where}: field {name!r} is missing")
    if not isinstance(value, str):
        raise CorruptDataError(f"{where}: field {name!r} is {value!r}, want a string")
    return value


def _opt_str(d: Mapping[str, Any], name: str, where: str) -> str | None:
    return None if d.get(name) is None else _str(d, name, where)
