"""The Kafka door's DeleteRecords (family "records"): moving a partition's log start.

Kafka offsets of memq records are a pure function of where a record is (`kafka_api.offsets`),
and the notification Kafka cannot cut inside a part (nor at all: tansu has no DeleteRecords),
so the log start lives in ZooKeeper (`Registry.move_log_starts`: a Kafka offset per partition,
only ever forward, deleted with the topic). Every broker watches it and carries it in its
cluster metadata, so every door reads the same start, as the partition log model answers it
(`memq.log.model`, fed by `BrokerCore.logs`): Kafka's Fetch answers OFFSET_OUT_OF_RANGE before it
and ListOffsets(earliest) answers it, memq's Consumer counts what lies before it as expired.

As Kafka: -1 is the high watermark, an offset past the high watermark (or another negative
one) is OFFSET_OUT_OF_RANGE, an offset before the current start changes nothing, and each
partition answers its log start after the call as `low_watermark`. Kafka's ACL is DELETE on
the topic: memq's `admin` there with security on. Objects below the start stay in storage
until retention takes them (the janitor does not collect by log start).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin import DeleteRecordsRequest, DeleteRecordsResponse

from memq.errors import MemqError
from memq.kafka_api.messages import decode_request, encode_response
from memq.kafka_api.protocol import ApiKey, ErrorCode, Reader, RequestHeader
from memq.log.model import PartitionLog, moved_start, stored_start
from memq.security.acl import Operation

from ..seam import BrokerCore
from .kafka_family import Conn, Family, Response

log = logging.getLogger(__name__)

#: Kafka's low watermark in a partition's refusal.
NO_WATERMARK = -1
#: How long, at most, the answer waits for this broker's metadata to show the new start, so
#: that its own readers' next request sees it (other brokers follow their ZooKeeper watch).
VISIBLE_WAIT_S = 5.0
VISIBLE_POLL_S = 0.02

_TopicResult = DeleteRecordsResponse.DeleteRecordsTopicResult
_PartitionResult = _TopicResult.DeleteRecordsPartitionResult


@dataclass(frozen=True, slots=True)
class Deleted:
    """One partition's answer: its log start after the call, or why not."""

    partition: int
    low_watermark: int = NO_WATERMARK
    error: ErrorCode = ErrorCode.NONE


async def delete_records(core: BrokerCore, principal: str | None, topic: str, asked: list[tuple[int, int]],
                         peer: object) -> list[Deleted]:
    """Move `topic`'s log starts to the (partition, offset) pairs `asked`; one answer each."""
    t = core.metadata().topics.get(topic)
    admin = core.cluster_admin
    refused = _refusal(core, principal, topic)
    if refused is not None or t is None or admin is None:
        why = refused or (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if t is None else ErrorCode.POLICY_VIOLATION)
        log.info("Kafka DeleteRecords of %s from %s: %s%s", topic, peer, why.name,
                 " (no ZooKeeper: memq keeps log starts in its registry)" if why is ErrorCode.POLICY_VIOLATION else "")
        return [Deleted(p, error=why) for p, _ in asked]
    answers: dict[int, Deleted] = {}
    wanted: dict[int, int] = {}
    logs: dict[int, PartitionLog] = {}
    for p, offset in asked:
        if not 0 <= p < t.read_partitions:
            answers[p] = Deleted(p, error=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            continue
        try:
            plog = await core.logs.current(t, p, peer)
        except MemqError as e:   # the notification Kafka failing: retriable
            log.warning("Kafka DeleteRecords of %s[%d] from %s: %s", topic, p, peer, e)
            answers[p] = Deleted(p, error=ErrorCode.KAFKA_STORAGE_ERROR)
            continue
        target = plog.deletion_point(offset)
        if target is None:
            log.info("Kafka DeleteRecords of %s[%d] to %d from %s: out of range (log start %d, high watermark %d)",
                     topic, p, offset, peer, plog.log_start, plog.high_watermark)
            answers[p] = Deleted(p, error=ErrorCode.OFFSET_OUT_OF_RANGE)
            continue
        wanted[p], logs[p] = stored_start(plog.scheme, target), plog
    if wanted:
        try:
            moved = await asyncio.to_thread(admin.registry.move_log_starts, topic, wanted)
        except MemqError as e:   # ZooKeeper failing: retriable
            log.warning("Kafka DeleteRecords of %s from %s: %s", topic, peer, e)
            answers |= {p: Deleted(p, error=ErrorCode.KAFKA_STORAGE_ERROR) for p in wanted}
        else:
            log.info("Kafka DeleteRecords of %s from %s: log starts %s", topic, peer,
                     {p: moved[p] for p in wanted})
            answers |= {p: Deleted(p, dataclasses.replace(
                logs[p], moved=moved_start(moved.items(), p, logs[p].scheme)).log_start) for p in wanted}
            await _visible(core, topic, {p: moved[p] for p in wanted})
    return [answers[p] for p, _ in asked]


def _refusal(core: BrokerCore, principal: str | None, topic: str) -> ErrorCode | None:
    if core.guard.enabled and not core.guard.may(principal, Operation.ADMIN, topic):
        core.guard.count_denial(Operation.ADMIN)
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED
    return None


async def _visible(core: BrokerCore, topic: str, starts: dict[int, int]) -> None:
    """Until this broker's metadata carries `starts` (its ZooKeeper watch fired), at most
    VISIBLE_WAIT_S: the starts are stored either way."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + VISIBLE_WAIT_S
    while loop.time() < deadline:
        t = core.metadata().topics.get(topic)
        if t is None or all(moved_start(t.log_start, p) >= o for p, o in starts.items()):
            return
        await asyncio.sleep(VISIBLE_POLL_S)


async def _answer(conn: Conn, h: RequestHeader, req: Any) -> bytes:
    topics = []
    for t in req.topics:
        done = await delete_records(conn.core, conn.principal, t.name,
                                    [(p.partition_index, p.offset) for p in t.partitions], conn.peer)
        topics.append(_TopicResult(name=t.name, partitions=[
            _PartitionResult(partition_index=d.partition, low_watermark=d.low_watermark, error_code=int(d.error))
            for d in done]))
    return encode_response(h, DeleteRecordsResponse(throttle_time_ms=0, topics=topics))


async def serve(conn: Conn, h: RequestHeader, body: Reader) -> Response:
    """Answered in turn; the connection reads on while ZooKeeper and Kafka answer."""
    return asyncio.ensure_future(_answer(conn, h, decode_request(DeleteRecordsRequest, h, body)))


#: v0-2: the versions clients send (v2 is flexible).
FAMILY = Family("records", {ApiKey.DELETE_RECORDS: (0, 2)}, "admin on the topic (Kafka's DELETE)", serve)
