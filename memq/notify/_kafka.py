"""What every memq Kafka client shares: base settings, and librdkafka's log in Python logging."""

from __future__ import annotations

import logging
from typing import Any

from memq.config import KafkaConfig

# librdkafka logs through this logger (only while the client is polled), not to stderr.
KAFKA_LOG = logging.getLogger("memq.notify.librdkafka")


def base_settings(kafka: KafkaConfig) -> dict[str, Any]:
    """Settings for any confluent-kafka client: bootstrap, timeouts, logging."""
    return {
        "bootstrap.servers": kafka.bootstrap_servers,
        "socket.timeout.ms": kafka.request_timeout_ms,
        "logger": KAFKA_LOG,
    }


def timeout_s(kafka: KafkaConfig) -> float:
    return kafka.request_timeout_ms / 1000
