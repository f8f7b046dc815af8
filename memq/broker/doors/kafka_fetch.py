"""The Kafka door's read side: Fetch and ListOffsets over the core's read path (`BrokerCore.reads`).

Kafka partition p of a memq topic is its notification partition p. Its log start, high
watermark and what to read from an offset are the partition log's answers (`memq.log.model`,
fed by `BrokerCore.logs`): retention and DeleteRecords move the log start (a reader behind it, or
past the end, gets OFFSET_OUT_OF_RANGE and applies its `auto.offset.reset`; one at a start inside
a part reads its part from there), and a compacted topic's partition starts with its compacted
prefix: a reader at an offset in it gets the compacted parts' batches from the first survivor at
or after it (original offsets: gaps are normal), then the plain tail. Any broker serves any
topic's reads: the data is in S3.

A Fetch reads each partition from its offset as far as the byte limits allow; when nothing is there it waits
up to `max_wait_ms` for the next notification of any of its partitions (a long poll on the
tails' Kafka fetches, never a loop), then answers. Reading needs the `consume` ACL on the
topic with security on (TOPIC_AUTHORIZATION_FAILED otherwise, nothing read).

Both isolation levels read the same: only published notifications exist for a reader, and a
transaction's are published at its commit (`memq.broker.txn`), so read_committed holds by
construction: the last stable offset is the high watermark, ListOffsets(latest) answers it, no
aborted-transaction list and no control batches are needed. Unlike Kafka, read_uncommitted too
sees a transaction's records only once it commits.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from memq.errors import FormatError, MemqError, OffsetOutOfRangeError
from memq.format.metadata import ClusterMetadata, TopicMetadata
from memq.kafka_api.compacted import place_batch
from memq.kafka_api.mapping import node_id
from memq.kafka_api.protocol import (EARLIEST, LATEST, ApiKey, ErrorCode, FetchedPartition, FetchPartition,
                                     FetchRequest, ListedOffset, ListOffsetsRequest, Reader, RequestHeader, decode_fetch,
                                     decode_list_offsets, encode_fetch, encode_list_offsets)
from memq.kafka_api.records import place
from memq.log.model import PartitionLog
from memq.notify.consumer import NotificationRecord
from memq.security.acl import Operation

from ..seam import BrokerCore
from .kafka_family import Conn, Family, Response

log = logging.getLogger(__name__)

#: A Fetch never waits longer than this, whatever it asks (librdkafka's default is 500 ms).
MAX_WAIT_S = 30.0


@dataclass(slots=True)
class _Reading:
    """One partition of a Fetch being answered."""

    topic: TopicMetadata
    want: FetchPartition
    out: FetchedPartition
    note: int          # the notification offset to read from
    index: int         # the first record wanted in that notification's part
    buf: bytearray
    zstd: bool         # the client takes zstd batches (Fetch v10+)
    log: PartitionLog  # the partition's log as opened (its compacted prefix, DeleteRecords' start)
    prefix_at: int | None = None   # the offset to read from while in the compacted prefix (then note, index: 0)

    @property
    def notification_topic(self) -> str:
        return self.topic.notification_topic

    @property
    def got(self) -> bool:
        return bool(self.buf)


def _refusal(core: BrokerCore, principal: str | None, meta: ClusterMetadata, topic: str,
             partition: int) -> ErrorCode | None:
    t = meta.topics.get(topic)
    if core.guard.enabled and not core.guard.may(principal, Operation.CONSUME, topic):
        core.guard.count_denial(Operation.CONSUME)
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED
    if t is None or not 0 <= partition < t.read_partitions:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return None


async def fetch(core: BrokerCore, principal: str | None, req: FetchRequest, peer: object
                ) -> list[tuple[str, list[FetchedPartition]]]:
    meta = core.metadata()
    answer: list[tuple[str, list[FetchedPartition]]] = []
    readings: list[_Reading] = []
    for topic, parts in req.topics:
        outs = []
        for p in parts:
            out = FetchedPartition(p.index)
            outs.append(out)
            refused = _refusal(core, principal, meta, topic, p.index)
            if refused is not None:
                out.error = refused
                continue
            if p.offset < 0:   # no log has it: answered without counting the partition
                out.error = ErrorCode.OFFSET_OUT_OF_RANGE
                continue
            t = meta.topics[topic]
            try:
                plog = await core.logs.started(t, p.index)
            except MemqError as e:   # a dense topic's offsets not counted yet (Kafka failing): the client retries
                out.error = ErrorCode.KAFKA_STORAGE_ERROR
                log.warning("Kafka fetch of %s[%d] from %s: %s", topic, p.index, peer, e)
                continue
            if plog.before_start(p.offset):
                out.error, out.log_start = ErrorCode.OFFSET_OUT_OF_RANGE, plog.moved
                log.info("Kafka fetch of %s[%d] at %d from %s: before the log start %d (DeleteRecords)",
                         topic, p.index, p.offset, peer, plog.moved)
            elif (replica := _preferred_replica(meta, core.broker_id, req.rack, p.index)) >= 0:
                out.preferred_replica = replica   # read nothing here: the client goes there
                out.high_watermark = p.offset
            else:
                plog = await core.logs.opened(plog, t, p.index, peer)
                if plog.in_prefix(p.offset):   # by its offset: a dense prefix's notifications may be uncounted
                    readings.append(_Reading(t, p, out, 0, 0, bytearray(), req.zstd, plog, p.offset))
                    continue
                note, index = plog.scheme.position_of(p.offset)
                readings.append(_Reading(t, p, out, note, index, bytearray(), req.zstd, plog))
        answer.append((topic, outs))
    budget = [max(req.max_bytes, 1)]   # bytes the response may still take
    for r in readings:   # what is there now
        await _read(core, r, 0.0, budget, peer)
    wait_s = min(req.max_wait_ms / 1000, MAX_WAIT_S)
    if readings and not any(r.got or r.out.error for r in readings) and wait_s > 0:
        await _long_poll(core, readings, wait_s, budget, peer)
    for r in readings:
        if not r.out.error:
            ended = await core.logs.read_to(r.log, r.topic, r.want.index, r.note, r.index, peer)
            r.out.high_watermark, r.out.log_start = ended.high_watermark, ended.log_start
            r.out.last_stable_offset = ended.last_stable_offset
            r.out.records = r.buf
    return answer


def _preferred_replica(meta: ClusterMetadata, me: str, rack: str, partition: int) -> int:
    """KIP-392: a broker in the client's rack for it to read from, when this one is not (any
    broker serves any topic's reads: the data is in S3); -1 for this one."""
    if not rack:
        return -1
    near = sorted(b.id for b in meta.brokers if b.rack == rack and b.kafka_address)
    if not near or me in near:
        return -1
    return node_id(near[partition % len(near)])


async def _long_poll(core: BrokerCore, readings: list[_Reading], wait_s: float, budget: list[int],
                     peer: object) -> None:
    """Wait for the first partition to get a notification, then answer with what it brought.

    A partition's read still waiting when another's data came is left to finish on its own: its
    notifications land in its tail's memory, where the client's next Fetch finds them."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    pending = {asyncio.ensure_future(_read(core, r, wait_s, budget, peer)): r for r in readings}
    while pending:
        left = deadline - loop.time()
        if left <= 0:
            break
        done, _ = await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            break
        for d in done:
            pending.pop(d)
        if any(r.got or r.out.error for r in readings):
            break


async def _read(core: BrokerCore, r: _Reading, wait_s: float, budget: list[int], peer: object) -> None:
    """Read `r`'s partition from its place, within its and the response's byte limits."""
    try:
        if r.prefix_at is not None and (
                not await _place_compacted(core, r, budget) or budget[0] <= 0 or len(r.buf) >= r.want.max_bytes):
            return
        notes = await core.reads.notes(r.notification_topic, r.want.index, r.note, wait_s)
        await core.logs.counted(r.log, r.topic, r.want.index, notes)
        for n in notes:   # stop at the first part not placed whole: the records a reader gets have no holes
            if not await _place(core, r, n, budget) or budget[0] <= 0 or len(r.buf) >= r.want.max_bytes:
                break
    except OffsetOutOfRangeError as e:
        r.out.error = ErrorCode.OFFSET_OUT_OF_RANGE
        log.info("Kafka fetch of %s[%d] at %d from %s: %s", r.topic.name, r.want.index, r.want.offset, peer, e)
    except FormatError as e:
        r.out.error = ErrorCode.CORRUPT_MESSAGE
        log.warning("Kafka fetch of %s[%d] at %d from %s: %s", r.topic.name, r.want.index, r.want.offset, peer, e)
    except MemqError as e:   # the notification Kafka or storage failing: the client retries
        r.out.error = ErrorCode.KAFKA_STORAGE_ERROR
        log.warning("Kafka fetch of %s[%d] at %d from %s: %s", r.topic.name, r.want.index, r.want.offset, peer, e)


async def _place_compacted(core: BrokerCore, r: _Reading, budget: list[int]) -> bool:
    """Add the compacted prefix's batches from the reading's offset on (the log's segments) and
    move the reading to the plain tail; False when a limit stopped it inside the prefix."""
    assert r.prefix_at is not None
    offset = r.prefix_at
    segments = r.log.segments(offset)
    for seg in segments.parts:
        offset = max(offset, seg.start)
        async for batch in core.reads.compacted_batches(seg.part, offset):
            before = len(r.buf)
            after = place_batch(batch, r.buf, min(r.want.max_bytes, len(r.buf) + budget[0]),
                                at_least_one=not r.buf and budget[0] > 0, zstd=r.zstd)
            if after is None:
                r.prefix_at = offset
                return False
            budget[0] -= len(r.buf) - before
            offset = max(offset, after)
    assert segments.tail is not None
    r.prefix_at, r.note, r.index = None, segments.tail.note, segments.tail.index
    return True


async def _place(core: BrokerCore, r: _Reading, n: NotificationRecord, budget: list[int]) -> bool:
    """Add the records of `n` from the reading's index on and move the reading past them; False
    when a limit stopped it inside the part."""
    if n.offset < r.note:
        return True
    index = r.index if n.offset == r.note else 0
    note = n.notification
    if index < note.logmessage_count:
        part = await core.reads.readable(r.notification_topic, r.want.index, n)   # retried copies left out
        before = len(r.buf)
        limit = min(r.want.max_bytes, len(r.buf) + budget[0])
        # a partition's first batch goes whatever its size while the response has room left (KIP-74:
        # else a batch larger than max.partition.fetch.bytes would stall its partition for good)
        after = place(part, r.log.scheme.start_of(n.offset), index, r.buf, limit,
                      at_least_one=not r.buf and budget[0] > 0, zstd=r.zstd)
        budget[0] -= len(r.buf) - before
        if after < note.logmessage_count:
            r.note, r.index = n.offset, after   # stopped by a limit inside this part
            return False
    r.note, r.index = n.offset + 1, 0
    return True


async def list_offsets(core: BrokerCore, principal: str | None, req: ListOffsetsRequest
                       ) -> list[tuple[str, list[ListedOffset]]]:
    meta = core.metadata()
    answer = []
    for topic, parts in req.topics:
        outs = []
        for partition, ts in parts:
            refused = _refusal(core, principal, meta, topic, partition)
            if refused is not None:
                outs.append(ListedOffset(partition, refused))
                continue
            try:
                outs.append(await _listed(core, meta.topics[topic], partition, ts))
            except MemqError as e:
                log.warning("Kafka ListOffsets of %s[%d] at %d: %s", topic, partition, ts, e)
                outs.append(ListedOffset(partition, ErrorCode.KAFKA_STORAGE_ERROR))
        answer.append((topic, outs))
    return answer


async def _listed(core: BrokerCore, t: TopicMetadata, partition: int, ts: int) -> ListedOffset:
    plog = await core.logs.current(t, partition, "ListOffsets", end=ts == LATEST)
    if ts == LATEST:   # as the high watermark of a Fetch says it, so lag reads 0 at the end
        return ListedOffset(partition, offset=plog.high_watermark)
    if ts == EARLIEST:
        return ListedOffset(partition, offset=plog.log_start)
    if ts < 0:
        return ListedOffset(partition, ErrorCode.INVALID_REQUEST)
    # The first notification published at or after ts: its part may start a little before ts
    # (records are stamped before they are stored), never after a record stamped ts or later.
    found = (await core.reads.offsets_for_time(t.notification_topic, ts)).get(partition, plog.high)
    if found >= plog.high:
        return ListedOffset(partition)   # none at or after ts: offset -1, as Kafka answers
    return ListedOffset(partition, timestamp=ts, offset=plog.first_offset_at(found))


async def serve(conn: Conn, h: RequestHeader, body: Reader) -> Response:
    """Answered in turn, read on meanwhile: a long poll blocks no other request of the connection."""
    if h.api_key == ApiKey.FETCH:
        req = decode_fetch(h, body)
        return asyncio.ensure_future(_answer_fetch(conn, h, req))
    lreq = decode_list_offsets(h, body)
    return asyncio.ensure_future(_answer_list_offsets(conn, h, lreq))


async def _answer_fetch(conn: Conn, h: RequestHeader, req: FetchRequest) -> bytes:
    return encode_fetch(h, await fetch(conn.core, conn.principal, req, conn.peer))


async def _answer_list_offsets(conn: Conn, h: RequestHeader, req: ListOffsetsRequest) -> bytes:
    return encode_list_offsets(h, await list_offsets(conn.core, conn.principal, req))


#: Fetch v4 (RecordBatch v2: librdkafka's MsgVer2 needs Produce v3 and Fetch v4) up to the last
#: non-flexible one; fetch sessions (v7+) are answered sessionless (id 0): full fetches.
FAMILY = Family("fetch", {ApiKey.FETCH: (4, 11), ApiKey.LIST_OFFSETS: (1, 5)}, "consume on the topic", serve)
