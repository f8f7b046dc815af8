"""What every memq Kafka client shares: base settings, librdkafka's log in Python logging, and
a fast check that Kafka answers at all.

librdkafka retries an unreachable bootstrap server quietly until each call's own timeout
(`kafka.request_timeout_ms`, 30 s by default), logging every failed connect; `ensure_reachable`
turns that into one error naming the address within `REACHABLE_TIMEOUT_S`.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from confluent_kafka import KafkaException

from memq.config import KafkaConfig
from memq.errors import KafkaUnreachableError

# librdkafka logs through this logger (only while the client is polled), not to stderr.
KAFKA_LOG = logging.getLogger("memq.notify.librdkafka")

# How long a first metadata request may take before Kafka counts as unreachable.
REACHABLE_TIMEOUT_S = 5.0


class _LibrdkafkaLog:
    """librdkafka's log lines at DEBUG (its CRITICAL ones at WARNING): it logs each failed
    connect again on every retry, while memq reports a failure once, as a typed error."""

    def log(self, level: int, msg: str, *args: Any) -> None:
        KAFKA_LOG.log(logging.WARNING if level >= logging.CRITICAL else logging.DEBUG, msg, *args)


def base_settings(kafka: KafkaConfig) -> dict[str, Any]:
    """Settings for any confluent-kafka client: bootstrap, timeouts, logging, and the config's
    extra librdkafka properties (`kafka.properties`: SASL, SSL, ...)."""
    return {
        **kafka.librdkafka(),
        "bootstrap.servers": kafka.bootstrap_servers,
        "socket.timeout.ms": kafka.request_timeout_ms,
        "logger": _LibrdkafkaLog(),
    }


def timeout_s(kafka: KafkaConfig) -> float:
    return kafka.request_timeout_ms / 1000


class _MetadataClient(Protocol):
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any: ...


def ensure_reachable(client: _MetadataClient, kafka: KafkaConfig) -> None:
    """KafkaUnreachableError naming the bootstrap address unless `client` gets cluster metadata
    within a few seconds (at most the request timeout)."""
    wait_s = min(REACHABLE_TIMEOUT_S, timeout_s(kafka))
    try:
        client.list_topics(timeout=wait_s)
    except KafkaException as e:
        raise KafkaUnreachableError(f"Kafka at {kafka.bootstrap_servers} is unreachable "
                                    f"(no metadata within {wait_s:g} s: {e.args[0].str()})") from None
