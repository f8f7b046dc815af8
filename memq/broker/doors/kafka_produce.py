"""The Kafka door's produce family: Produce (InitProducerId is the transactions family's, `kafka_txn`).

Each RecordBatch of a Produce request has its header and CRC32C checked and goes, unchanged,
as one Codec.KAFKA Message through the broker's one admission path (`memq.broker.admission`,
the same checks as `/v1/produce`): the same batching, storage, notification and dedup as memq's
own protocol. A Kafka client has no memq audit emitter, so the door reports each acked Message
(acks 1 and all) to the audit as its producer would (a transaction's: its coordinator, at the
commit, from the pending entries `Transactions.store_pending` names them in). Produce needs `produce` on the topic
(TOPIC_AUTHORIZATION_FAILED naming principal and topic, nothing appended). Produce quotas hold
as on `/v1/produce` (memq.security.quota): a Produce over quota is accepted, its response
carries `throttle_time_ms`, and the connection is not read for that long (KIP-219).

A record without a key to a compacted topic is refused (INVALID_RECORD, the whole partition's
records): one of the two places the door decodes records, bounded to compacted topics
(`kafka_api.compacted.keyless_records`). The other: a topic with schema checks has its records
checked by the admission path (`kafka_schema_check`): refused (INVALID_RECORD with each failing
record's index and reason), stored counted (warn), or its failing records dead-lettered (dlq).
Every topic's records go to the partition the client chose (its partitioner hashed the key, or
the application named it: Kafka's semantics), and are read from there: a stream processor's
"same key, same partition, in order" holds, and compaction per partition sees every record of a
key. A partition the topic does not have is UNKNOWN_TOPIC_OR_PARTITION.

Kafka has no flush a broker could see, so a connection quiet for `broker.kafka_idle_seal_ms`
with acks=all Messages appended seals their topics' batches early (`idle_seal`, banked credit).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from typing import Any

from memq.errors import FormatError, MemqError, UnsupportedCodecError, UnsupportedVersionError
from memq.format.kafka_records import KafkaBatchHeader, split_kafka_batches, verify_kafka_batch
from memq.format.metadata import TopicMetadata
from memq.format.message import MESSAGE_HEADER_SIZE, MessageHeader, encode_kafka_message
from memq.format.wire import Ack, AckCode, AckLevel
from memq.kafka_api.compacted import keyless_records
from memq.kafka_api.idle_seal import SealCredit
from memq.kafka_api.mapping import ack_level, error_code, memq_producer_id
from memq.kafka_api.offsets import produce_base_offset
from memq.kafka_api.protocol import (ApiKey, ErrorCode, PartitionData, PartitionResult, ProduceRequest, ProduceResult,
                                     Reader, RequestHeader, decode_produce, encode_produce)
from memq.log.model import SPARSE, OffsetScheme

from memq.schema.check import checked

from ..admission import Refusal, Ticket
from ..seam import BrokerCore
from ..txn.service import ProducerIds
from .kafka_family import Conn, Family, Response
from .kafka_schema_check import check_partition

log = logging.getLogger(__name__)

#: One appended RecordBatch: its ack to come and its record count.
Appended = tuple[asyncio.Future[Ack], int]
#: One partition of a Produce: its appended batches, its answer, or its answer to come (transactional).
Outcome = list[Appended] | PartitionResult | asyncio.Future[PartitionResult]

#: An acks=all Produce waits for its acks the request's timeout_ms, within these bounds, then
#: answers REQUEST_TIMED_OUT for what is still pending (it may still be stored: the client retries
#: with the same ids, so an idempotent producer's retry is dropped as a duplicate).
MIN_ACK_WAIT_S = 1.0
MAX_ACK_WAIT_S = 300.0
#: A connection banks idle-seal credit (`idle_seal`) up to this many `broker.kafka_idle_seal_bytes`.
IDLE_SEAL_BANK = 4


class ProduceState:
    """A connection's produce state: ids for a producer without idempotence, the quota debt,
    and the topics waiting on an idle seal."""

    def __init__(self, conn: Conn) -> None:
        # A producer without idempotence: its Messages get this id and a per-connection
        # sequence, unique so nothing is dropped as a duplicate (Kafka does not dedup them either).
        self.producer_id = secrets.randbits(64)
        self.sequence = itertools.count()
        self.request_ids = itertools.count()
        self.throttle_s = 0.0   # owed by the request just handled: read nothing more for this long
        # topics with acks=all Messages appended since the last idle seal (a seal takes every partition's)
        self.awaiting: dict[str, Ticket] = {}
        unit = conn.core.config.broker.kafka_idle_seal_bytes
        self.seal_credit = SealCredit(unit, IDLE_SEAL_BANK * unit)
        # per (transactional id, topic, partition): the latest transactional produce still being
        # stored, which the next one's pending entry waits for (`Transactions.store_pending`)
        self.txn_last: dict[tuple[str, str, int], asyncio.Future[PartitionResult]] = {}

    def idle_seal(self) -> None:
        """Seal the awaited topics' batches the connection's credit allows (`idle_seal`)."""
        for ticket in self.awaiting.values():
            if ticket.seal_if_at_least(self.seal_credit.threshold()):
                self.seal_credit.spend()
        self.awaiting.clear()


async def serve(conn: Conn, h: RequestHeader, body: Reader) -> Response:
    return await _produce(conn, conn.state(ProduceState), h, decode_produce(body))


async def _produce(conn: Conn, st: ProduceState, h: RequestHeader, req: ProduceRequest) -> Response:
    core = conn.core
    level = ack_level(req.acks)
    appended: list[tuple[str, int, Outcome]] = []
    accepted: list[tuple[str, int]] = []   # (topic, record bytes) to charge to the quotas
    for topic, parts in req.topics:
        for part in parts:
            outcome: Outcome
            if level is None:
                outcome = PartitionResult(
                    part.index, ErrorCode.INVALID_REQUIRED_ACKS, message=f"acks={req.acks}: use 0, 1 or -1")
            else:
                outcome = await _append(conn, st, topic, part, level, req.transactional_id)
            if isinstance(outcome, PartitionResult):
                if outcome.error:
                    _rejected(conn, topic, outcome)
            else:
                accepted.append((topic, len(part.records or b"")))
            appended.append((topic, part.index, outcome))
    st.throttle_s = core.admission.charge(conn.principal, accepted)
    if level is AckLevel.NONE:
        return None   # Kafka sends no response to acks=0
    wait_s = min(max(req.timeout_ms / 1000, MIN_ACK_WAIT_S), MAX_ACK_WAIT_S)
    return asyncio.ensure_future(_produce_response(core, h, appended, wait_s, round(st.throttle_s * 1000)))


async def _produce_response(core: BrokerCore, h: RequestHeader, appended: list[tuple[str, int, Outcome]],
                            timeout_s: float, throttle_ms: int) -> bytes:
    futures: list[asyncio.Future[Any]] = [
        f for _, _, o in appended if isinstance(o, list) for f, _ in o]
    futures += [o for _, _, o in appended if isinstance(o, asyncio.Future)]
    if futures:
        await asyncio.wait(futures, timeout=timeout_s)
    result = ProduceResult(throttle_ms=throttle_ms)
    topics = core.metadata().topics
    for topic, index, outcome in appended:
        if isinstance(outcome, list):
            scheme = SPARSE if topic not in topics else await _scheme(core, topics[topic], index, outcome)
            answer = _partition_result(index, outcome, timeout_s, scheme)
        else:
            answer = outcome if isinstance(outcome, PartitionResult) else outcome.result() if outcome.done() else \
                PartitionResult(index, ErrorCode.REQUEST_TIMED_OUT, message=f"not stored within {timeout_s:g}s")
        result.topics.setdefault(topic, []).append(answer)
    return encode_produce(h, result)


async def _scheme(core: BrokerCore, topic: TopicMetadata, index: int, appended: list[Appended]) -> OffsetScheme | None:
    """The offsets the partition's answer is given in: a dense topic's as this broker counts them
    (None, unknown: not counted here, or its notifications not read now)."""
    if topic.offsets != "dense":
        return SPARSE
    notes = [f.result().offset for f, _ in appended if f.done() and f.result().ok]
    if not notes or min(notes) < 0:
        return None
    try:
        return await core.logs.bases.warm(topic, index, max(notes) + 1)
    except MemqError as e:
        log.info("Kafka produce to %s[%d]: offsets not counted now: %s", topic.name, index, e)
        return None


async def _append(conn: Conn, st: ProduceState, topic: str, part: PartitionData, level: AckLevel,
                  txn_id: str | None = None) -> Outcome:
    """Admit one partition's records, then append each RecordBatch as a Message: (its ack to come,
    its count); a transaction's (`txn_id`) are stored apart, unpublished (`_txn_store`)."""
    core = conn.core
    try:
        split: list[memoryview] | FormatError = split_kafka_batches(part.records) if part.records else []
    except FormatError as e:
        split = e   # reported after admission: who may write here is checked first
    largest = max((len(b) for b in split), default=0) + MESSAGE_HEADER_SIZE if isinstance(split, list) else 0
    # a negative index names no partition Kafka has: admission's -1 ("none named") is memq's own
    admitted = core.admission.admit(conn.principal, topic, largest, part.index if part.index >= 0 else -2)
    if isinstance(admitted, Refusal):
        if admitted.no_partition:
            return PartitionResult(part.index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, message=admitted.why)
        return _refused(conn, topic, part.index, admitted)
    if conn.session is not None:
        conn.session.produced(topic)
    if not part.records:
        return PartitionResult(part.index, ErrorCode.CORRUPT_MESSAGE, message="no records")
    try:
        if isinstance(split, FormatError):
            raise split
        batches = [(b, verify_kafka_batch(b)) for b in split]
    except UnsupportedCodecError as e:
        return PartitionResult(part.index, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, message=str(e))
    except UnsupportedVersionError as e:
        return PartitionResult(part.index, ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT, message=str(e))
    except FormatError as e:
        return PartitionResult(part.index, ErrorCode.CORRUPT_MESSAGE, message=str(e))
    if any(kh.transactional != (txn_id is not None) for _, kh in batches):
        return PartitionResult(part.index, ErrorCode.INVALID_REQUEST, message=(
            "transactional batches without a transactional id" if txn_id is None else
            f"transactional id {txn_id!r} with batches that are not transactional"))
    if "compact" in admitted.config.cleanup_policy and (keyless := keyless_records(b for b, _ in batches)):
        return PartitionResult(part.index, ErrorCode.INVALID_RECORD,
                               message=f"topic {topic} is compacted: {keyless} record(s) without a key refused")
    if checked(admitted.config):
        kept = await check_partition(conn, topic, part.index, admitted, batches,
                                     (st.producer_id, next(st.sequence), next(st.request_ids)))
        if isinstance(kept, PartitionResult):
            return kept
        if not kept:   # every record went to the dead-letter topic
            return PartitionResult(part.index)
        batches = kept
    if txn_id is not None:
        return _txn_store(conn, st, txn_id, topic, part.index, admitted, batches)
    loop = asyncio.get_running_loop()
    futures: list[Appended] = []
    audited = conn.audit if level is not AckLevel.NONE else None
    for b, kh in batches:
        if kh.producer_id >= 0:   # idempotent: a retry carries the same ids, so dedup drops it
            ids = (memq_producer_id(kh.producer_id, part.index), max(kh.producer_epoch, 0), kh.base_sequence)
        else:
            ids = (st.producer_id, 0, next(st.sequence))
        msg, header = encode_kafka_message(b, kh, producer_id=ids[0], epoch=ids[1], sequence=ids[2])
        fut: asyncio.Future[Ack] = loop.create_future()

        def reply(a: Ack, fut: asyncio.Future[Ack] = fut, h: MessageHeader = header, topic: str = topic) -> None:
            if fut.done():
                return
            fut.set_result(a)
            if a.ok and audited is not None:   # the broker stands in for the Kafka client's audit
                audited.produced(topic=topic, producer_id=h.producer_id, epoch=h.epoch, sequence=h.sequence,
                                 count=h.count, digest=h.body_crc32c, created_ms=h.created_ms)

        await admitted.append(memoryview(msg), header, next(st.request_ids), level, reply)
        if not fut.done() or fut.result().ok:
            st.seal_credit.earn(len(msg))
        if not fut.done() and level is AckLevel.ALL:
            st.awaiting[topic] = admitted
        futures.append((fut, kh.count))
    return futures


def _txn_store(conn: Conn, st: ProduceState, txn_id: str, topic: str, index: int, admitted: Ticket,
               batches: list[tuple[memoryview, KafkaBatchHeader]]) -> Outcome:
    """Store a transaction's batches of one partition as their own object, unpublished: a
    pending entry of the transaction until EndTxn (`Transactions.produce`). Its answer comes
    once both are durable (`Transactions.store_pending`: check, one PUT, the pending entry); the
    base offset is unknown (negative) until the commit publishes it. Pipelined requests of a
    partition are stored at once but become pending entries in the order they came, as the
    commit publishes them (a partition's records in the order the producer sent them)."""
    pid, epoch = batches[0][1].producer_id, batches[0][1].producer_epoch
    if any((kh.producer_id, kh.producer_epoch) != (pid, epoch) for _, kh in batches):
        return PartitionResult(index, ErrorCode.INVALID_REQUEST, message="batches of several producers")
    messages, headers = [], []
    for b, kh in batches:   # the ids readers drop a republished notification's Messages by
        msg, header = encode_kafka_message(b, kh, producer_id=memq_producer_id(pid, index), epoch=max(epoch, 0),
                                           sequence=kh.base_sequence)
        messages.append(memoryview(msg))
        headers.append(header)
    count = sum(kh.count for _, kh in batches)
    key = (txn_id, topic, index)
    stored = asyncio.ensure_future(_txn_stored(conn, txn_id, ProducerIds(pid, epoch), admitted, index, messages,
                                               headers, count, st.txn_last.get(key)))
    st.txn_last[key] = stored

    def done(f: asyncio.Future[PartitionResult]) -> None:
        if st.txn_last.get(key) is f:
            del st.txn_last[key]
    stored.add_done_callback(done)
    return stored


async def _txn_stored(conn: Conn, txn_id: str, ids: ProducerIds, admitted: Ticket, index: int,
                      messages: list[memoryview], headers: list[MessageHeader], count: int,
                      after: asyncio.Future[PartitionResult] | None) -> PartitionResult:
    try:
        why = await conn.core.txns.store_pending(txn_id, ids, admitted, index, messages, headers, after=after)
    except MemqError as e:   # storage failing: retriable, and a retry's same ids make it harmless
        log.warning("Kafka transactional produce to %s[%d] for %r from %s: %s", admitted.config.name, index,
                    txn_id, conn.peer, e)
        return PartitionResult(index, ErrorCode.KAFKA_STORAGE_ERROR, message=str(e))
    if why is not None:   # Produce v3+ knows neither PRODUCER_FENCED nor its own: Kafka's INVALID_PRODUCER_EPOCH
        return _rejected(conn, admitted.config.name, PartitionResult(
            index, why.code_for(False), message=f"transactional id {txn_id!r}: {why.name}"))
    return PartitionResult(index, base_offset=-max(count, 1))


def _rejected(conn: Conn, topic: str, result: PartitionResult) -> PartitionResult:
    """A refused partition's `result`, counted (`kafka:<ERROR>`) and logged."""
    conn.core.metrics.rejected.labels(f"kafka:{result.error.name}").inc()
    log.info("Kafka produce to %s[%d] from %s: %s (%s)", topic, result.index, conn.peer, result.error.name,
             result.message)
    return result


def _refused(conn: Conn, topic: str, index: int, refusal: Refusal) -> PartitionResult:
    """A partition not admitted, in Kafka's terms (not the hot path)."""
    code = refusal.code
    if code is AckCode.UNKNOWN_TOPIC and topic in conn.core.metadata().topics:
        code = AckCode.NOT_HERE   # hosted elsewhere in the cluster: the client re-reads metadata
    return PartitionResult(index, error_code(code), -1, refusal.why)


def _partition_result(index: int, appended: list[Appended], timeout_s: float,
                      scheme: OffsetScheme | None) -> PartitionResult:
    """The partition's answer once its Messages' acks are in: its first record's Kafka offset as
    a reader will see it (acks=all, in `scheme`; negative, unknown, for acks=1: its notification is
    not published yet, and without a scheme)."""
    placed = []
    for f, count in appended:
        if not f.done():
            return PartitionResult(index, ErrorCode.REQUEST_TIMED_OUT,
                                   message=f"not stored and notified within {timeout_s:g}s")
        ack = f.result()
        if not ack.ok:
            return PartitionResult(index, error_code(ack.code), message=ack.error)
        placed.append((-1 if scheme is None else ack.offset, ack.record, count))
    return PartitionResult(index, base_offset=produce_base_offset(placed, (scheme or SPARSE).offset_of))


FAMILY = Family("produce", {ApiKey.PRODUCE: (3, 8)},
                "produce on the topic", serve)
