"""Notification topics on Kafka: create (with the topic's read partitions and retention), alter
retention, add partitions, expire records, delete, describe.

A notification topic's `retention.ms` is its memq topic's `retention_ms`, so Kafka drops
pointers before the janitor deletes their objects (a grace period later). Brokers that accept
but do not enforce `retention.ms` (tansu 0.6) or lack DeleteRecords are covered by the
janitor: see `memq.governor.janitor`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ClusterMetadata, ConfigEntry, ConfigResource,
                                  NewPartitions, NewTopic)

from memq.config import KafkaConfig
from memq.errors import InvalidInputError, NotifyError, UnknownTopicError
from memq.notify._kafka import base_settings, ensure_reachable, timeout_s


@dataclass(frozen=True)
class KafkaTopic:
    """A notification topic to create: its partitions and, if given, its `retention.ms`."""

    name: str
    partitions: int
    retention_ms: int | None = None


class TopicCreator(Protocol):
    """What a broker needs of Kafka's admin: creating its topics' notification topics."""

    def create_topics(self, topics: Sequence[KafkaTopic]) -> dict[str, str]:
        """Create those missing; {kafka topic: why} for those that could not be created."""


class TopicAdmin:
    """confluent-kafka's AdminClient with a timeout on every call and memq's errors.

    The first call checks that Kafka answers at all (`ensure_reachable`), so an unreachable
    cluster fails in seconds with its address, not after the full request timeout.
    """

    def __init__(self, kafka: KafkaConfig) -> None:
        self._kafka = kafka
        self._timeout_s = timeout_s(kafka)
        self._admin = AdminClient(base_settings(kafka))
        self._reached = False

    def _ensure_reachable(self) -> None:
        if not self._reached:
            ensure_reachable(self._admin, self._kafka)
            self._reached = True

    def create_topic(self, name: str, partitions: int, *, retention_ms: int | None = None) -> None:
        """Create `name` (with `retention.ms` if given); a no-op if it exists with `partitions`,
        NotifyError if with others."""
        failed = self.create_topics([KafkaTopic(name, partitions, retention_ms)])
        if failed:
            raise NotifyError(failed[name])

    def create_topics(self, topics: Sequence[KafkaTopic]) -> dict[str, str]:
        """Create every topic of `topics` in one CreateTopics request (a broker hosting a thousand
        topics starts in one round trip, not a thousand); those that exist already must have
        their partitions (checked in one metadata request). Returns why, for each topic that
        could not be created (empty: all exist as asked); NotifyError if Kafka is unreachable."""
        if not topics:
            return {}
        self._ensure_reachable()
        new = [NewTopic(t.name, num_partitions=t.partitions, replication_factor=self._kafka.replication_factor,
                        config={} if t.retention_ms is None else {"retention.ms": str(t.retention_ms)})
               for t in topics]
        futures = self._admin.create_topics(new, request_timeout=self._timeout_s, operation_timeout=self._timeout_s)
        deadline = time.monotonic() + self._timeout_s + 1
        failed: dict[str, str] = {}
        existing: list[KafkaTopic] = []
        for t in topics:
            try:
                futures[t.name].result(timeout=max(deadline - time.monotonic(), 0))
            except KafkaException as e:
                if e.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    existing.append(t)
                else:
                    failed[t.name] = f"cannot create Kafka topic {t.name!r} ({t.partitions} partitions): {e}"
            except TimeoutError:
                failed[t.name] = f"creating Kafka topic {t.name!r} timed out after {self._timeout_s} s"
        if existing:
            described = self._metadata().topics
            for t in existing:
                have = described.get(t.name)
                count = len(have.partitions) if have is not None and have.error is None else 0
                if count != t.partitions:
                    failed[t.name] = f"Kafka topic {t.name!r} exists with {count} partitions, not {t.partitions}"
        return failed

    def set_retention(self, name: str, retention_ms: int) -> None:
        """Set `retention.ms` of topic `name` (IncrementalAlterConfigs); NotifyError on failure."""
        self._ensure_reachable()
        resource = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=[
            ConfigEntry("retention.ms", str(retention_ms), incremental_operation=AlterConfigOpType.SET)])
        self._result(self._admin.incremental_alter_configs([resource], request_timeout=self._timeout_s)[resource],
                     f"set retention.ms={retention_ms} on Kafka topic {name!r}")

    def create_partitions(self, name: str, total: int) -> None:
        """Grow topic `name` to `total` partitions (a no-op if it has them: a retry after a
        failure past this step). InvalidInputError if it has more or this Kafka does not serve
        CreatePartitions (tansu 0.6 does not), NotifyError if Kafka fails."""
        have = self.partitions(name)
        if have == total:
            return
        if have > total:
            raise InvalidInputError(f"Kafka topic {name!r} has {have} partitions: it cannot shrink to {total}")
        future = self._admin.create_partitions([NewPartitions(name, total)], request_timeout=self._timeout_s,
                                               operation_timeout=self._timeout_s)[name]
        try:
            future.result(timeout=self._timeout_s + 1)
        except KafkaException as e:
            if e.args[0].code() == KafkaError._UNSUPPORTED_FEATURE:
                raise InvalidInputError(
                    f"the notification Kafka ({self._kafka.bootstrap_servers}) does not serve CreatePartitions "
                    f"(KIP-195): Kafka topic {name!r} cannot grow from {have} to {total} partitions") from None
            raise NotifyError(f"cannot grow Kafka topic {name!r} to {total} partitions: {e}") from None
        except TimeoutError:
            raise NotifyError(f"growing Kafka topic {name!r} timed out after {self._timeout_s} s") from None

    def retention_ms(self, name: str) -> int | None:
        """The `retention.ms` Kafka reports for topic `name` (None if it reports none)."""
        self._ensure_reachable()
        resource = ConfigResource(ConfigResource.Type.TOPIC, name)
        configs = self._result(self._admin.describe_configs([resource], request_timeout=self._timeout_s)[resource],
                               f"describe Kafka topic {name!r}")
        entry = configs.get("retention.ms")
        return None if entry is None or entry.value is None else int(entry.value)

    def delete_records(self, name: str, before: Mapping[int, int]) -> None:
        """Expire the records of topic `name` before offset `before[p]` in each partition p
        (DeleteRecords); NotifyError if Kafka refuses (tansu 0.6 drops the connection)."""
        if not before:
            return
        self._ensure_reachable()
        futures = self._admin.delete_records([TopicPartition(name, p, o) for p, o in before.items()],
                                             request_timeout=self._timeout_s, operation_timeout=self._timeout_s)
        for future in futures.values():
            self._result(future, f"delete records of Kafka topic {name!r} before {dict(before)}")

    def _result(self, future: Future[Any], doing: str) -> Any:
        """The admin call's result within the timeout, its failure as NotifyError naming `doing`."""
        try:
            return future.result(timeout=self._timeout_s + 1)
        except KafkaException as e:
            raise NotifyError(f"cannot {doing}: {e}") from None
        except TimeoutError:
            raise NotifyError(f"cannot {doing}: timed out after {self._timeout_s} s") from None

    def delete_topic(self, name: str) -> None:
        """Delete `name`; UnknownTopicError if it does not exist."""
        self._ensure_reachable()
        future = self._admin.delete_topics([name], request_timeout=self._timeout_s,
                                           operation_timeout=self._timeout_s)[name]
        try:
            future.result(timeout=self._timeout_s + 1)
        except KafkaException as e:
            if e.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise UnknownTopicError(f"Kafka topic {name!r} does not exist") from None
            raise NotifyError(f"cannot delete Kafka topic {name!r}: {e}") from None
        except TimeoutError:
            raise NotifyError(f"deleting Kafka topic {name!r} timed out after {self._timeout_s} s") from None

    def partitions(self, name: str) -> int:
        """Number of partitions of `name`; UnknownTopicError if it does not exist."""
        topic = self._metadata().topics.get(name)
        if topic is None or topic.error is not None:
            raise UnknownTopicError(f"Kafka topic {name!r} does not exist")
        return len(topic.partitions)

    def list_topics(self) -> list[str]:
        """Every topic on the cluster, sorted, without Kafka's internal ones."""
        return sorted(t for t in self._metadata().topics if not t.startswith("__"))

    def _metadata(self) -> ClusterMetadata:
        # Always ask for all topics: a metadata request naming a topic may auto-create it.
        self._ensure_reachable()
        try:
            return self._admin.list_topics(timeout=self._timeout_s)
        except KafkaException as e:
            raise NotifyError(f"cannot read Kafka metadata from {self._kafka.bootstrap_servers}: {e}") from None
