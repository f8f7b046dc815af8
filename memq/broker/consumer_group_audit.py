"""Kafka client groups in memq's audit: what a group commits is what it consumed.

A memq Consumer reports each Message it hands over; a Kafka client reports nothing, and its
Fetch names no group. Its commits do: an OffsetCommit of offset C on a partition, after the
group's previous commit P there, says it consumed the records in [P, C). So the broker
relaying the commit reports, for the group, each Message a Kafka reader gets
(`Reads.delivered`: retried copies left out, as the reader saw them) whose last record lies
in [P, C), as a memq Consumer reports a Message when it has handed over its last record.
Without a previous commit (P = -1) the group is counted from the log start, where
`auto.offset.reset = earliest` starts it. At most `MAX_NOTES` parts are walked per commit.
"""

from __future__ import annotations

import logging
from typing import Protocol

from memq.clock import Clock, SystemClock
from memq.errors import MemqError
from memq.format.metadata import TopicMetadata

from .logs import Logs
from .reads import Reads

log = logging.getLogger(__name__)

#: Parts walked for one commit at most (a first commit far from the log start counts the last ones).
MAX_NOTES = 4096


class ConsumedSink(Protocol):
    """The consumer half of the audit sink (`memq.audit.emitter.AuditEmitter`)."""

    def consumed(self, *, topic: str, group: str, producer_id: int, epoch: int, sequence: int,
                 count: int, digest: int, created_ms: int, consumed_ms: int) -> None: ...


class GroupAudit:
    def __init__(self, reads: Reads, logs: Logs, sink: ConsumedSink, clock: Clock | None = None) -> None:
        self._reads = reads
        self._logs = logs
        self._sink = sink
        self._clock = clock or SystemClock()

    async def committed(self, group: str, topic: TopicMetadata, partition: int, before: int, after: int) -> int:
        """Report the Messages whose last record is in [before, after) as consumed by `group`
        (`before` < 0: from the log start); how many. Never raises: the commit stands anyway."""
        if after <= max(before, 0):
            return 0
        try:
            return await self._report(group, topic, partition, before, after)
        except MemqError as e:
            log.warning("audit of Kafka group %r's commit of %s[%d] at %d: %s", group, topic.name, partition, after, e)
            return 0

    async def _report(self, group: str, topic: TopicMetadata, partition: int, before: int, after: int) -> int:
        scheme = (await self._logs.started(topic, partition)).scheme
        notification_topic = topic.notification_topic
        last_note, last_index = scheme.position_of(after)
        end = last_note + (1 if last_index else 0)
        start = max(scheme.position_of(before)[0] if before >= 0 else 0, end - MAX_NOTES)
        now_ms = int(self._clock.time() * 1000)
        reported = 0
        for n in await self._reads.notes_between(notification_topic, partition, start, end):
            for first, m in await self._reads.delivered(notification_topic, partition, n):
                if m.records <= 0:
                    continue
                last = scheme.offset_of(n.offset, first + m.records - 1)
                if max(before, 0) <= last < after:
                    self._sink.consumed(topic=topic.name, group=group, producer_id=m.id[0], epoch=m.id[1],
                                        sequence=m.id[2], count=m.records, digest=m.digest,
                                        created_ms=m.created_ms, consumed_ms=now_ms)
                    reported += 1
        return reported
