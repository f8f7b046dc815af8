"""What the Kafka admin families answer per resource, sans I/O: an outcome (Kafka's error code and
message), the refusal carrying it, and memq's errors from the admin path as Kafka's codes."""

from __future__ import annotations

from dataclasses import dataclass

from memq.errors import ConfigError, InvalidInputError, MemqError, NotifyError, UnknownTopicError

from .protocol import ErrorCode

NO_ZOOKEEPER = ("this memq cluster has no ZooKeeper: each broker serves the topics of its config file, so "
                "Kafka's admin calls cannot create, change or delete topics (set zookeeper.enabled = true)")


@dataclass(frozen=True)
class Outcome:
    """One resource's answer: Kafka's error code and message (NONE, None: done)."""

    error: ErrorCode = ErrorCode.NONE
    message: str | None = None


class Refused(Exception):
    """A resource's refusal on the way (not a memq error: it carries the answer)."""

    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.outcome = Outcome(error, message)


def refusal(e: MemqError, invalid: ErrorCode) -> Refused:
    """Kafka's answer to memq error `e` from a topic's admin path (`invalid`: for a value memq refuses)."""
    if isinstance(e, UnknownTopicError):
        return Refused(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, str(e))
    if isinstance(e, (ConfigError, InvalidInputError)):
        return Refused(invalid, str(e))
    if isinstance(e, NotifyError):   # the notification Kafka failing: retriable, as on the read path
        return Refused(ErrorCode.KAFKA_STORAGE_ERROR, str(e))
    return Refused(ErrorCode.UNKNOWN_SERVER_ERROR, f"{type(e).__name__}: {e}")
