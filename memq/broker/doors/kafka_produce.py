"""The Kafka door's produce family: Produce and InitProducerId.

Each RecordBatch of a Produce request has its header and CRC32C checked and goes, unchanged,
as one Codec.KAFKA Message through the broker's one admission path (`memq.broker.admission`,
the same checks as `/v1/produce`): the same batching, storage, notification and dedup as memq's
own protocol. A Kafka client has no memq audit emitter, so the door reports each acked Message
(acks 1 and all) to the audit as its producer would. Produce needs `produce` on the topic
(TOPIC_AUTHORIZATION_FAILED naming principal and topic, nothing appended). Produce quotas hold
as on `/v1/produce` (memq.security.quota): a Produce over quota is accepted, its response
carries `throttle_time_ms`, and the connection is not read for that long (KIP-219).

Kafka has no flush a broker could see, so a connection quiet for `broker.kafka_idle_seal_ms`
with acks=all Messages appended seals their topics' batches early (`idle_seal`, banked credit).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets

from memq.errors import FormatError, UnsupportedCodecError, UnsupportedVersionError
from memq.format.kafka_records import split_kafka_batches, verify_kafka_batch
from memq.format.message import MESSAGE_HEADER_SIZE, MessageHeader, encode_kafka_message
from memq.format.wire import Ack, AckCode, AckLevel
from memq.kafka_api.idle_seal import SealCredit
from memq.kafka_api.mapping import PRODUCER_ID_BITS, ack_level, error_code, memq_producer_id
from memq.kafka_api.offsets import produce_base_offset
from memq.kafka_api.protocol import (ApiKey, ErrorCode, PartitionData, PartitionResult, ProduceRequest, ProduceResult,
                                     Reader, RequestHeader, decode_init_producer_id, decode_produce,
                                     encode_init_producer_id, encode_produce)

from ..admission import Refusal, Ticket
from .kafka_family import Conn, Family, Response

log = logging.getLogger(__name__)

#: One appended RecordBatch: its ack to come and its record count.
Appended = tuple[asyncio.Future[Ack], int]

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
        # topics with acks=all Messages appended since the last idle seal
        self.awaiting: dict[str, Ticket] = {}
        unit = conn.core.config.broker.kafka_idle_seal_bytes
        self.seal_credit = SealCredit(unit, IDLE_SEAL_BANK * unit)

    def idle_seal(self) -> None:
        """Seal the awaited topics' batches the connection's credit allows (`idle_seal`)."""
        for ticket in self.awaiting.values():
            if ticket.seal_if_at_least(self.seal_credit.threshold()):
                self.seal_credit.spend()
        self.awaiting.clear()


async def serve(conn: Conn, h: RequestHeader, body: Reader) -> Response:
    if h.api_key == ApiKey.INIT_PRODUCER_ID:
        return _init_producer_id(conn, h, body)
    return await _produce(conn, conn.state(ProduceState), h, decode_produce(body))


def _init_producer_id(conn: Conn, h: RequestHeader, body: Reader) -> bytes:
    transactional_id = decode_init_producer_id(body)
    if transactional_id is not None:
        log.info("refused InitProducerId for transactional id %r from %s: memq has no Kafka transactions",
                 transactional_id, conn.peer)
        return encode_init_producer_id(h, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1)
    # Random, so brokers hand out ids without coordinating (see mapping.PRODUCER_ID_BITS).
    return encode_init_producer_id(h, ErrorCode.NONE, secrets.randbits(PRODUCER_ID_BITS), 0)


async def _produce(conn: Conn, st: ProduceState, h: RequestHeader, req: ProduceRequest) -> Response:
    core = conn.core
    level = ack_level(req.acks)
    appended: list[tuple[str, int, list[Appended] | PartitionResult]] = []
    accepted: list[tuple[str, int]] = []   # (topic, record bytes) to charge to the quotas
    for topic, parts in req.topics:
        for part in parts:
            outcome: list[Appended] | PartitionResult
            if level is None:
                outcome = PartitionResult(
                    part.index, ErrorCode.INVALID_REQUIRED_ACKS, message=f"acks={req.acks}: use 0, 1 or -1")
            elif req.transactional_id is not None:
                outcome = PartitionResult(part.index, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                          message="memq has no Kafka transactions")
            else:
                outcome = await _append(conn, st, topic, part, level)
            if isinstance(outcome, PartitionResult):
                if outcome.error:
                    core.metrics.rejected.labels(f"kafka:{outcome.error.name}").inc()
                    log.info("Kafka produce to %s[%d] from %s: %s (%s)", topic, part.index, conn.peer,
                             outcome.error.name, outcome.message)
            else:
                accepted.append((topic, len(part.records or b"")))
            appended.append((topic, part.index, outcome))
    st.throttle_s = core.admission.charge(conn.principal, accepted)
    if level is AckLevel.NONE:
        return None   # Kafka sends no response to acks=0
    wait_s = min(max(req.timeout_ms / 1000, MIN_ACK_WAIT_S), MAX_ACK_WAIT_S)
    return asyncio.ensure_future(_produce_response(h, appended, wait_s, round(st.throttle_s * 1000)))


async def _produce_response(h: RequestHeader, appended: list[tuple[str, int, list[Appended] | PartitionResult]],
                            timeout_s: float, throttle_ms: int) -> bytes:
    futures = [f for _, _, o in appended if not isinstance(o, PartitionResult) for f, _ in o]
    if futures:
        await asyncio.wait(futures, timeout=timeout_s)
    result = ProduceResult(throttle_ms=throttle_ms)
    for topic, index, outcome in appended:
        result.topics.setdefault(topic, []).append(
            outcome if isinstance(outcome, PartitionResult) else _partition_result(index, outcome, timeout_s))
    return encode_produce(h, result)


async def _append(conn: Conn, st: ProduceState, topic: str, part: PartitionData, level: AckLevel
                  ) -> list[Appended] | PartitionResult:
    """Admit one partition's records, then append each RecordBatch as a Message: (its ack to come, its count)."""
    core = conn.core
    try:
        split: list[memoryview] | FormatError = split_kafka_batches(part.records) if part.records else []
    except FormatError as e:
        split = e   # reported after admission: who may write here is checked first
    largest = max((len(b) for b in split), default=0) + MESSAGE_HEADER_SIZE if isinstance(split, list) else 0
    admitted = core.admission.admit(conn.principal, topic, largest)
    if isinstance(admitted, Refusal):
        return _refused(conn, topic, part.index, admitted)
    if conn.session is not None:
        conn.session.produced(topic)
    if not 0 <= part.index < admitted.config.read_partitions:
        return PartitionResult(part.index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                               message=f"topic {topic} has {admitted.config.read_partitions} partitions")
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
    if any(kh.transactional for _, kh in batches):
        return PartitionResult(part.index, ErrorCode.INVALID_REQUEST,
                               message="transactional batches: memq has no Kafka transactions")
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


def _refused(conn: Conn, topic: str, index: int, refusal: Refusal) -> PartitionResult:
    """A partition not admitted, in Kafka's terms (not the hot path)."""
    code = refusal.code
    if code is AckCode.UNKNOWN_TOPIC and topic in conn.core.metadata().topics:
        code = AckCode.NOT_HERE   # hosted elsewhere in the cluster: the client re-reads metadata
    return PartitionResult(index, error_code(code), -1, refusal.why)


def _partition_result(index: int, appended: list[Appended], timeout_s: float) -> PartitionResult:
    """The partition's answer once its Messages' acks are in: its first record's Kafka offset as
    a reader will see it (acks=all; negative, unknown, for acks=1: its notification is not published yet)."""
    placed = []
    for f, count in appended:
        if not f.done():
            return PartitionResult(index, ErrorCode.REQUEST_TIMED_OUT,
                                   message=f"not stored and notified within {timeout_s:g}s")
        ack = f.result()
        if not ack.ok:
            return PartitionResult(index, error_code(ack.code), message=ack.error)
        placed.append((ack.offset, ack.record, count))
    return PartitionResult(index, base_offset=produce_base_offset(placed))


FAMILY = Family("produce", {ApiKey.PRODUCE: (3, 8), ApiKey.INIT_PRODUCER_ID: (0, 1)},
                "produce on the topic", serve)
