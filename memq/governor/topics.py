"""Topic administration through ZooKeeper: create, alter, delete.

The topic znode is the source of truth; its Kafka notification topic is created first (with
`read_partitions` partitions and `retention.ms` = the topic's `retention_ms`), so a broker
that is assigned the topic can publish at once. Altering `retention_ms` alters `retention.ms`
first, so pointers never live longer than the objects the janitor keeps for them; growing
`read_partitions` grows the notification topic first (Kafka's CreatePartitions), so a broker
restarting the topic with more partitions finds them there. Read partitions never shrink.
"""

from __future__ import annotations

import dataclasses
import json
import ssl
import time
import urllib.error
import urllib.request
from typing import Any, Protocol

from memq.config import TopicConfig, build
from memq.errors import CoordinationError, InvalidInputError, UnknownTopicError

from .registry import Registry


class NotificationTopics(Protocol):
    """What topic admin needs from Kafka (memq.notify.TopicAdmin fits)."""

    def create_topic(self, name: str, partitions: int, *, retention_ms: int | None = None) -> None: ...
    def partitions(self, name: str) -> int: ...
    def set_retention(self, name: str, retention_ms: int) -> None: ...
    def create_partitions(self, name: str, total: int) -> None: ...
    def delete_topic(self, name: str) -> None: ...


FIXED_FIELDS = ("notification_topic", "offsets")
"""Settings alter cannot change: consumers follow the notification topic by name, offsets once
given (committed, stored by applications) must keep naming the same records (and
`read_partitions` only grows: Kafka cannot shrink partitions)."""


class TopicManager:
    """Topic admin for `memq topic`: keeps the ZooKeeper topic and its Kafka notification topic in step."""

    def __init__(self, registry: Registry, kafka: NotificationTopics, cluster: str) -> None:
        self.registry = registry
        self.kafka = kafka
        self.cluster = cluster

    def create(self, cfg: TopicConfig) -> TopicConfig:
        cfg.check_byte_retention()
        self.kafka.create_topic(cfg.notification_topic_for(self.cluster), cfg.read_partitions,
                                retention_ms=cfg.retention_ms)
        self.registry.create_topic(cfg)
        return cfg

    def ensure(self, cfg: TopicConfig, timeout_s: float, trust: ssl.SSLContext | None = None) -> tuple[str, ...]:
        """Create topic `cfg` unless it exists with the same settings (InvalidInputError if with
        others); the brokers serving it once placed (`wait_until_hosted`)."""
        check_partitions(self.kafka, cfg, self.cluster, governed=True)
        try:
            current = self.registry.topic(cfg.name)
        except UnknownTopicError:
            current = self.create(cfg)
        if current != cfg:
            raise InvalidInputError(
                f"topic {cfg.name} already exists with other settings ({current}): change them "
                f"with memq topic alter {cfg.name} --set FIELD=VALUE")
        return self.wait_until_hosted(cfg.name, timeout_s, trust)

    def wait_until_hosted(self, name: str, timeout_s: float, trust: ssl.SSLContext | None = None) -> tuple[str, ...]:
        """The brokers the governor placed topic `name` on, once each of them serves it
        (https brokers verified with `trust`)."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.registry.snapshot()
            placed = state.assignments.get(name, ())
            if placed and all(b in state.brokers and name in hosted_topics(state.brokers[b].url, trust)
                              for b in placed):
                return placed
            if time.monotonic() > deadline:
                raise CoordinationError(
                    f"topic {name} is not served by any broker after {timeout_s:g} s (assigned: "
                    f"{list(placed) or 'none'}): is a governor running? see `memq governor status`")
            time.sleep(0.2)

    def alter(self, name: str, **changes: Any) -> TopicConfig:
        """Change settings of an existing topic (validated like the config file)."""
        current = self.registry.topic(name)
        if "name" in changes and changes["name"] != name:
            raise InvalidInputError(f"topic {name}: cannot rename a topic")
        values = dataclasses.asdict(current) | changes
        cfg: TopicConfig = build(TopicConfig, values, f"topic {name}")
        cfg.check_byte_retention()
        cfg.check_altered_from(current)
        fixed = [f for f in FIXED_FIELDS if getattr(cfg, f) != getattr(current, f)]
        if fixed:
            raise InvalidInputError(f"topic {name}: {', '.join(fixed)} cannot be altered")
        if cfg.read_partitions < current.read_partitions:
            raise InvalidInputError(f"topic {name}: read_partitions cannot shrink ({current.read_partitions} -> "
                                    f"{cfg.read_partitions}): Kafka cannot remove partitions")
        if cfg.read_partitions > current.read_partitions:
            self.kafka.create_partitions(cfg.notification_topic_for(self.cluster), cfg.read_partitions)
        if cfg.retention_ms != current.retention_ms:
            self.kafka.set_retention(cfg.notification_topic_for(self.cluster), cfg.retention_ms)
        self.registry.alter_topic(cfg)
        return cfg

    def delete(self, name: str, *, delete_notifications: bool = False) -> None:
        """Delete the topic; its batches in S3 and (unless asked) its notifications stay."""
        cfg = self.registry.topic(name)
        self.registry.delete_topic(name)
        if delete_notifications:
            self.kafka.delete_topic(cfg.notification_topic_for(self.cluster))

    def list(self) -> dict[str, TopicConfig]:
        return self.registry.topics()


DELETE_HINT = {False: "memq topic delete {}", True: "memq governor topic delete {} --delete-notifications"}


def check_partitions(kafka: NotificationTopics, cfg: TopicConfig, cluster: str, *, governed: bool) -> None:
    """InvalidInputError when `cfg`'s notification topic exists with another partition count
    than its read_partitions (Kafka cannot shrink it, and growing it would reorder keys)."""
    kafka_topic = cfg.notification_topic_for(cluster)
    try:
        existing = kafka.partitions(kafka_topic)
    except UnknownTopicError:
        return
    if existing != cfg.read_partitions:
        raise InvalidInputError(
            f"topic {cfg.name}: its notification topic {kafka_topic} already has {existing} partitions, "
            f"not {cfg.read_partitions}: create it with -p {existing}, or delete it first "
            f"({DELETE_HINT[governed].format(cfg.name)})")


def hosted_topics(url: str, trust: ssl.SSLContext | None = None) -> list[str]:
    """Topics a broker serves now, from its /healthz ([] while it does not answer); an https
    broker is verified with `trust` (None: the system's CAs)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/healthz", timeout=2.0, context=trust) as resp:
            return list(json.load(resp)["topics"])
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return []
