"""Publish notifications to Kafka and await their delivery from asyncio.

One confluent-kafka Producer (acks=all, idempotent) at a time. A poll thread serves
librdkafka's delivery reports and hands each round of them to the event loop with a single
`call_soon_threadsafe`, so thousands of in-flight publishes cost one loop wake-up per round.

An idempotent producer can be fenced for good: after a Kafka stall longer than its request
timeout, librdkafka bumps its epoch and the Kafka broker answers every later publish with
PRODUCER_FENCED. The poll thread then replaces the producer with a fresh one (new producer
id), failing what the old one still held; each of those batches fails once and its producer
retries it, so no batch is announced twice by memq. `health()` says why publishing fails
until a publish succeeds again, or, when idle, until Kafka answers a metadata request.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from memq.config import KafkaConfig
from memq.errors import NotifyError
from memq.format import Notification
from memq.notify._kafka import base_settings, timeout_s

log = logging.getLogger("memq.notify")

POLL_INTERVAL_S = 0.05
QUEUE_FULL_BACKOFF_S = 0.005
REBUILD_MIN_INTERVAL_S = 1.0   # a fresh producer fenced again at once is not rebuilt in a loop
PROBE_INTERVAL_S = 1.0         # idle and failing: ask Kafka for metadata this often

# Errors after which this producer id can never publish again: only a new producer helps.
_FENCED = frozenset({KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError.UNKNOWN_PRODUCER_ID,
                     KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, KafkaError.INVALID_PRODUCER_ID_MAPPING,
                     KafkaError._FATAL})

# (future, topic, error, partition, offset) of one delivery report
_Report = tuple[asyncio.Future[tuple[int, int]], str, KafkaError | None, int | None, int | None]


def needs_new_producer(err: KafkaError) -> bool:
    """True for an error that fences the producer for good (fatal, or a stale id/epoch)."""
    return err.fatal() or err.code() in _FENCED


class NotificationPublisher:
    """`await publish(topic, notification)` -> (partition, offset) once Kafka has it (acks=all)."""

    def __init__(self, kafka: KafkaConfig, *, client_id: str, linger_ms: int = 2) -> None:
        self._timeout_s = timeout_s(kafka)
        self._settings: dict[str, Any] = {
            **base_settings(kafka),
            "client.id": client_id,
            "acks": "all",
            "enable.idempotence": True,   # broker retries cannot duplicate or reorder
            "linger.ms": linger_ms,
            "message.timeout.ms": kafka.request_timeout_ms,  # delivery timeout, retries included
            "request.timeout.ms": kafka.request_timeout_ms,
            "error_cb": self._on_error,
        }
        self._reports: list[tuple[asyncio.AbstractEventLoop, _Report]] = []
        self._swap = threading.Lock()      # produce() never lands on a producer being retired
        self._producer = Producer(self._settings)
        self._rebuild_why: str | None = None
        self._last_rebuild = -REBUILD_MIN_INTERVAL_S
        self._failure: str | None = None  # why the last publish failed; cleared by a success
        self._last_probe = 0.0
        self.rebuilds = 0
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name=f"memq-notify-{client_id}", daemon=True)
        self._poller.start()

    def health(self) -> str | None:
        """None while publishing works; otherwise why it does not (the last failure)."""
        if self._rebuild_why is not None:
            return f"notification producer is being replaced: {self._rebuild_why}"
        if self._failure is not None:
            return f"publishing notifications to Kafka fails: {self._failure}"
        return None

    async def publish(self, kafka_topic: str, n: Notification) -> tuple[int, int]:
        """Publish `n`; NotifyError naming the topic if Kafka does not take it in time."""
        if self._stop.is_set():
            raise NotifyError(f"publisher is closed; cannot publish to {kafka_topic!r}")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[int, int]] = loop.create_future()

        def on_delivery(err: KafkaError | None, msg: Message) -> None:  # poll thread
            self._record(err)
            self._reports.append((loop, (future, kafka_topic, err, msg.partition(), msg.offset())))

        payload = n.to_bytes()
        # Keyed by the (unique) object key, so the hash partitioner spreads batches over the
        # read partitions; unkeyed, librdkafka's sticky partitioner puts a burst on one
        # partition and a consumer group loses its parallelism.
        key = n.key.encode()
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                with self._swap:
                    self._producer.produce(kafka_topic, payload, key=key, on_delivery=on_delivery)
                break
            except BufferError:  # librdkafka's queue is full: wait for deliveries to drain it
                if time.monotonic() > deadline:
                    raise NotifyError(f"cannot publish to {kafka_topic!r}: producer queue full "
                                      f"for {self._timeout_s} s") from None
                await asyncio.sleep(QUEUE_FULL_BACKOFF_S)
            except KafkaException as e:   # not queued: nothing was sent, so it is safe to fail
                err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
                if err is not None and needs_new_producer(err):
                    self._request_rebuild(err.str())
                raise NotifyError(f"cannot publish to {kafka_topic!r}: {e}") from None
        try:
            # librdkafka reports every message within message.timeout.ms; this is a backstop
            # (a timeout context, not wait_for: no wrapper per notification, ~1000/s with many topics)
            async with asyncio.timeout(self._timeout_s + 5):
                return await future
        except TimeoutError:
            raise NotifyError(f"no delivery report for {kafka_topic!r} after {self._timeout_s + 5} s") from None

    def close(self, timeout_s: float = 10) -> None:
        """Deliver what is queued within `timeout_s`; fail the rest with NotifyError."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._poller.join()
        left = self._producer.flush(timeout_s)
        if left:
            log.warning("publisher closing with %d undelivered notifications", left)
            self._retire(self._producer)
        self._hand_over()

    # --- poll thread ---------------------------------------------------------------------

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(POLL_INTERVAL_S)
            if self._rebuild_why is not None and time.monotonic() - self._last_rebuild >= REBUILD_MIN_INTERVAL_S:
                self._rebuild()
            elif self._failure is not None and len(self._producer) == 0:
                self._probe()
            self._hand_over()

    def _record(self, err: KafkaError | None) -> None:
        if err is None:
            self._failure = None
            return
        self._failure = err.str()
        if needs_new_producer(err):
            self._request_rebuild(err.str())

    def _request_rebuild(self, why: str) -> None:
        if self._rebuild_why is None:
            log.error("notification producer fenced or failed for good (%s): replacing it", why)
            self._rebuild_why = why

    def _rebuild(self) -> None:
        """Swap in a fresh producer; fail whatever the old one still holds (it cannot deliver)."""
        with self._swap:
            old, self._producer = self._producer, Producer(self._settings)
            why, self._rebuild_why = self._rebuild_why, None
        self._last_rebuild = time.monotonic()
        self.rebuilds += 1
        self._retire(old)
        log.warning("notification producer replaced (%d so far) after: %s", self.rebuilds, why)

    @staticmethod
    def _retire(producer: Producer) -> None:
        """Fail every message still queued or in flight on `producer` (their reports say purged)."""
        producer.purge()
        producer.flush(0)

    def _probe(self) -> None:
        """Idle after a failure: a metadata answer from Kafka means publishing can work again."""
        now = time.monotonic()
        if now - self._last_probe < PROBE_INTERVAL_S:
            return
        self._last_probe = now
        try:
            self._producer.list_topics(timeout=min(self._timeout_s, PROBE_INTERVAL_S * 5))
        except KafkaException:
            return
        if len(self._producer) == 0:
            self._failure = None

    def _hand_over(self) -> None:
        """Give the delivery reports gathered by the last poll to their event loops."""
        if not self._reports:
            return
        reports, self._reports = self._reports, []
        by_loop: dict[asyncio.AbstractEventLoop, list[_Report]] = defaultdict(list)
        for loop, report in reports:
            by_loop[loop].append(report)
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, batch)
            except RuntimeError:  # the loop is closed: nobody waits for these any more
                pass

    def _on_error(self, err: KafkaError) -> None:
        if needs_new_producer(err):
            self._request_rebuild(err.str())
        else:
            log.warning("notification producer: %s", err.str())


def _settle(batch: list[_Report]) -> None:
    """On the event loop: resolve the futures of a round of delivery reports."""
    for future, topic, err, partition, offset in batch:
        if future.done():  # cancelled or timed out meanwhile
            continue
        if err is None and partition is not None and offset is not None:
            future.set_result((partition, offset))
        elif err is None:
            future.set_exception(NotifyError(f"Kafka acked a publish to {topic!r} without its offset"))
        else:
            future.set_exception(NotifyError(f"publishing to Kafka topic {topic!r} failed: {err.str()}"))
