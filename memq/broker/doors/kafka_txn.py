"""The Kafka door's transaction family: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn,
TxnOffsetCommit, EndTxn.

InitProducerId without a transactional id (an idempotent producer) is answered by any broker: a
random producer id, epoch 0 (see `mapping.PRODUCER_ID_BITS`). Each call with a transactional id
but TxnOffsetCommit is the coordinator's (`memq.broker.coordinator`, a hash of the
transactional id over the brokers with a Kafka listener; FindCoordinator key_type 1 names it,
`kafka_groups`): another broker answers NOT_COORDINATOR and the client finds it again.
TxnOffsetCommit goes to the group's coordinator (FindCoordinator key type 0), which checks the member and its
generation or member epoch as it arrives (a zombie member's is ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID, Kafka's
codes) and stashes the offsets in the transaction's state, whichever broker that is. The state (producer id,
epoch, partitions, stashed offsets) is the broker's `Transactions` service
(`memq.broker.txn.service`); this module only maps Kafka's messages onto it, through
kafka-python's codec of Kafka's schemas (`memq.kafka_api.messages`), and the service's
refusals onto Kafka's codes (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE,
CONCURRENT_TRANSACTIONS, ...), each with a log line. Transactional Produce is the produce
family's (`kafka_produce`, through `Transactions.store_pending`).

ACLs: memq has no `transactional_id` resource, so a transactional id is protected by what it
touches, as memq's own rights name them: AddPartitionsToTxn needs `produce` on each topic
(Kafka's WRITE; TOPIC_AUTHORIZATION_FAILED per partition, and Produce checks it again),
AddOffsetsToTxn and TxnOffsetCommit need `consume` on the group (Kafka's READ;
GROUP_AUTHORIZATION_FAILED). InitProducerId and EndTxn need an authenticated principal only:
any principal may fence a transactional id, so give each application its own id prefix.

Versions: InitProducerId v0-1; the others v0-3, what librdkafka (AddPartitionsToTxn and AddOffsetsToTxn v0, TxnOffsetCommit
v0-3, EndTxn v0-1), kafka-python 3, aiokafka (v0) and kafkajs (v0-1) send; v3 is flexible.
AddPartitionsToTxn v4+ is Kafka's broker-to-broker batch form, which no client sends.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable
from typing import Any

from kafka.protocol.producer.transaction import (AddOffsetsToTxnRequest, AddOffsetsToTxnResponse,
                                                 AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, EndTxnRequest,
                                                 EndTxnResponse, TxnOffsetCommitRequest, TxnOffsetCommitResponse)

from memq.kafka_api.mapping import PRODUCER_ID_BITS
from memq.kafka_api.messages import decode_request, encode_response
from memq.kafka_api.protocol import (ApiKey, ErrorCode, Reader, RequestHeader, decode_init_producer_id,
                                     encode_init_producer_id)
from memq.security.acl import Operation

from ..coordinator import not_coordinator
from ..txn.service import GroupOffsets, ProducerIds, TxnRefusal
from .kafka_family import Conn, Family, Response

log = logging.getLogger(__name__)

_TopicResult = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
_PartResult = _TopicResult.AddPartitionsToTxnPartitionResult
_OffsetTopic = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
_OffsetPart = _OffsetTopic.TxnOffsetCommitResponsePartition


def _elsewhere(conn: Conn, txn_id: str) -> ErrorCode | None:
    """NOT_COORDINATOR if another broker coordinates `txn_id` (COORDINATOR_NOT_AVAILABLE if none
    does), else None: this broker serves its transaction calls."""
    return not_coordinator(conn.core.metadata(), txn_id, conn.core.broker_id)


def refused(conn: Conn, what: str, txn_id: str, code: ErrorCode, why: str) -> ErrorCode:
    """`code`, logged: every refusal of this family is named in the broker's log."""
    conn.core.metrics.rejected.labels(f"kafka:{code.name}").inc()
    log.info("Kafka %s of transactional id %r from %s: %s (%s)", what, txn_id, conn.peer, code.name, why)
    return code


def fenced_known(h: RequestHeader) -> bool:
    """Whether the request's version knows PRODUCER_FENCED (KIP-588); older ones get
    INVALID_PRODUCER_EPOCH, as Kafka answers them."""
    return h.api_version >= (4 if h.api_key == ApiKey.INIT_PRODUCER_ID else 2)


def refusal(conn: Conn, h: RequestHeader, what: str, txn_id: str, why: TxnRefusal) -> ErrorCode:
    """The service's refusal as the request version's code, logged."""
    return refused(conn, what, txn_id, why.code_for(fenced_known(h)), why.name)


async def _call(conn: Conn, h: RequestHeader, what: str, txn_id: str,
                work: Awaitable[TxnRefusal | None]) -> ErrorCode:
    """Run the coordinator call `work` (a coroutine) here if this broker coordinates `txn_id`:
    NONE, or Kafka's code for why not."""
    other = ErrorCode.INVALID_REQUEST if not txn_id else _elsewhere(conn, txn_id)   # Kafka's answer to none
    if other is not None:
        getattr(work, "close", lambda: None)()   # not awaited: the coroutine is dropped unstarted
        return refused(conn, what, txn_id, other, "coordinated by another broker" if txn_id else "no transactional id")
    why = await work
    return ErrorCode.NONE if why is None else refusal(conn, h, what, txn_id, why)


def _init_producer_id(conn: Conn, h: RequestHeader, body: Reader) -> Response:
    transactional_id, timeout_ms = decode_init_producer_id(body)
    if transactional_id is not None:
        return asyncio.ensure_future(_init_transactional(conn, h, transactional_id, timeout_ms))
    # Random, so brokers hand out ids without coordinating (see mapping.PRODUCER_ID_BITS).
    return encode_init_producer_id(h, ErrorCode.NONE, secrets.randbits(PRODUCER_ID_BITS), 0)


async def _init_transactional(conn: Conn, h: RequestHeader, txn_id: str, timeout_ms: int) -> bytes:
    """The coordinator's producer id and a bumped epoch for `txn_id` (the previous producer is
    fenced, its open transaction aborted: `Transactions.init_producer_id`)."""
    other = _elsewhere(conn, txn_id)
    if other is not None:
        refused(conn, "InitProducerId", txn_id, other, "coordinated by another broker")
        return encode_init_producer_id(h, other, -1, -1)
    ids = await conn.core.txns.init_producer_id(txn_id, timeout_ms)
    if not isinstance(ids, ProducerIds):
        return encode_init_producer_id(h, refusal(conn, h, "InitProducerId", txn_id, ids), -1, -1)
    return encode_init_producer_id(h, ErrorCode.NONE, ids.producer_id, ids.epoch)


async def _add_partitions(conn: Conn, h: RequestHeader, req: Any) -> bytes:
    txn_id, pid, epoch = (req.v3_and_below_transactional_id, req.v3_and_below_producer_id,
                          req.v3_and_below_producer_epoch)
    guard = conn.core.guard
    asked = [(t.name, p) for t in req.v3_and_below_topics for p in t.partitions]
    denied = {t for t, _ in asked if not guard.allowed(conn.principal, Operation.PRODUCE, t)}
    codes: dict[tuple[str, int], ErrorCode]
    if denied:   # as Kafka: nothing is added, the others answer OPERATION_NOT_ATTEMPTED
        refused(conn, "AddPartitionsToTxn", txn_id, ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                f"principal {conn.principal} may not produce to {sorted(denied)}")
        codes = {(t, p): ErrorCode.TOPIC_AUTHORIZATION_FAILED if t in denied else ErrorCode.OPERATION_NOT_ATTEMPTED
                 for t, p in asked}
    else:
        known = conn.core.metadata().topics
        unknown = {(t, p) for t, p in asked if t not in known or not 0 <= p < known[t].read_partitions}
        if unknown:
            refused(conn, "AddPartitionsToTxn", txn_id, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{sorted(unknown)}")
            codes = {tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if tp in unknown else ErrorCode.OPERATION_NOT_ATTEMPTED
                     for tp in asked}
        else:
            code = await _call(conn, h, "AddPartitionsToTxn", txn_id,
                               conn.core.txns.add_partitions(txn_id, ProducerIds(pid, epoch), asked))
            codes = dict.fromkeys(asked, code)
    by_topic: dict[str, list[Any]] = {}
    for (t, p), code in codes.items():
        by_topic.setdefault(t, []).append(_PartResult(partition_index=p, partition_error_code=int(code)))
    return encode_response(h, AddPartitionsToTxnResponse(throttle_time_ms=0, results_by_topic_v3_and_below=[
        _TopicResult(name=t, results_by_partition=parts) for t, parts in by_topic.items()]))


async def _add_offsets(conn: Conn, h: RequestHeader, req: Any) -> bytes:
    if not conn.core.guard.allowed_group(conn.principal, Operation.CONSUME, req.group_id):
        code = refused(conn, "AddOffsetsToTxn", req.transactional_id, ErrorCode.GROUP_AUTHORIZATION_FAILED,
                       f"principal {conn.principal} may not consume as group {req.group_id!r}")
    else:
        code = await _call(conn, h, "AddOffsetsToTxn", req.transactional_id, conn.core.txns.add_offsets(
            req.transactional_id, ProducerIds(req.producer_id, req.producer_epoch), req.group_id))
    return encode_response(h, AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=int(code)))


async def _txn_offset_commit(conn: Conn, h: RequestHeader, req: Any) -> bytes:
    offsets = GroupOffsets(getattr(req, "generation_id", -1), getattr(req, "member_id", ""),
                           getattr(req, "group_instance_id", None),
                           {(t.name, p.partition_index): (p.committed_offset, p.committed_metadata or "")
                            for t in req.topics for p in t.partitions})
    if not req.transactional_id:
        code = refused(conn, "TxnOffsetCommit", req.transactional_id, ErrorCode.INVALID_REQUEST, "no transactional id")
    elif not conn.core.guard.allowed_group(conn.principal, Operation.CONSUME, req.group_id):
        code = refused(conn, "TxnOffsetCommit", req.transactional_id, ErrorCode.GROUP_AUTHORIZATION_FAILED,
                       f"principal {conn.principal} may not consume as group {req.group_id!r}")
    elif (fenced := await conn.core.group_coordinator.txn_commit_error(req.group_id, offsets.member_id,
                                                                       offsets.generation)):
        code = refused(conn, "TxnOffsetCommit", req.transactional_id, fenced,
                       f"member {offsets.member_id!r} at generation {offsets.generation} of group {req.group_id!r}")
    else:
        # sent to the group's coordinator, not the transaction's: the group's checks are there
        why = await conn.core.txns.stash_offsets(
            req.transactional_id, ProducerIds(req.producer_id, req.producer_epoch), req.group_id, offsets)
        code = ErrorCode.NONE if why is None else refusal(conn, h, "TxnOffsetCommit", req.transactional_id, why)
    return encode_response(h, TxnOffsetCommitResponse(throttle_time_ms=0, topics=[
        _OffsetTopic(name=t.name, partitions=[_OffsetPart(partition_index=p.partition_index, error_code=int(code))
                                              for p in t.partitions]) for t in req.topics]))


async def _end_txn(conn: Conn, h: RequestHeader, req: Any) -> bytes:
    what = "EndTxn(commit)" if req.committed else "EndTxn(abort)"
    code = await _call(conn, h, what, req.transactional_id, conn.core.txns.end(
        req.transactional_id, ProducerIds(req.producer_id, req.producer_epoch), req.committed))
    if code is ErrorCode.NONE:
        log.debug("Kafka %s of transactional id %r from %s", what, req.transactional_id, conn.peer)
    return encode_response(h, EndTxnResponse(throttle_time_ms=0, error_code=int(code)))


_SERVED = {
    ApiKey.ADD_PARTITIONS_TO_TXN: (AddPartitionsToTxnRequest, _add_partitions),
    ApiKey.ADD_OFFSETS_TO_TXN: (AddOffsetsToTxnRequest, _add_offsets),
    ApiKey.TXN_OFFSET_COMMIT: (TxnOffsetCommitRequest, _txn_offset_commit),
    ApiKey.END_TXN: (EndTxnRequest, _end_txn),
}


async def serve(conn: Conn, h: RequestHeader, body: Reader) -> Response:
    """Answered in turn; the connection reads on while ZooKeeper answers."""
    if h.api_key == ApiKey.INIT_PRODUCER_ID:
        return _init_producer_id(conn, h, body)
    cls, answer = _SERVED[ApiKey(h.api_key)]
    return asyncio.ensure_future(answer(conn, h, decode_request(cls, h, body)))


FAMILY = Family(
    "transactions",
    {ApiKey.INIT_PRODUCER_ID: (0, 1), ApiKey.ADD_PARTITIONS_TO_TXN: (0, 3), ApiKey.ADD_OFFSETS_TO_TXN: (0, 3), ApiKey.TXN_OFFSET_COMMIT: (0, 3),
     ApiKey.END_TXN: (0, 3)},
    "produce on each topic added; consume on the group whose offsets are committed (InitProducerId, EndTxn: "
    "an authenticated principal)",
    serve)
