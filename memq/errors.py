"""The one error hierarchy of memq.

Every error memq raises on purpose derives from `MemqError`, so callers can catch memq's
failures without catching programming errors. Subclasses say *what* went wrong; the message
says *where* (object key, topic, setting name, byte offset).
"""

from __future__ import annotations


class MemqError(Exception):
    """Base of every error memq raises on purpose."""


# --- configuration and input ---------------------------------------------------------------


class ConfigError(MemqError):
    """A setting is missing, unknown or has a bad value; the message names the setting."""


class InvalidInputError(MemqError):
    """The caller passed a value memq cannot accept (wrong type, too large, empty topic...)."""


class OffsetUnknownError(MemqError):
    """A dense offset, or a notification's base, lies outside the notifications whose bases this
    reader knows (before its checkpoint, or past the notifications it read): read further first."""


# --- data formats ---------------------------------------------------------------------------


class FormatError(MemqError):
    """Bytes could not be decoded into a memq structure."""


class CorruptDataError(FormatError):
    """Bytes are truncated, have a bad magic, a bad length or a checksum mismatch."""


class UnsupportedVersionError(FormatError):
    """Bytes carry a format version (or notification `v`) this reader does not know."""


class UnsupportedCodecError(FormatError):
    """A Message names a compression codec this reader does not know."""


# --- storage -------------------------------------------------------------------------------


class StorageError(MemqError):
    """A storage operation failed."""


class ObjectNotFoundError(StorageError):
    """The object (batch) does not exist, e.g. it was deleted or expired."""


class RetryBudgetExhaustedError(StorageError):
    """A retriable storage failure persisted through every allowed attempt."""


# --- notification queue (Kafka) -------------------------------------------------------------


class NotifyError(MemqError):
    """Publishing or reading notifications on Kafka failed."""


class KafkaUnreachableError(NotifyError):
    """No Kafka bootstrap server answered in time; the message names the address."""


# --- coordination (ZooKeeper) ---------------------------------------------------------------


class CoordinationError(MemqError):
    """A ZooKeeper operation failed or the registry is in an unexpected state."""


class LeadershipLostError(CoordinationError):
    """This governor's election znode is gone (session ended): it must stop writing."""


class StateFencedError(CoordinationError):
    """Another broker took over a share-partition's or a consumer group's state: this one must stop writing it."""


class TxnConflictError(CoordinationError):
    """A transaction's stored state changed since this broker read it (another broker wrote it):
    read it again and decide again."""


# --- broker / client protocol ---------------------------------------------------------------


class ProtocolError(MemqError):
    """A peer sent a frame that does not follow the memq wire protocol."""


class UnknownTopicError(MemqError):
    """The topic does not exist (or is not hosted where it was asked for)."""


class MessageTooLargeError(InvalidInputError):
    """A Message or LogMessage exceeds the configured size limit."""


class ProduceError(MemqError):
    """A Message could not be stored; the message says why (from the broker's error ack)."""


class KeyRequiredError(InvalidInputError):
    """A record without a key was sent to a compacted topic (`cleanup_policy` with compact): it
    keeps the latest record per key, so a record must have one (Kafka refuses such records too)."""


class InvalidRecordError(ProduceError):
    """A record fails its topic's schema checks (no schema id, an id not of the topic's subject, a
    payload that does not decode): the message names the record and why; nothing of its Message
    was stored. Not retried."""


class ProducerTimeoutError(ProduceError):
    """`send` waited longer than `max_block_ms`, or a Message got no ack within its timeout."""


class ProducerClosedError(ProduceError):
    """The producer was closed; no more sends are accepted."""


class TransactionError(ProduceError):
    """A transactional Producer's call does not fit its transaction's state (send or commit with
    none begun, a second begin), or the transaction cannot commit (one of its Messages failed:
    abort it and begin again); the message says which."""


class ProducerFencedError(TransactionError):
    """A newer Producer with the same transactional id took over (or the coordinator aborted this
    one's transaction after its timeout, with the same effect): this Producer can do nothing more
    transactionally; close it (Kafka's ProducerFencedException)."""


class AuthenticationError(MemqError):
    """A broker did not accept this client's credentials (HTTP 401), or TLS with it failed (wrong
    CA, one side not speaking TLS): a setting to fix, so never retried."""


class AuthorizationError(ProduceError):
    """An ACL denied the request (a produce, or seeing a topic at all: describe); the message names
    the principal, the operation and the topic. A rule to add, so never retried."""


class BrokerUnavailableError(MemqError):
    """No broker could be reached for a topic within the allowed time."""


# --- consumer -------------------------------------------------------------------------------


class ConsumerError(MemqError):
    """The consumer failed."""


class DataLossError(ConsumerError):
    """A batch named by a notification is missing or corrupt; names the object and position."""

    def __init__(self, message: str, *, topic: str = "", partition: int = -1, offset: int = -1,
                 location: str = "") -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.location = location


class OffsetOutOfRangeError(ConsumerError):
    """A consumer's position is outside the retained notifications (Kafka's OffsetOutOfRange)
    and `consumer.auto_offset_reset` is `error`; names the position and the oldest offset kept."""

    def __init__(self, message: str, *, topic: str, partition: int, offset: int, oldest: int) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.oldest = oldest


class UndecodableRecordError(ConsumerError):
    """A typed read's record whose value does not decode with the schema its id names (or the
    read schema); names the record's place. Raised with onError=fail."""

    def __init__(self, message: str, *, topic: str, partition: int | None, offset: int | None,
                 index: int | None) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.index = index


class SchemaChangedError(ConsumerError):
    """A typed sync met a schema id registered after it started: it restarts with the new read
    schema (nothing of the micro-batch was committed)."""


# --- schemas ---------------------------------------------------------------------------------


class SchemaError(MemqError):
    """A schema registry request memq cannot serve as asked: `.code` is Confluent's error code
    (40401 subject not found, 409 incompatible, 42201 invalid schema, ...), `.status` the HTTP
    status it goes out with (the code's first three digits)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.status = code // 100 if code >= 10000 else code


class SchemaConflictError(MemqError):
    """The schema store changed between a read and a write that depended on it (another broker
    registered or deleted meanwhile): read again, decide again."""


# --- local dev infrastructure ---------------------------------------------------------------


class DevClusterError(MemqError):
    """A local dev server (moto S3, tansu, ZooKeeper) failed to start, answer or stop."""
