"""The publish path: the one way a broker's notifications go to Kafka.

Every notification a broker publishes goes through one `PublishPath`: a storage group's parts
once their object is stored (`memq.broker.storage_group.GroupWriter`), and a transaction's pending
notifications at its commit (`memq.broker.txn.service.Transactions`). The path

- publishes a call's notes in one `Publisher.publish_many` burst, and publishes those that
  failed again, the same notification of the same object, with a doubling pause, until they land
  or `republish_s` (`broker.notify_retry_ms`) has passed (a caller may ask for less);
- counts what it publishes: `memq_broker_notification_bytes{topic}` for each note that landed,
  `memq_broker_republished_notifications` for each one published again after a failure;
- tells the read path (`Landing.published`) of each note that landed, so readers waiting at its
  partition's tail get it at once rather than a Kafka round trip later.

A publish that failed may have landed all the same (librdkafka's "Message timed out" after a
Kafka stall): publishing it again costs at most a second notification of the same object, whose
Messages every reader drops by (producer id, epoch, sequence).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from prometheus_client import Counter

from memq.clock import Clock, SystemClock
from memq.errors import NotifyError
from memq.format import Notification

from .metrics import BrokerMetrics

log = logging.getLogger(__name__)

REPUBLISH_BACKOFF_S = (0.25, 5.0)
"""First and largest pause between publishes of notifications that failed (doubling)."""

Results = list[tuple[int, int] | NotifyError]


class Publisher(Protocol):
    """Where a broker publishes notifications (`memq.notify.NotificationPublisher`)."""

    async def publish_many(self, notes: Sequence[tuple[str, Notification]],
                           partitions: Sequence[int] | None = None) -> Results:
        """Each note's (partition, offset), or why not; `partitions`: each note's partition (-1: Kafka's pick)."""

    def health(self) -> str | None:
        """None while notifications can be published; otherwise why not."""

    def close(self) -> None:
        """Deliver what is queued (bounded), then release the Kafka clients."""


class Landing(Protocol):
    """What the read path is told of each notification published (`memq.broker.reads.Reads`)."""

    def published(self, notification_topic: str, partition: int, offset: int, note: Notification) -> None:
        """The part's notification just published: readers waiting at that partition get it now."""


class PublishPath:
    """The broker's publish path over `publisher` (module doc). `republish_s`: how long a note
    that failed is published again; `reads`: told of each note that landed."""

    def __init__(self, publisher: Publisher, metrics: BrokerMetrics, *, clock: Clock | None = None,
                 republish_s: float = 0.0, reads: Landing | None = None) -> None:
        self.publisher = publisher
        self.republish_s = republish_s
        self._clock = clock or SystemClock()
        self._reads = reads
        self._m = metrics
        self._bytes: dict[str, Counter] = {}   # per topic: a labels() lookup per note showed with 1000 topics

    def health(self) -> str | None:
        return self.publisher.health()

    async def publish(self, notes: Sequence[tuple[str, Notification]], partitions: Sequence[int] | None = None,
                      *, within_s: float | None = None) -> Results:
        """Publish every (Kafka topic, notification) (to `partitions`, when given: -1 for Kafka's
        pick); each result is its (partition, offset), or the NotifyError of its last attempt once
        `within_s` (at most, and by default, `republish_s`) has passed without it landing."""
        clock = self._clock
        window = self.republish_s if within_s is None else min(within_s, self.republish_s)
        deadline = clock.monotonic() + window
        results: Results = [NotifyError("not published")] * len(notes)
        pending = list(range(len(notes)))
        pause = REPUBLISH_BACKOFF_S[0]
        while True:
            try:
                got = await self.publisher.publish_many([notes[i] for i in pending],
                                                        None if partitions is None else [partitions[i] for i in pending])
            except Exception as e:   # a publisher bug must fail these notes only, never the broker
                got = [NotifyError(str(e))] * len(pending)
            for i, result in zip(pending, got):
                results[i] = result
            pending = [i for i in pending if isinstance(results[i], NotifyError)]
            if not pending or clock.monotonic() + pause > deadline:
                break
            log.warning("publishing %d notifications of object %s failed (%s): publishing them again in %.2gs",
                        len(pending), notes[pending[0]][1].key, results[pending[0]], pause)
            self._m.republished_notifications.inc(len(pending))
            await asyncio.sleep(pause)
            pause = min(2 * pause, REPUBLISH_BACKOFF_S[1])
        self._landed(notes, results)
        return results

    def _landed(self, notes: Sequence[tuple[str, Notification]], results: Results) -> None:
        reads = self._reads
        for (kafka_topic, note), result in zip(notes, results):
            if isinstance(result, NotifyError):
                continue
            counter = self._bytes.get(note.topic)
            if counter is None:
                counter = self._bytes[note.topic] = self._m.notification_bytes.labels(note.topic)
            counter.inc(len(note.to_bytes()))
            if reads is not None:
                reads.published(kafka_topic, *result, note)
