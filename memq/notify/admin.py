"""Notification topics on Kafka: create (with the topic's read partitions), delete, describe."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic

from memq.config import KafkaConfig
from memq.errors import NotifyError, UnknownTopicError
from memq.notify._kafka import base_settings, ensure_reachable, timeout_s


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

    def create_topic(self, name: str, partitions: int) -> None:
        """Create `name`; a no-op if it exists with `partitions`, NotifyError if with others."""
        self._ensure_reachable()
        new = NewTopic(name, num_partitions=partitions, replication_factor=self._kafka.replication_factor)
        future = self._admin.create_topics([new], request_timeout=self._timeout_s,
                                           operation_timeout=self._timeout_s)[name]
        try:
            future.result(timeout=self._timeout_s + 1)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise NotifyError(f"cannot create Kafka topic {name!r} ({partitions} partitions): {e}") from None
            existing = self.partitions(name)
            if existing != partitions:
                raise NotifyError(f"Kafka topic {name!r} exists with {existing} partitions, "
                                  f"not {partitions}") from None
        except TimeoutError:
            raise NotifyError(f"creating Kafka topic {name!r} timed out after {self._timeout_s} s") from None

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
