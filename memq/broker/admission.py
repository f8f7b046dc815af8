"""The one admission path of every produce door (memq's WebSocket, Kafka's Produce).

A door decodes its own framing, then asks `Admission.admit` whether a principal may write
Messages of a given size to a topic here. The checks run in one order for every door:
principal's ACL -> the topic is hosted here -> the Message size -> any extra `Check` the broker
was built with -> the read partition the request names: one the topic has, the one its records
are read from (a Kafka producer's, or memq's Producer's key placement); a request naming none
goes where the topic's processor puts it, except on a compacted topic of several partitions,
where a key's records must all land in one (the producer places them by key). A door then verifies its format
(memq's header CRC, Kafka's RecordBatch CRC), charges the bytes it accepted to the quotas
(`charge`) and appends through the `Ticket`: the only way a door reaches a topic's processor. A
check added here applies to every door.

A topic with schema checks (`memq.schema.check.checked`: `value_schema_validation` or
`key_schema_validation`) is the one case a door decodes records: it passes them to
`check_records` before appending, and refuses the request (`schema_validation_action = reject`)
or stores it counted (`warn`). Every other topic's records are never decoded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prometheus_client import Histogram

from memq.clock import Clock
from memq.config import TopicConfig
from memq.format import LogMessage, MessageHeader, Notification
from memq.format.wire import Ack, AckCode, AckLevel
from memq.security.acl import Operation
from memq.schema.check import Checker, Failure, Fields, dlq_topic
from memq.security.quota import ANONYMOUS, Throttler

from .batch import Reply
from .guard import Guard
from .metrics import BrokerMetrics
from .processor import TopicProcessor

log = logging.getLogger(__name__)
#: How long a dead-letter topic's ack may take (acks=all, sealed at once) before the write is refused.
DLQ_ACK_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a write is not admitted: a memq ack code (doors map it to their own), the reason,
    and the brokers that host the topic when it moved."""

    code: AckCode
    why: str
    brokers: tuple[str, ...] = ()
    no_partition: bool = False   # the topic has no such read partition (Kafka: UNKNOWN_TOPIC_OR_PARTITION)


@dataclass(frozen=True, slots=True)
class Entry:
    """What a door asks to admit: `largest` is the size of the largest Message it would append."""

    principal: str | None
    topic: str
    largest: int


#: An extra admission rule: a Refusal, or None to let the write through.
Check = Callable[[Entry, TopicConfig], "Refusal | None"]


class Ticket:
    """An admitted write to one read partition of a hosted topic: what a door may do with its processor."""

    __slots__ = ("_processor", "partition")

    def __init__(self, processor: TopicProcessor, partition: int) -> None:
        self._processor = processor
        #: The read partition its Messages go to (-1: the processor's pick for a batch, Kafka's for
        #: a transaction's object)
        self.partition = partition

    @property
    def config(self) -> TopicConfig:
        return self._processor.config

    @property
    def ack_stage(self) -> Histogram:
        """Where a door observes how long this topic's acks waited to be written."""
        return self._processor.ack_stage

    def can_append_now(self) -> bool:
        """An append now would not wait for a batch slot."""
        return self._processor.can_append_now()

    async def append(self, message: memoryview, header: MessageHeader, request_id: int, level: AckLevel,
                     reply: Reply, *, seal: bool = False) -> None:
        """`TopicProcessor.append`: `reply` gets the Message's ack exactly once."""
        await self._processor.append(message, header, request_id, level, reply, seal=seal, partition=self.partition)

    async def store_apart(self, messages: list[memoryview], headers: list[MessageHeader]) -> tuple[str, Notification]:
        """A transaction's Messages stored as their own object, not published: (notification topic,
        notification) for its pending entry (`TopicProcessor.store_apart`)."""
        return await self._processor.store_apart(messages, headers)

    def seal_if_at_least(self, nbytes: int) -> bool:
        """Seal the topic's filling batches (every partition's) if they hold `nbytes` or more; True if it did."""
        return self._processor.seal_if_at_least(nbytes)


class Admission:
    """The checks every produce door runs, in one order, and the quota charge after them."""

    def __init__(self, *, guard: Guard, quotas: Throttler, metrics: BrokerMetrics, clock: Clock,
                 processor: Callable[[str], TopicProcessor | None],
                 where_is: Callable[[str], tuple[AckCode, str, tuple[str, ...]]],
                 checks: Sequence[Check] = ()) -> None:
        self._guard = guard
        self._quotas = quotas
        self._metrics = metrics
        self._clock = clock
        self._processor = processor
        self._where_is = where_is
        self._checks = tuple(checks)
        self.payloads: Checker | None = None   # the schema checks, once the broker's registry is made

    async def dead_letter(self, principal: str | None, topic: str, message: memoryview, header: MessageHeader,
                          request_id: int, timeout_s: float = DLQ_ACK_TIMEOUT_S) -> str | None:
        """Store one Message of dead letters in `topic`'s dead-letter topic (admitted like any
        write, acks=all, sealed at once): None once stored, else why not."""
        target = self.admit(principal, dlq_topic(topic), len(message))
        if isinstance(target, Refusal):
            return target.why
        fut: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        await target.append(message, header, request_id, AckLevel.ALL,
                            lambda a: None if fut.done() else fut.set_result(a), seal=True)
        try:
            ack = await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            return f"not stored within {timeout_s:g}s"
        return None if ack.ok else f"{ack.code}: {ack.error}"

    async def check_records(self, ticket: Ticket, records: Sequence[LogMessage] | Fields) -> list[Failure]:
        """The records failing the topic's schema checks (call only for a topic that asks:
        `memq.schema.check.checked`), counted by the action the topic takes. A door that can
        read its records' keys and values without building LogMessages passes `Fields`."""
        if self.payloads is None:
            raise RuntimeError("schema checks before the broker started")
        cfg = ticket.config
        failures = await asyncio.to_thread(self.payloads.check, cfg.name, cfg, records)
        if failures:
            self._metrics.schema_invalid.labels(cfg.name, cfg.schema_validation_action).inc(len(failures))
            log.info("topic %s: %d of %d records fail the schema checks (%s), first: %s", cfg.name, len(failures),
                     len(records), cfg.schema_validation_action, failures[0])
        return failures

    def admit(self, principal: str | None, topic: str, largest: int, partition: int = -1) -> Ticket | Refusal:
        """ACL, hosted here, size, extra checks, `partition` (-1: none named): a Ticket to append,
        or why not."""
        if not self._guard.allowed(principal, Operation.PRODUCE, topic):
            return Refusal(AckCode.DENIED, f"principal {principal} may not {Operation.PRODUCE} to topic {topic}")
        proc = self._processor(topic)
        if proc is None:
            return Refusal(*self._where_is(topic))
        limit = proc.config.max_message_bytes
        if largest > limit:
            return Refusal(AckCode.TOO_LARGE, f"Message of {largest} bytes exceeds topic {topic}'s "
                                              f"max_message_bytes={limit}")
        if self._checks:
            entry = Entry(principal, topic, largest)
            for check in self._checks:
                refusal = check(entry, proc.config)
                if refusal is not None:
                    return refusal
        n = proc.config.read_partitions
        if partition >= n or partition < -1:
            return Refusal(AckCode.PROTOCOL, f"topic {topic} has {n} read partitions (0..{n - 1}), not {partition}",
                           no_partition=True)
        if partition < 0 and n > 1 and proc.config.compacted:
            return Refusal(AckCode.PROTOCOL, f"topic {topic} is compacted over {n} read partitions: a write "
                                             f"names its partition (0..{n - 1}, placed by key)")
        return Ticket(proc, partition)

    def charge(self, principal: str | None, charges: Iterable[tuple[str, int]]) -> float:
        """Charge each (topic, bytes accepted) to the quotas; the seconds the door must stop
        reading its connection (the longest owed), counted once per request."""
        who = principal or ANONYMOUS
        now = self._clock.monotonic()
        delay, worst = 0.0, ""
        for topic, nbytes in charges:
            d = self._quotas.charge(who, topic, nbytes, now)
            if d > delay:
                delay, worst = d, topic
        if delay:
            self._metrics.throttle_seconds.labels(who, worst).inc(delay)
        return delay
