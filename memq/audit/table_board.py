"""Table syncs on the dashboard: each sync's driver reports what it committed after every commit
(`TableReporter`), on the cluster's table topic `memq.<cluster>.__tables` keyed by sync id; the
dashboard keeps the latest report of each sync (`TableBoard`) and adds its lag behind the topic's
ends as they are now, so a stopped sync's lag keeps growing on the page.

Why reports and not the catalog: the dashboard runs in the broker image, which has no pyiceberg,
and it would need every catalog's credentials; a report is the snapshot summaries' fold
(`tables.Committed`) the sync has in hand. Reports are display only: one that fails is logged,
never a reason to stop a sync.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import confluent_kafka
from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from memq.audit.tables import Committed, table_rows
from memq.client.cluster import resolve_topic
from memq.client.dense_offsets import topic_offsets
from memq.config import MemqConfig
from memq.errors import CorruptDataError, MemqError, NotifyError
from memq.notify import NotificationConsumer, TopicAdmin
from memq.notify._kafka import base_settings, timeout_s

log = logging.getLogger(__name__)

RETENTION_MS = 7 * 86_400_000    # a sync silent for a week leaves the page


def tables_topic(cluster: str) -> str:
    """The Kafka topic carrying `cluster`'s table sync reports."""
    return f"memq.{cluster}.__tables"


class TableReporter:
    """A sync driver's side: `report(committed)` after each commit (one flush: a commit is every
    few seconds at most)."""

    def __init__(self, config: MemqConfig) -> None:
        self._kafka = config.kafka
        self.topic = tables_topic(config.cluster.name)
        self._producer = confluent_kafka.Producer({**base_settings(config.kafka), "client.id": "memq-table-sync",
                                                   "acks": "all", "message.timeout.ms": config.kafka.request_timeout_ms})
        self._ensured = False

    def report(self, done: Committed) -> None:
        if not self._ensured:
            self._ensured = True
            try:
                TopicAdmin(self._kafka).create_topic(self.topic, 1, retention_ms=RETENTION_MS)
            except MemqError as e:   # report anyway: the topic may exist, or be created by the first report
                log.warning("table sync reports: %s could not be ensured: %s", self.topic, e)
        try:
            self._producer.produce(self.topic, done.to_json(), key=done.sync_id.encode())
            if self._producer.flush(timeout_s(self._kafka)):
                log.warning("table sync %s: its report to %s is not acked yet", done.sync_id, self.topic)
        except (confluent_kafka.KafkaException, BufferError) as e:
            log.warning("table sync %s: no report to %s: %s", done.sync_id, self.topic, e)


class TableBoard:
    """The dashboard's side: the latest report of each sync, read from the table topic's start
    once, then what is new at each `panel` call (blocking: the dashboard calls it in a thread)."""

    def __init__(self, config: MemqConfig) -> None:
        self._config = config
        self.topic = tables_topic(config.cluster.name)
        self._latest: dict[str, Committed] = {}
        self._next: dict[int, int] = {}      # partition → next offset to read
        self._consumer: confluent_kafka.Consumer | None = None
        self._lock = threading.Lock()        # one reader of the consumer at a time (concurrent requests)

    def reports(self) -> dict[str, Committed]:
        """Sync id → its latest report, after reading the table topic to its end."""
        consumer = self._consumer or self._open()
        if consumer is None:
            return dict(self._latest)
        # a fresh assignment reports each partition's end again (`enable.partition.eof`)
        consumer.assign([TopicPartition(self.topic, p, self._next.get(p, OFFSET_BEGINNING)) for p in self._next])
        todo, deadline = set(self._next), time.monotonic() + timeout_s(self._config.kafka)
        try:
            while todo and time.monotonic() < deadline:
                for m in consumer.consume(1000, 0.5):
                    err = m.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            raise NotifyError(f"reading {self.topic}: {err}")
                        todo.discard(m.partition())
                        continue
                    partition, offset = m.partition(), m.offset()
                    if partition is not None and offset is not None:   # always, on a message
                        self._next[partition] = offset + 1
                        self._take(m.value() or b"")
        finally:
            consumer.unassign()
        return dict(self._latest)

    def _open(self) -> confluent_kafka.Consumer | None:
        consumer = confluent_kafka.Consumer({
            **base_settings(self._config.kafka), "group.id": f"memq-board-{uuid.uuid4().hex}",
            "enable.auto.commit": False, "enable.partition.eof": True,
            "fetch.wait.max.ms": 1})   # 0: tansu never answers
        try:
            meta = consumer.list_topics(self.topic, timeout=timeout_s(self._config.kafka)).topics.get(self.topic)
        except confluent_kafka.KafkaException as e:
            consumer.close()
            raise NotifyError(f"reading {self.topic}: {e}") from None
        if meta is None or meta.error is not None:   # no sync has reported yet
            consumer.close()
            return None
        self._next = dict.fromkeys(meta.partitions, OFFSET_BEGINNING)
        self._consumer = consumer
        return consumer

    def _take(self, raw: bytes) -> None:
        try:
            done = Committed.from_json(raw)
        except CorruptDataError as e:
            log.warning("%s: %s", self.topic, e)
            return
        self._latest[done.sync_id] = done

    def panel(self, now_ms: int) -> dict[str, Any]:
        """`{"tables": table_rows(...)}`: each sync's latest report against its topic's ends now."""
        with self._lock:
            reports = self.reports()
        highs: dict[str, Mapping[int, int] | str] = {}
        for topic in sorted({done.topic for done in reports.values()}):
            try:
                highs[topic] = self._highs(topic)
            except MemqError as e:
                highs[topic] = str(e)
        return {"tables": table_rows(reports, highs, now_ms)}

    def _highs(self, topic: str) -> Mapping[int, int]:
        """The topic's ends in the offsets a sync's end offsets are in: notification offsets, or
        record offsets on a dense topic."""
        kafka_timeout = timeout_s(self._config.kafka)
        resolved = resolve_topic(self._config, topic, timeout_s=kafka_timeout)
        notes = NotificationConsumer(resolved.config.kafka, resolved.topic.notification_topic,
                                     group_id=f"memq-board-{uuid.uuid4().hex}", fetch_wait_ms=1)
        try:
            highs = {p: notes.watermarks(p)[1] for p in notes.partitions()}
        finally:
            notes.close()
        dense = topic_offsets(resolved, kafka_timeout)
        return highs if dense is None else {p: dense.offset_of(p, n) for p, n in highs.items()}

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None
