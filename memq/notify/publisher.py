"""Publish notifications to Kafka and await their delivery from asyncio.

A few confluent-kafka Producers (acks=all, idempotent), each Kafka topic always through the
same one. Each has a poll thread that serves librdkafka's delivery reports and hands each round
of them to the event loop with a single `call_soon_threadsafe`, so thousands of in-flight
publishes cost one loop wake-up per round.

An idempotent producer can be fenced for good: after a Kafka stall longer than its request
timeout, librdkafka bumps its epoch and the Kafka broker answers every later publish with
PRODUCER_FENCED. Its poll thread then replaces it with a fresh one (new producer
id), failing what the old one still held; each of those batches fails once and its producer
retries it, so no batch is announced twice by memq. `health()` says why publishing fails
until a publish succeeds again, or, when idle, until Kafka answers a metadata request.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import zlib
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from memq.config import KafkaConfig
from memq.errors import ConfigError, NotifyError
from memq.format import Notification
from memq.notify._kafka import base_settings, timeout_s

log = logging.getLogger("memq.notify")

POLL_INTERVAL_S = 0.05
QUEUE_FULL_BACKOFF_S = 0.005
REBUILD_MIN_INTERVAL_S = 1.0   # a fresh producer fenced again at once is not rebuilt in a loop
PROBE_INTERVAL_S = 1.0         # idle and failing: ask Kafka for metadata this often
IDLE_PROBE_S = 5.0             # idle and healthy: ask Kafka for metadata this often (see _idle_probes)
IDLE_PROBE_TIMEOUT_S = 10.0    # ... and call it failing when no answer comes within this

# Errors after which this producer id can never publish again: only a new producer helps.
_FENCED = frozenset({KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError.UNKNOWN_PRODUCER_ID,
                     KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, KafkaError.INVALID_PRODUCER_ID_MAPPING,
                     KafkaError._FATAL})

class _Round:
    """The notifications of one `publish_many`, settled on their event loop as reports come."""

    __slots__ = ("loop", "topics", "results", "left", "done")

    def __init__(self, loop: asyncio.AbstractEventLoop, topics: list[str]) -> None:
        self.loop = loop
        self.topics = topics
        self.results: list[tuple[int, int] | NotifyError] = [_PENDING] * len(topics)
        self.left = len(topics)
        self.done: asyncio.Future[None] = loop.create_future()
        if not topics:
            self.done.set_result(None)

    def settle(self, i: int, err: KafkaError | None, partition: int | None, offset: int | None) -> None:
        topic = self.topics[i]
        if err is None and partition is not None and offset is not None:
            self._set(i, (partition, offset))
        elif err is None:
            self._set(i, NotifyError(f"Kafka acked a publish to {topic!r} without its offset"))
        else:
            self._set(i, NotifyError(f"publishing to Kafka topic {topic!r} failed: {err.str()}"))

    def fail(self, i: int, error: NotifyError) -> None:
        self._set(i, error)

    def expire(self, why: str) -> None:
        """The backstop timed out: every note without a report fails."""
        for i, r in enumerate(self.results):
            if r is _PENDING:
                self._set(i, NotifyError(f"{why} for {self.topics[i]!r}"))

    def _set(self, i: int, result: tuple[int, int] | NotifyError) -> None:
        if self.results[i] is not _PENDING:   # reported after the backstop expired it
            return
        self.results[i] = result
        self.left -= 1
        if self.left == 0 and not self.done.done():
            self.done.set_result(None)


_PENDING = NotifyError("no delivery report yet")

# (round, index in the round, error, partition, offset) of one delivery report
_Report = tuple[_Round, int, KafkaError | None, int | None, int | None]


def needs_new_producer(err: KafkaError) -> bool:
    """True for an error that fences the producer for good (fatal, or a stale id/epoch)."""
    return err.fatal() or err.code() in _FENCED


class NotificationPublisher:
    """`await publish_many([(kafka topic, notification), ...])` -> each one's (partition, offset)
    once Kafka has it (acks=all), through `producers` librdkafka producers.

    A Kafka topic always goes through the same producer (by a hash of its name), so each
    partition keeps one idempotent sequence and notifications stay in order. Several producers
    because librdkafka's sender walks every partition it knows each time it wakes, and a message
    to an idle partition wakes it: with 1000 topics of 3 partitions on one producer, 1000
    notifications a second cost its thread ~0.26 of a core, on 8 producers ~0.08 in all (ad hoc,
    tansu, bursts of 250 every 250 ms). One by default: librdkafka sends one partition per
    request, and the dev Kafka (tansu) answered 4 producers' requests ~10x slower than one's
    (their batches conflict on its one metadata object).
    """

    def __init__(self, kafka: KafkaConfig, *, client_id: str, linger_ms: int = 2, producers: int = 1) -> None:
        if producers < 1:
            raise ConfigError(f"broker.notify_producers = {producers}: a publisher needs at least one producer")
        self._timeout_s = timeout_s(kafka)
        self._shards = [_Shard(kafka, client_id if producers == 1 else f"{client_id}-{i}", linger_ms)
                        for i in range(producers)]
        self._closed = False

    @property
    def rebuilds(self) -> int:
        """How many times a fenced producer was replaced."""
        return sum(s.rebuilds for s in self._shards)

    def health(self) -> str | None:
        """None while publishing works; otherwise why it does not (a producer's last failure)."""
        return next((h for s in self._shards if (h := s.health()) is not None), None)

    def _shard(self, kafka_topic: str) -> _Shard:
        return self._shards[zlib.crc32(kafka_topic.encode()) % len(self._shards)]

    async def publish(self, kafka_topic: str, n: Notification) -> tuple[int, int]:
        """Publish `n`; NotifyError naming the topic if Kafka does not take it in time."""
        result = (await self.publish_many([(kafka_topic, n)]))[0]
        if isinstance(result, NotifyError):
            raise result
        return result

    async def publish_many(self, notes: Sequence[tuple[str, Notification]],
                           partitions: Sequence[int] | None = None) -> list[tuple[int, int] | NotifyError]:
        """Publish every (Kafka topic, notification) at once: each result is its (partition,
        offset) once Kafka has it, or the NotifyError saying why not. `partitions`: each note's
        Kafka partition (where the producer placed the records), -1 for the partitioner's
        choice; None: every note by the partitioner.

        One object's parts are handed to librdkafka in one burst under one future and one
        timeout: per-part tasks and timers were a third of a broker's Python with 1000 topics,
        and parts queued over many loop steps woke librdkafka's sender once per few parts
        (ad hoc, 1000 parts/s over 1000 topics: 0.11 of a core in bursts, 0.17 spread out).
        """
        if self._closed:
            return [NotifyError(f"publisher is closed; cannot publish to {t!r}") for t, _ in notes]
        round_ = _Round(asyncio.get_running_loop(), [kafka_topic for kafka_topic, _ in notes])
        by_shard: dict[_Shard, list[int]] = defaultdict(list)
        for i, (kafka_topic, _) in enumerate(notes):
            by_shard[self._shard(kafka_topic)].append(i)
        deadline = time.monotonic() + self._timeout_s
        for shard, indices in by_shard.items():
            done = 0
            while done < len(indices):
                done = shard.produce(round_, notes, indices, done, partitions)
                if done < len(indices):   # librdkafka's queue is full: wait for deliveries to drain it
                    if time.monotonic() > deadline:
                        for i in indices[done:]:
                            round_.fail(i, NotifyError(f"cannot publish to {notes[i][0]!r}: producer queue "
                                                       f"full for {self._timeout_s} s"))
                        break
                    await asyncio.sleep(QUEUE_FULL_BACKOFF_S)
        try:
            # librdkafka reports every message within message.timeout.ms; this is a backstop
            async with asyncio.timeout(self._timeout_s + 5):
                await round_.done
        except TimeoutError:
            round_.expire(f"no delivery report after {self._timeout_s + 5} s")
        return round_.results

    def close(self, timeout_s: float = 10) -> None:
        """Deliver what is queued within `timeout_s`; fail the rest with NotifyError."""
        self._closed = True
        deadline = time.monotonic() + timeout_s
        for shard in self._shards:
            shard.close(max(0.0, deadline - time.monotonic()))


class _Shard:
    """One librdkafka producer of a publisher: its poll thread, its health and its replacement."""

    def __init__(self, kafka: KafkaConfig, client_id: str, linger_ms: int) -> None:
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
        self._reports: list[_Report] = []
        self._swap = threading.Lock()      # produce() never lands on a producer being retired
        self._producer = Producer(self._settings)
        self._rebuild_why: str | None = None
        self._last_rebuild = -REBUILD_MIN_INTERVAL_S
        self._failure: str | None = None  # why the last publish failed; cleared by a success
        self._last_probe = 0.0
        self._last_ok = time.monotonic()  # the last delivery, or idle metadata answer, from Kafka
        self.rebuilds = 0
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name=f"memq-notify-{client_id}", daemon=True)
        self._poller.start()
        threading.Thread(target=self._idle_probes, name=f"memq-notify-probe-{client_id}", daemon=True).start()

    def health(self) -> str | None:
        if self._rebuild_why is not None:
            return f"notification producer is being replaced: {self._rebuild_why}"
        if self._failure is not None:
            return f"publishing notifications to Kafka fails: {self._failure}"
        return None

    def produce(self, round_: _Round, notes: Sequence[tuple[str, Notification]], indices: list[int],
                start: int, partitions: Sequence[int] | None = None) -> int:
        """Queue the notes at indices[start:] on librdkafka (to `partitions[i]` when given and >= 0);
        returns how many of `indices` are queued or failed (len(indices) unless the queue filled
        up). A note Kafka refuses at once fails alone."""
        with self._swap:
            producer = self._producer
            for pos in range(start, len(indices)):
                i = indices[pos]
                kafka_topic, n = notes[i]

                def on_delivery(err: KafkaError | None, msg: Message, i: int = i) -> None:  # poll thread
                    self._record(err)
                    self._reports.append((round_, i, err, msg.partition(), msg.offset()))

                # Keyed by the (unique) object key, so the hash partitioner spreads batches over
                # the read partitions; unkeyed, librdkafka's sticky partitioner puts a burst on
                # one partition and a consumer group loses its parallelism.
                try:
                    if partitions is None or partitions[i] < 0:
                        producer.produce(kafka_topic, n.to_bytes(), key=n.key.encode(), on_delivery=on_delivery)
                    else:
                        producer.produce(kafka_topic, n.to_bytes(), key=n.key.encode(), partition=partitions[i],
                                         on_delivery=on_delivery)
                except BufferError:
                    return pos
                except KafkaException as e:   # not queued: nothing was sent, so it is safe to fail
                    err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
                    if err is not None and needs_new_producer(err):
                        self._request_rebuild(err.str())
                    round_.fail(i, NotifyError(f"cannot publish to {kafka_topic!r}: {e}"))
        return len(indices)

    def close(self, timeout_s: float) -> None:
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

    def _idle_probes(self) -> None:
        """While nothing is published, ask Kafka for metadata now and then: an idle broker whose
        Kafka does not answer reports it (`health`) like one whose publishes fail. Otherwise a
        governor, seeing the publishing brokers fail during a Kafka outage and an idle one
        "healthy", moves every topic onto the idle one, and the resends of Messages the drained
        brokers still hold are stored a second time there. Its own thread: a blocked metadata
        call must not hold up the delivery reports the poll thread serves."""
        while not self._stop.wait(IDLE_PROBE_S):
            now = time.monotonic()
            if (self._failure is not None or self._rebuild_why is not None or len(self._producer)
                    or now - self._last_ok < IDLE_PROBE_S):
                continue
            try:
                self._producer.list_topics(timeout=min(self._timeout_s, IDLE_PROBE_TIMEOUT_S))
            except KafkaException as e:
                if self._failure is None and not len(self._producer):
                    self._failure = (f"Kafka did not answer a metadata request within "
                                     f"{min(self._timeout_s, IDLE_PROBE_TIMEOUT_S):g}s ({e})")
                continue
            self._last_ok = time.monotonic()

    def _record(self, err: KafkaError | None) -> None:
        if err is None:
            self._failure = None
            self._last_ok = time.monotonic()
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
        for report in reports:
            by_loop[report[0].loop].append(report)
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
    """On the event loop: settle a round of delivery reports."""
    for round_, i, err, partition, offset in batch:
        round_.settle(i, err, partition, offset)
