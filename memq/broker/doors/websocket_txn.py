"""Transactions on memq's own produce protocol: a producer's calls and its transactional Messages.

The WebSocket door (doors/websocket.py) hands each transaction call (memq.format.txn_wire) and
each version 4 request (a Message inside a transaction) here, and queues the ack this returns.
Both go to the broker's one `Transactions` service (memq.broker.txn), the one the Kafka door
uses: the same state in the same store, the same checks, and a transactional Message is stored
as an object of its own at once and recorded as a pending entry of its transaction, exactly as a
Kafka transactional produce is, never published before the commit. memq's producer has no
partitions: its topics join a transaction as partition `MEMQ_PARTITION` (-1); a Message that names
its read partition (keyed records, placed by key) is published there at the commit, one that
names none where Kafka's partitioner picks.

Every refusal is an ack naming Kafka's reason (`REFUSALS` maps it to memq's code) and a log line.
A principal needs `produce` on every topic it adds. A Consumer group's offsets (`offsets`) are
refused for now: the service's relay commits Kafka clients' offsets under their mapped group, and
memq's Consumer commits notification offsets under its own group id.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from memq.errors import MemqError, StorageError
from memq.format.message import MessageHeader
from memq.format.txn_wire import TxnCall, TxnOp
from memq.format.wire import Ack, AckCode, AckLevel, ProduceRequest
from memq.security.acl import Operation

from ..admission import Ticket
from ..seam import BrokerCore
from ..txn.service import GroupOffsets, ProducerIds, TxnRefusal

log = logging.getLogger(__name__)

#: The partition a memq producer's topic joins a transaction as: memq's protocol has none.
MEMQ_PARTITION = -1
DEFAULT_TIMEOUT_MS = 60_000

#: A refusal as memq's ack code: FENCED ends the producer, TXN_BUSY is retried, TXN_STATE is a misuse.
REFUSALS: dict[TxnRefusal, AckCode] = {
    TxnRefusal.NOT_COORDINATOR: AckCode.TXN_BUSY,
    TxnRefusal.COORDINATOR_NOT_AVAILABLE: AckCode.TXN_BUSY,
    TxnRefusal.CONCURRENT_TRANSACTIONS: AckCode.TXN_BUSY,
    TxnRefusal.INVALID_TXN_STATE: AckCode.TXN_STATE,
    TxnRefusal.PRODUCER_FENCED: AckCode.FENCED,
    TxnRefusal.INVALID_PRODUCER_EPOCH: AckCode.FENCED,
    TxnRefusal.INVALID_PRODUCER_ID_MAPPING: AckCode.FENCED,
    TxnRefusal.INVALID_TRANSACTION_TIMEOUT: AckCode.TXN_STATE,
}


def refused(request_id: int, refusal: TxnRefusal, what: str, peer: str) -> Ack:
    """The ack of a refused call or Message, logged."""
    code = REFUSALS[refusal]
    log.info("transaction %s from %s refused: %s", what, peer, refusal.name)
    return Ack(request_id, False, code, f"{what}: {refusal.name}")


async def answer_call(core: BrokerCore, principal: str | None, peer: str, call: TxnCall) -> Ack:
    """Carry out one call; its ack (an init's carries the producer id and epoch). A failure of the
    store or of Kafka is a retriable TXN_BUSY (the service's state steps are safe to repeat)."""
    try:
        return await _answer(core, principal, peer, call)
    except MemqError as e:
        log.warning("transaction %s of %r from %s failed: %s", call.op, call.transactional_id, peer, e)
        return Ack(call.request_id, False, AckCode.TXN_BUSY, f"{call.op}: {e}")


async def _answer(core: BrokerCore, principal: str | None, peer: str, call: TxnCall) -> Ack:
    txns = core.txns
    txn = call.transactional_id
    what = f"{call.op} of {txn!r}"
    ids = ProducerIds(call.producer_id, call.epoch)
    outcome: ProducerIds | TxnRefusal | None
    if call.op is TxnOp.INIT:
        outcome = await txns.init_producer_id(txn, call.timeout_ms or DEFAULT_TIMEOUT_MS)
        if isinstance(outcome, ProducerIds):
            log.info("transactional id %r from %s: producer id %d epoch %d", txn, peer, outcome.producer_id,
                     outcome.epoch)
            return Ack(call.request_id, True, producer_id=outcome.producer_id, epoch=outcome.epoch)
    elif call.op is TxnOp.ADD:
        denied = [t for t in call.topics if not core.guard.allowed(principal, Operation.PRODUCE, t)]
        if denied:
            return _denied(call, principal, Operation.PRODUCE, denied[0], peer)
        outcome = await txns.add_partitions(txn, ids, [(t, MEMQ_PARTITION) for t in call.topics])
    elif call.op is TxnOp.OFFSETS:
        # memq's Consumer commits notification offsets under its own group id (`native`), not
        # under the mapped group Kafka clients' groups use
        if not core.guard.allowed_group(principal, Operation.CONSUME, call.group):
            log.info("transaction offsets of %r for group %r from %s refused: principal %s may not consume it",
                     txn, call.group, peer, principal)
            return Ack(call.request_id, False, AckCode.DENIED,
                       f"principal {principal} may not consume group {call.group!r}")
        outcome = await txns.add_offsets(txn, ids, call.group)
        if outcome is None:
            offsets = {(call.topic, p): (o, "") for p, o in await _positions(core, call.topic, call.offsets)}
            outcome = await txns.stash_offsets(txn, ids, call.group, GroupOffsets(offsets=offsets, native=True))
    else:
        outcome = await txns.end(txn, ids, call.commit)
    if isinstance(outcome, TxnRefusal):
        return refused(call.request_id, outcome, what, peer)
    return Ack(call.request_id, True)


async def _positions(core: BrokerCore, topic: str, offsets: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """A memq Consumer's next offsets as the notification Kafka keeps them: notification offsets
    as given, or on a dense topic its record offsets' notifications (`Consumer.position()` gives a
    part's first record; one inside a part commits the part, read again from its start)."""
    meta = core.metadata().topics.get(topic)
    if meta is None or meta.offsets != "dense":
        return list(offsets)
    return [(p, (await core.logs.bases.scheme(meta, p)).position_of(o)[0]) for p, o in offsets]


def _denied(call: TxnCall, principal: str | None, op: Operation, topic: str, peer: str) -> Ack:
    log.info("transaction %s of %r from %s: principal %s may not %s topic %s", call.op, call.transactional_id,
             peer, principal, op, topic)
    return Ack(call.request_id, False, AckCode.DENIED, f"principal {principal} may not {op} topic {topic}")


async def store_message(core: BrokerCore, ticket: Ticket, req: ProduceRequest, header: MessageHeader,
                        peer: str) -> Ack:
    """Store one transactional Message as an object of its own and record it as pending in its
    transaction (`Transactions.store_pending`, the Kafka door's call: check, store apart, add
    pending; not audited there: memq's Producer reports its own Messages); the ack once both are
    durable (before that, nothing of it is visible). Refused after the store: the object is an
    orphan the janitor collects."""
    if req.ack is not AckLevel.ALL:
        return Ack(req.request_id, False, AckCode.PROTOCOL,
                   f"request {req.request_id}: a transactional Message must ask for ack=all")
    ids = ProducerIds(header.producer_id, header.epoch)
    try:
        refusal = await core.txns.store_pending(req.transactional_id, ids, ticket, MEMQ_PARTITION, [req.message],
                                                [header], audit=False)
    except MemqError as e:   # a retry stores it again: the first copy, if any, is an orphan or a duplicate
        log.warning("transactional Message %d of %r to %s from %s not stored: %s", header.sequence,
                    req.transactional_id, req.topic, peer, e)
        return Ack(req.request_id, False, AckCode.STORAGE if isinstance(e, StorageError) else AckCode.TXN_BUSY, str(e))
    if refusal is not None:
        return refused(req.request_id, refusal, f"produce to {req.topic} in {req.transactional_id!r}", peer)
    return Ack(req.request_id, True)
