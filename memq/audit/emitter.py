"""`AuditEmitter`: the clients' AuditSink, shipping audit records to Kafka off the hot path.

A `produced()`/`consumed()` call appends one tuple to a bounded in-memory deque (well under a
microsecond or two); a background thread encodes what accumulated every `flush_ms` into one
Kafka message (many records each) and hands it to a confluent-kafka producer. When the buffer
is full the record is dropped and counted: auditing must never slow down or block the data
path, and a drop shows up at the auditor as a loss/unmatched record, not as silence.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from functools import partial

import confluent_kafka

from memq.audit.records import Kind, encode_records
from memq.config import AuditConfig, KafkaConfig, MemqConfig
from memq.errors import MemqError
from memq.notify import TopicAdmin
from memq.notify._kafka import base_settings

log = logging.getLogger(__name__)

_MAX_RECORDS_PER_MESSAGE = 4096       # ~170 KiB per Kafka message, below the 1 MiB default limit
_PRODUCED, _CONSUMED, _EXPIRED, _ABORTED = int(Kind.PRODUCED), int(Kind.CONSUMED), int(Kind.EXPIRED), int(Kind.ABORTED)


@dataclass(frozen=True)
class EmitterStats:
    buffered: int
    dropped: int      # buffer full, or the Kafka client's own queue full
    sent: int         # records acknowledged by Kafka
    failed: int       # records Kafka refused or timed out


class AuditEmitter:
    """Implements the AuditSink protocol of docs/ARCHITECTURE.md; thread-safe, never blocks."""

    def __init__(self, kafka: KafkaConfig, audit: AuditConfig, cluster: str, *,
                 client_id: str = "memq-audit") -> None:
        self.topic = audit.topic_for(cluster)
        self._cluster = cluster
        self._kafka = kafka
        self._partitions = audit.partitions
        self._max = audit.buffer_records
        self._flush_s = audit.flush_ms / 1000
        self._buf: deque[tuple] = deque()
        self._dropped = self._sent = self._failed = 0
        self._stop = threading.Event()
        self._ready = threading.Event()   # topic ensured: producing earlier would auto-create it
        self._producer = confluent_kafka.Producer({
            **base_settings(kafka), "client.id": client_id,
            "acks": "all", "enable.idempotence": True, "linger.ms": 20,
            "message.timeout.ms": kafka.request_timeout_ms,
            "socket.timeout.ms": kafka.request_timeout_ms,
        })
        self._thread = threading.Thread(target=self._run, name="memq-audit-emitter", daemon=True)
        self._thread.start()

    # --- the hot path ----------------------------------------------------------------------

    def produced(self, *, topic: str, producer_id: int, epoch: int, sequence: int, count: int,
                 digest: int, created_ms: int) -> None:
        if len(self._buf) >= self._max:
            self._dropped += 1
            return
        self._buf.append((_PRODUCED, topic, "", producer_id, epoch, sequence, count, digest,
                          created_ms, time.time_ns() // 1_000_000))

    def consumed(self, *, topic: str, group: str, producer_id: int, epoch: int, sequence: int,
                 count: int, digest: int, created_ms: int, consumed_ms: int) -> None:
        if len(self._buf) >= self._max:
            self._dropped += 1
            return
        self._buf.append((_CONSUMED, topic, group, producer_id, epoch, sequence, count, digest,
                          created_ms, consumed_ms))

    def expired(self, *, topic: str, before_ms: int) -> None:
        """Retention deleted `topic`'s data created before `before_ms` (the janitor's record)."""
        if len(self._buf) >= self._max:
            self._dropped += 1
            return
        self._buf.append((_EXPIRED, topic, "", 0, 0, 0, 0, 0, before_ms, time.time_ns() // 1_000_000))

    def aborted(self, *, topic: str, count: int) -> None:
        """A transaction holding `count` LogMessages of `topic` was aborted (its coordinator's
        record): never readable, so counted apart, neither produced nor lost."""
        if len(self._buf) >= self._max:
            self._dropped += 1
            return
        now_ms = time.time_ns() // 1_000_000
        self._buf.append((_ABORTED, topic, "", 0, 0, 0, count, 0, now_ms, now_ms))

    # --- shipping --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            TopicAdmin(self._kafka).create_topic(self.topic, self._partitions)
        except MemqError as e:      # keep emitting: the topic may exist or be auto-created
            log.warning("audit topic %s could not be ensured: %s", self.topic, e)
        self._ready.set()
        while not self._stop.wait(self._flush_s):
            self._ship()

    def _ship(self) -> None:
        """Move everything buffered so far into the Kafka client's queue."""
        buf = self._buf
        while buf:
            rows = [buf.popleft() for _ in range(min(len(buf), _MAX_RECORDS_PER_MESSAGE))]
            n = len(rows)
            try:
                self._producer.produce(self.topic, encode_records(self._cluster, rows),
                                       on_delivery=partial(self._delivered, n))
            except BufferError:
                self._dropped += n
            except confluent_kafka.KafkaException as e:
                log.warning("audit records not sent to %s: %s", self.topic, e)
                self._failed += n
        self._producer.poll(0)

    def _delivered(self, n: int, err: confluent_kafka.KafkaError | None, _msg: confluent_kafka.Message) -> None:
        if err is None:
            self._sent += n
        else:
            log.warning("audit records to %s failed: %s", self.topic, err)
            self._failed += n

    def flush(self, timeout_s: float = 10.0) -> int:
        """Ship everything buffered and wait for Kafka's acks; returns records still unacked."""
        self._ready.wait(timeout_s)
        self._ship()
        return self._producer.flush(timeout_s)

    def stats(self) -> EmitterStats:
        return EmitterStats(len(self._buf), self._dropped, self._sent, self._failed)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the thread, ship the rest, wait up to timeout_s for it to be acknowledged."""
        self._stop.set()
        self._thread.join(timeout_s)
        if self.flush(timeout_s):        # Kafka unreachable: give up rather than hang in close()
            self._producer.purge()
            self._producer.poll(0)
        self._producer.close()


def make_audit_sink(config: MemqConfig, *, client_id: str = "memq-audit") -> AuditEmitter | None:
    """The emitter clients should use, or None when `[audit] enabled = false` (no cost at all)."""
    if not config.audit.enabled:
        return None
    return AuditEmitter(config.kafka, config.audit, config.cluster.name, client_id=client_id)
