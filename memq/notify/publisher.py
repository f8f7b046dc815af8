"""Publish notifications to Kafka and await their delivery from asyncio.

One confluent-kafka Producer (acks=all, idempotent) per publisher. A poll thread serves
librdkafka's delivery reports and hands each round of them to the event loop with a single
`call_soon_threadsafe`, so thousands of in-flight publishes cost one loop wake-up per round.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from memq.config import KafkaConfig
from memq.errors import NotifyError
from memq.format import Notification
from memq.notify._kafka import base_settings, timeout_s

log = logging.getLogger("memq.notify")

POLL_INTERVAL_S = 0.05
QUEUE_FULL_BACKOFF_S = 0.005

# (future, topic, error, partition, offset) of one delivery report
_Report = tuple[asyncio.Future[tuple[int, int]], str, KafkaError | None, int, int]


class NotificationPublisher:
    """`await publish(topic, notification)` -> (partition, offset) once Kafka has it (acks=all)."""

    def __init__(self, kafka: KafkaConfig, *, client_id: str, linger_ms: int = 2) -> None:
        self._timeout_s = timeout_s(kafka)
        self._fatal: KafkaError | None = None
        self._reports: list[tuple[asyncio.AbstractEventLoop, _Report]] = []
        self._producer = Producer({
            **base_settings(kafka),
            "client.id": client_id,
            "acks": "all",
            "enable.idempotence": True,   # broker retries cannot duplicate or reorder
            "linger.ms": linger_ms,
            "message.timeout.ms": kafka.request_timeout_ms,  # delivery timeout, retries included
            "request.timeout.ms": kafka.request_timeout_ms,
            "error_cb": self._on_error,
        })
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name=f"memq-notify-{client_id}", daemon=True)
        self._poller.start()

    async def publish(self, kafka_topic: str, n: Notification) -> tuple[int, int]:
        """Publish `n`; NotifyError naming the topic if Kafka does not take it in time."""
        if self._stop.is_set():
            raise NotifyError(f"publisher is closed; cannot publish to {kafka_topic!r}")
        if self._fatal is not None:
            raise NotifyError(f"cannot publish to {kafka_topic!r}: producer failed: {self._fatal.str()}")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[int, int]] = loop.create_future()

        def on_delivery(err: KafkaError | None, msg: Message) -> None:  # poll thread
            self._reports.append((loop, (future, kafka_topic, err, msg.partition(), msg.offset())))

        payload = n.to_bytes()
        # Keyed by the (unique) object key, so the hash partitioner spreads batches over the
        # read partitions; unkeyed, librdkafka's sticky partitioner puts a burst on one
        # partition and a consumer group loses its parallelism.
        key = n.key.encode()
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                self._producer.produce(kafka_topic, payload, key=key, on_delivery=on_delivery)
                break
            except BufferError:  # librdkafka's queue is full: wait for deliveries to drain it
                if time.monotonic() > deadline:
                    raise NotifyError(f"cannot publish to {kafka_topic!r}: producer queue full "
                                      f"for {self._timeout_s} s") from None
                await asyncio.sleep(QUEUE_FULL_BACKOFF_S)
            except KafkaException as e:
                raise NotifyError(f"cannot publish to {kafka_topic!r}: {e}") from None
        try:
            # librdkafka reports every message within message.timeout.ms; this is a backstop.
            return await asyncio.wait_for(future, self._timeout_s + 5)
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
            self._producer.purge()
            self._producer.flush(0)
        self._hand_over()

    # --- poll thread ---------------------------------------------------------------------

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(POLL_INTERVAL_S)
            self._hand_over()

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
        if err.fatal():
            self._fatal = err
            log.error("notification producer failed for good: %s", err.str())
        else:
            log.warning("notification producer: %s", err.str())


def _settle(batch: list[_Report]) -> None:
    """On the event loop: resolve the futures of a round of delivery reports."""
    for future, topic, err, partition, offset in batch:
        if future.done():  # cancelled or timed out meanwhile
            continue
        if err is None:
            future.set_result((partition, offset))
        else:
            future.set_exception(NotifyError(f"publishing to Kafka topic {topic!r} failed: {err.str()}"))
