"""The auditor: consumes the audit topic into the books and persists them with its offsets.

One worker thread does all writing: poll the audit topic, add the records to the books, and
every `commit_interval_s` advance the books' clock and commit changes + next offsets to SQLite
in one transaction. Readers (the dashboard) take the same lock for a consistent view. The
partitions are assigned explicitly (no consumer-group rebalance): one auditor per cluster,
and its position lives in its own database, not in Kafka. That position belongs to one Kafka
cluster: when the database was written against another cluster id, or a stored offset lies
beyond the end of its partition (e.g. a new in-memory Kafka of a restarted `memq dev`), the
books are started over and the reason is logged, so nothing of the old cluster counts.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

import confluent_kafka

from memq.audit.books import Books, BooksSettings
from memq.audit.records import decode_records
from memq.audit.store import AuditStore
from memq.config import MemqConfig
from memq.errors import FormatError, MemqError, NotifyError
from memq.notify import TopicAdmin
from memq.notify._kafka import base_settings

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class AuditorStats:
    records: int          # audit records accounted for since start
    bad_payloads: int     # audit-topic messages that did not decode (skipped, logged)
    offsets: dict[int, int]


def books_settings(config: MemqConfig) -> BooksSettings:
    a = config.audit
    return BooksSettings(grace_ms=int(a.grace_s * 1000), retention_ms=int(a.retention_s * 1000),
                         warn_lag_ms=int(a.warn_lag_s * 1000), stall_ms=int(a.stall_s * 1000),
                         skew_ms=int(a.partition_skew_s * 1000))


class Auditor:
    """Balances the books of one cluster; `start()`/`stop()` run it on a background thread."""

    def __init__(self, config: MemqConfig, *, db_path: str | None = None,
                 commit_interval_s: float = 0.5) -> None:
        self.config = config
        self.topic = config.audit.topic_for(config.cluster.name)
        self._db_path = db_path or config.audit.db_path
        self._commit_interval_s = commit_interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._books = Books(books_settings(config))
        self._offsets: dict[int, int] = {}
        self._records = self._bad = 0
        self._error: BaseException | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        """Load the database, ensure the audit topic, assign its partitions, start consuming."""
        store = AuditStore(self._db_path)
        timeout_ms = self.config.kafka.request_timeout_ms
        try:
            TopicAdmin(self.config.kafka).create_topic(self.topic, self.config.audit.partitions)
        except NotifyError as e:        # e.g. auto-created with other partitions: we read them all
            log.warning("audit topic %s: %s", self.topic, e)
        consumer = confluent_kafka.Consumer({
            **base_settings(self.config.kafka),
            "group.id": f"memq-auditor-{self.config.cluster.name}",
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": max(6000, min(timeout_ms, 45000)),
        })
        try:
            meta = consumer.list_topics(self.topic, timeout=timeout_s)
            parts = sorted(meta.topics[self.topic].partitions)
            if not parts:
                raise NotifyError(f"audit topic {self.topic} has no partitions")
            ends = {p: consumer.get_watermark_offsets(
                confluent_kafka.TopicPartition(self.topic, p), timeout=timeout_s)[1] for p in parts}
            self._restore(store, str(meta.cluster_id), ends)
            consumer.assign([confluent_kafka.TopicPartition(
                self.topic, p, self._offsets.get(p, confluent_kafka.OFFSET_BEGINNING)) for p in parts])
        except (confluent_kafka.KafkaException, NotifyError) as e:
            consumer.close()
            store.close()
            raise NotifyError(f"audit topic {self.topic}: cannot assign partitions: {e}") from None
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(consumer, store),
                                        name="memq-auditor", daemon=True)
        self._thread.start()
        log.info("auditor consuming %s (partitions %s) into %s", self.topic, parts, self._db_path)

    def _restore(self, store: AuditStore, kafka_cluster: str, ends: dict[int, int]) -> None:
        """Load the books and offsets if they belong to this Kafka cluster, else start over."""
        state, offsets = store.load(int(time.time() * 1000) - self._books.settings.memory_ms)
        stored = store.kafka_cluster()
        beyond = {p: (o, ends[p]) for p, o in offsets.items() if o > ends.get(p, 0)}
        if stored is None and not offsets:
            store.reset(kafka_cluster)
            return
        if stored == kafka_cluster and not beyond:
            self._books.restore(state)
            self._offsets = offsets
            return
        why = (f"it was written against Kafka cluster {stored!r}, this is {kafka_cluster!r}"
               if stored != kafka_cluster else
               "its offsets lie beyond the end of " + ", ".join(
                   f"partition {p} ({o} > {end})" for p, (o, end) in sorted(beyond.items())))
        log.warning("audit database %s: %s (a new Kafka?); its books (%d topics) are dropped and "
                    "the audit topic %s is read from the beginning",
                    self._db_path, why, len(state.topics), self.topic)
        store.reset(kafka_cluster)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Commit what was read and stop; a later start() resumes exactly from there."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self, consumer: confluent_kafka.Consumer, store: AuditStore) -> None:
        next_commit = time.monotonic()
        try:
            while not self._stop.is_set():
                msgs = consumer.consume(num_messages=1000, timeout=0.1)
                with self._lock:
                    for m in msgs:
                        self._take(m)
                    if time.monotonic() >= next_commit:
                        self._commit(store)
                        next_commit = time.monotonic() + self._commit_interval_s
            with self._lock:
                self._commit(store)
        except BaseException as e:      # surfaced by stats()/health, never silently
            log.exception("auditor stopped on error")
            self._error = e
        finally:
            consumer.close()
            store.close()

    def _take(self, m: confluent_kafka.Message) -> None:
        err = m.error()
        if err is not None:
            if err.code() != confluent_kafka.KafkaError._PARTITION_EOF:
                log.warning("audit topic %s: %s", self.topic, err)
            return
        self._offsets[m.partition()] = m.offset() + 1  # type: ignore[index,operator]  # set: no error
        try:
            _, records = decode_records(m.value() or b"")
        except FormatError as e:
            self._bad += 1
            log.warning("audit topic %s partition %d offset %d skipped: %s",
                        self.topic, m.partition(), m.offset(), e)
            return
        self._books.add_all(records)
        self._records += len(records)

    def _commit(self, store: AuditStore) -> None:
        self._books.advance(int(time.time() * 1000))
        store.commit(self._books.drain_changes(), dict(self._offsets))

    # --- reading ---------------------------------------------------------------------------

    def read(self, fn: Callable[[Books], T]) -> T:
        """Run fn on the books under the lock (a consistent view); fn must not keep references."""
        with self._lock:
            return fn(self._books)

    def stats(self) -> AuditorStats:
        if self._error is not None:
            raise MemqError(f"auditor of {self.topic} failed: {self._error!r}") from self._error
        with self._lock:
            return AuditorStats(self._records, self._bad, dict(self._offsets))

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
