"""A transactional id's state and its legal steps: pure (no I/O), Kafka's errors for every illegal one.

Empty -> Ongoing -> PrepareCommit -> CompleteCommit, Ongoing -> PrepareAbort -> CompleteAbort;
a Complete* (or Empty) state takes a new transaction (-> Ongoing) or a new producer (-> Empty,
epoch bumped). Every step is a function returning the next `TxnRecord` or a `TxnRefusal`;
the service writes the record with a compare-and-set, so each step is atomic across brokers.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from memq.kafka_api.protocol import ErrorCode

TopicPartition = tuple[str, int]
MAX_EPOCH = 32767   # Kafka's producer epoch is an int16: past it, a new producer id at epoch 0
DEFAULT_MAX_TIMEOUT_MS = 900_000   # Kafka's transaction.max.timeout.ms
DEFAULT_ID_EXPIRATION_MS = 604_800_000   # Kafka's transactional.id.expiration.ms (7 days)


class TxnState(enum.StrEnum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def preparing(self) -> bool:
        """The decision is made (durable) but not carried out yet: recovery finishes it."""
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def open(self) -> bool:
        """A transaction is under way or being finished (it holds pending notifications)."""
        return self is TxnState.ONGOING or self.preparing


class TxnRefusal(enum.Enum):
    """Why a transactional call is refused, as Kafka's error (`.code`); the doors answer it, log it."""

    NOT_COORDINATOR = ErrorCode.NOT_COORDINATOR                  # ask FindCoordinator again
    COORDINATOR_NOT_AVAILABLE = ErrorCode.COORDINATOR_NOT_AVAILABLE   # the store is unreachable: retry
    CONCURRENT_TRANSACTIONS = ErrorCode.CONCURRENT_TRANSACTIONS  # the previous one is being finished: retry
    INVALID_TXN_STATE = ErrorCode.INVALID_TXN_STATE              # this call is illegal in this state
    PRODUCER_FENCED = ErrorCode.PRODUCER_FENCED                  # a newer producer holds the id
    INVALID_PRODUCER_EPOCH = ErrorCode.INVALID_PRODUCER_EPOCH    # a produce with an old epoch
    INVALID_PRODUCER_ID_MAPPING = ErrorCode.INVALID_PRODUCER_ID_MAPPING   # unknown id, or another producer id
    INVALID_TRANSACTION_TIMEOUT = ErrorCode.INVALID_TRANSACTION_TIMEOUT   # <= 0 or > the maximum

    @property
    def code(self) -> ErrorCode:
        return self.value

    def code_for(self, fenced_known: bool) -> ErrorCode:
        """The code for a request version: clients before KIP-588 (InitProducerId < v4, EndTxn,
        AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit < v2) know PRODUCER_FENCED as
        INVALID_PRODUCER_EPOCH, as Kafka answers them."""
        if self is TxnRefusal.PRODUCER_FENCED and not fenced_known:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        return self.code


@dataclass(frozen=True, slots=True)
class ProducerIds:
    """A transactional producer's (producer id, epoch) as InitProducerId gave them."""

    producer_id: int
    epoch: int


@dataclass(frozen=True, slots=True)
class GroupOffsets:
    """A consumer group's offsets stashed by TxnOffsetCommit, committed with the transaction:
    relayed as an OffsetCommit with the member's generation and id (memq topic names). `native`:
    memq's own Consumer's group, whose offsets are notification offsets committed under the group
    id as is (not Kafka clients' mapped group)."""

    generation: int = -1
    member_id: str = ""
    instance_id: str | None = None
    offsets: Mapping[TopicPartition, tuple[int, str]] = field(default_factory=dict)   # -> (offset, metadata)
    native: bool = False

    def merged(self, newer: GroupOffsets) -> GroupOffsets:
        """`newer`'s member and offsets over these (a transaction may commit a group's offsets twice)."""
        return dataclasses.replace(newer, offsets={**self.offsets, **newer.offsets})


@dataclass(frozen=True, slots=True)
class TxnRecord:
    """What the store keeps per transactional id."""

    producer_id: int
    epoch: int
    state: TxnState = TxnState.EMPTY
    timeout_ms: int = 60_000
    started_ms: int = 0            # wall clock when it went Ongoing (timeouts)
    last_epoch: int = -1           # the epoch before a bump by a timeout (its producer may re-init with it)
    updated_ms: int = 0            # wall clock of its producer's last InitProducerId or new transaction
    partitions: frozenset[TopicPartition] = frozenset()
    groups: frozenset[str] = frozenset()
    offsets: Mapping[str, GroupOffsets] = field(default_factory=dict)   # group -> stashed offsets

    @property
    def ids(self) -> ProducerIds:
        return ProducerIds(self.producer_id, self.epoch)

    def expired(self, now_ms: int) -> bool:
        """Ongoing for longer than its transaction.timeout.ms."""
        return self.state is TxnState.ONGOING and now_ms - self.started_ms > self.timeout_ms

    def forgotten(self, now_ms: int, expiration_ms: int = DEFAULT_ID_EXPIRATION_MS) -> bool:
        """No transaction open and its producer silent for `expiration_ms`: the id may go (Kafka's
        transactional.id.expiration.ms); a producer coming back later gets a new producer id."""
        return not self.state.open and now_ms - max(self.updated_ms, self.started_ms) > expiration_ms


Step = TxnRecord | TxnRefusal


def _fenced(rec: TxnRecord, ids: ProducerIds, produce: bool = False) -> TxnRefusal | None:
    if rec.producer_id != ids.producer_id:
        return TxnRefusal.INVALID_PRODUCER_EPOCH if produce else TxnRefusal.INVALID_PRODUCER_ID_MAPPING
    if rec.epoch != ids.epoch:
        return TxnRefusal.INVALID_PRODUCER_EPOCH if produce else TxnRefusal.PRODUCER_FENCED
    return None


def check_current(rec: TxnRecord, current: ProducerIds | None) -> TxnRefusal | None:
    """InitProducerId's `current` ids (KIP-360: a producer re-initialising keeps its id) must be
    the stored ones, or the epoch before a timeout bumped it; None or producer id -1: a new producer."""
    if current is None or current.producer_id < 0:
        return None
    if current.producer_id != rec.producer_id:
        return TxnRefusal.INVALID_PRODUCER_ID_MAPPING
    if current.epoch not in (rec.epoch, rec.last_epoch):
        return TxnRefusal.PRODUCER_FENCED
    return None


def init(rec: TxnRecord | None, timeout_ms: int, current: ProducerIds | None, new_producer_id: int,
         now_ms: int, max_timeout_ms: int = DEFAULT_MAX_TIMEOUT_MS) -> Step:
    """InitProducerId: a new record (epoch 0, `new_producer_id`), or the epoch bumped (fencing the
    previous producer), state Empty. An Ongoing transaction must be aborted first (`abort_for_init`);
    a Prepare* one is still being finished (CONCURRENT_TRANSACTIONS). `current`: the ids the
    producer holds (KIP-360 re-init), checked against the stored ones."""
    if not 0 < timeout_ms <= max_timeout_ms:
        return TxnRefusal.INVALID_TRANSACTION_TIMEOUT
    if rec is None:
        return TxnRecord(new_producer_id, 0, timeout_ms=timeout_ms, updated_ms=now_ms)
    if rec.state.open:
        return TxnRefusal.CONCURRENT_TRANSACTIONS
    if (refused := check_current(rec, current)) is not None:
        return refused
    if rec.epoch >= MAX_EPOCH:
        return TxnRecord(new_producer_id, 0, timeout_ms=timeout_ms, updated_ms=now_ms)
    return TxnRecord(rec.producer_id, rec.epoch + 1, timeout_ms=timeout_ms, updated_ms=now_ms)


def abort_for_init(rec: TxnRecord) -> Step:
    """An InitProducerId (or a timeout) finds `rec` Ongoing: PrepareAbort with the epoch bumped,
    so the producer that left it is fenced from now on."""
    if rec.state is not TxnState.ONGOING:
        return TxnRefusal.INVALID_TXN_STATE
    if rec.epoch >= MAX_EPOCH:   # cannot bump: the next init moves to a new producer id anyway
        return dataclasses.replace(rec, state=TxnState.PREPARE_ABORT, last_epoch=rec.epoch)
    return dataclasses.replace(rec, state=TxnState.PREPARE_ABORT, epoch=rec.epoch + 1, last_epoch=rec.epoch)


def _begin(rec: TxnRecord, ids: ProducerIds, now_ms: int) -> Step:
    """The record ready to take partitions or groups: fenced checks, a new transaction begun if none."""
    if (refused := _fenced(rec, ids)) is not None:
        return refused
    if rec.state.preparing:
        return TxnRefusal.CONCURRENT_TRANSACTIONS
    if rec.state is TxnState.ONGOING:
        return rec
    return dataclasses.replace(rec, state=TxnState.ONGOING, started_ms=now_ms, updated_ms=now_ms,
                               partitions=frozenset(), groups=frozenset(), offsets={})


def add_partitions(rec: TxnRecord | None, ids: ProducerIds, partitions: Iterable[TopicPartition],
                   now_ms: int) -> Step:
    """AddPartitionsToTxn: the partitions join the transaction (begun by the first of them)."""
    if rec is None:
        return TxnRefusal.INVALID_PRODUCER_ID_MAPPING
    step = _begin(rec, ids, now_ms)
    if isinstance(step, TxnRefusal):
        return step
    return dataclasses.replace(step, partitions=step.partitions | frozenset(partitions))


def add_offsets(rec: TxnRecord | None, ids: ProducerIds, group: str, now_ms: int) -> Step:
    """AddOffsetsToTxn: the group's offsets will be committed with the transaction."""
    if rec is None:
        return TxnRefusal.INVALID_PRODUCER_ID_MAPPING
    step = _begin(rec, ids, now_ms)
    if isinstance(step, TxnRefusal):
        return step
    return dataclasses.replace(step, groups=step.groups | {group})


def stash_offsets(rec: TxnRecord | None, ids: ProducerIds, group: str, offsets: GroupOffsets) -> Step:
    """TxnOffsetCommit: the offsets kept in the state until the commit (an added group only)."""
    if rec is None:
        return TxnRefusal.INVALID_PRODUCER_ID_MAPPING
    if (refused := _fenced(rec, ids)) is not None:
        return refused
    if rec.state is not TxnState.ONGOING or group not in rec.groups:
        return TxnRefusal.INVALID_TXN_STATE
    old = rec.offsets.get(group)
    return dataclasses.replace(rec, offsets={**rec.offsets, group: old.merged(offsets) if old else offsets})


def check_produce(rec: TxnRecord | None, ids: ProducerIds, partition: TopicPartition) -> TxnRefusal | None:
    """A transactional produce to `partition`: its producer current, the partition added."""
    if rec is None:
        return TxnRefusal.INVALID_PRODUCER_ID_MAPPING
    if (refused := _fenced(rec, ids, produce=True)) is not None:
        return refused
    if rec.state is not TxnState.ONGOING or partition not in rec.partitions:
        return TxnRefusal.INVALID_TXN_STATE
    return None


def end(rec: TxnRecord | None, ids: ProducerIds, commit: bool) -> Step:
    """EndTxn: Ongoing -> Prepare{Commit,Abort} (the decision). A retried EndTxn of a finished
    transaction answers as it did; one being finished is CONCURRENT_TRANSACTIONS."""
    if rec is None:
        return TxnRefusal.INVALID_PRODUCER_ID_MAPPING
    if (refused := _fenced(rec, ids)) is not None:
        return refused
    if rec.state is TxnState.ONGOING:
        return dataclasses.replace(rec, state=TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT)
    done, preparing = ((TxnState.COMPLETE_COMMIT, TxnState.PREPARE_COMMIT) if commit
                       else (TxnState.COMPLETE_ABORT, TxnState.PREPARE_ABORT))
    if rec.state is done:
        return rec
    if rec.state is preparing:
        return TxnRefusal.CONCURRENT_TRANSACTIONS
    return TxnRefusal.INVALID_TXN_STATE


def complete(rec: TxnRecord) -> TxnRecord:
    """Prepare* -> Complete* once carried out (pending published or dropped, offsets committed)."""
    state = {TxnState.PREPARE_COMMIT: TxnState.COMPLETE_COMMIT,
             TxnState.PREPARE_ABORT: TxnState.COMPLETE_ABORT}.get(rec.state, rec.state)
    return dataclasses.replace(rec, state=state, partitions=frozenset(), groups=frozenset(), offsets={})
