"""The broker's transactions: Kafka's transaction coordinator and the partition leaders' side.

Nothing uncommitted is ever published. A transactional produce stores its records as an object
at once (as any produce), but its notification is kept as a *pending* entry of the transaction
in the store (`add_pending`), not published. EndTxn(commit) makes the durable decision
(Ongoing -> PrepareCommit), publishes every pending notification through the broker's publish
path (`memq.broker.publish`: the one every notification takes, with its retries and metrics; a
commit's failed publish is published again there for up to `COMMIT_PUBLISH_S`), commits the
stashed group offsets through the group relay, drops the pending entries and writes
CompleteCommit; an abort
drops the pending entries (the objects are then orphans the janitor collects). Readers see only
published notifications, so read_committed holds by construction (LSO = high watermark).

A crash at any step is finished by recovery: the coordinator completes every Prepare* state it
finds (at start, on InitProducerId, in its periodic scan); publishing a notification twice is
harmless (readers drop a retried Message by producer id, epoch and sequence). The scan also
aborts, with the epoch bumped, an Ongoing transaction older than its `transaction.timeout.ms`.

Every method is safe to call on any broker: state changes are compare-and-set writes, retried
on a conflict. Which broker coordinates a transactional id is `memq.broker.coordinator`'s; the doors answer
NOT_COORDINATOR elsewhere (the service does not check it). Refusals are `TxnRefusal`s, Kafka's
errors; a store that cannot be reached is COORDINATOR_NOT_AVAILABLE (the client retries).

The audit: a Kafka client has no audit emitter, so its transactional Messages are named in their
pending entry (`Audited`) and the coordinator reports them as produced once their notifications
are published (memq's Producer reports its own at commit). An abort reports, per topic, the
LogMessages it dropped (`TxnAudit.aborted`; the books count them apart) and counts them in
`memq_txn_aborted_records_total`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry

from memq.clock import Clock
from memq.config import TopicConfig
from memq.errors import CoordinationError, MemqError, NotifyError, TxnConflictError
from memq.format.message import MessageHeader
from memq.kafka_api.mapping import PRODUCER_ID_BITS

from ..publish import PublishPath
from . import state
from .metrics import TxnMetrics
from .state import (DEFAULT_ID_EXPIRATION_MS, DEFAULT_MAX_TIMEOUT_MS, GroupOffsets, ProducerIds, Step, TopicPartition, TxnRecord, TxnRefusal,
                    TxnState)
from .store import Audited, Pending, PendingEntry, TxnStore

__all__ = ["Audited", "GroupOffsets", "OffsetRelay", "Pending", "TxnAudit", "ProducerIds", "TopicPartition", "Transactions", "TxnRecord",
           "TxnRefusal", "TxnState"]

log = logging.getLogger(__name__)
T = TypeVar("T")
ATTEMPTS = 10        # compare-and-set retries before a call gives up (conflicts are rare: brokers race briefly)
CACHED_IDS = 10_000  # transactional ids whose state a broker keeps for its produce checks
SCAN_BATCH = 500     # ids a scan pass reads at most (the next pass carries on)
COMMIT_PUBLISH_S = 10.0   # an EndTxn's failed publish is published again this long (within the path's own
                          # notify_retry_ms), then left to the scan: the call holds the id's lock, a client waits


class OffsetRelay(Protocol):
    """Where a committed transaction's group offsets go: memq's group store for a Kafka client's
    group, the notification Kafka for memq Consumer's (memq.broker.group.txn_offsets)."""

    async def commit(self, group: str, offsets: GroupOffsets) -> dict[TopicPartition, int]:
        """Commit `offsets` (memq topic names) for `group`; the Kafka error code of each partition
        not committed (empty: all committed). Raises NotifyError or CoordinationError when they
        cannot be stored now (retried)."""

    def close(self) -> None:
        """Release the upstream connections."""


class TxnAudit(Protocol):
    """The coordinator's half of the audit sink (`memq.audit.emitter.AuditEmitter`)."""

    def produced(self, *, topic: str, producer_id: int, epoch: int, sequence: int, count: int,
                 digest: int, created_ms: int) -> None: ...

    def aborted(self, *, topic: str, count: int) -> None: ...


class Storer(Protocol):
    """What stores a transactional request's Messages as their own object (`admission.Ticket`)."""

    @property
    def config(self) -> TopicConfig: ...

    @property
    def partition(self) -> int:
        """The notification partition its Messages go to at the commit (-1: Kafka's pick)."""

    async def store_apart(self, messages: list[memoryview], headers: list[MessageHeader]) -> Pending:
        """Stored, not published: (notification topic, notification) for the pending entry."""


class Transactions:
    """One broker's transactions (see the module doc). `store` is a `TxnStore` (ZooKeeper, or
    memory without it), `path` the broker's publish path, `offsets` the group relay;
    `scan_s` the period of the scan over the transactions begun here, `full_scan_s` that of the
    scan over every id in the store (recovery of other coordinators' transactions, and ids unused
    for `id_expiration_ms` deleted); `audit` the broker's audit sink (None: audit disabled)."""

    def __init__(self, store: TxnStore, path: PublishPath, offsets: OffsetRelay, clock: Clock, *,
                 registry: CollectorRegistry | None = None, max_timeout_ms: int = DEFAULT_MAX_TIMEOUT_MS,
                 scan_s: float = 1.0, full_scan_s: float = 30.0,
                 id_expiration_ms: int = DEFAULT_ID_EXPIRATION_MS, audit: TxnAudit | None = None) -> None:
        self.store = store
        self._path = path
        self._offsets = offsets
        self._audit = audit
        self._clock = clock
        self.max_timeout_ms = max_timeout_ms
        self.scan_s = scan_s
        self.full_scan_s = full_scan_s
        self.id_expiration_ms = id_expiration_ms
        self.open: set[str] = set()   # ids this broker began a transaction of, until it ends
        self.metrics = TxnMetrics(registry or CollectorRegistry(), lambda: len(self.open))
        self._locks: dict[str, asyncio.Lock] = {}
        self._cache: OrderedDict[str, tuple[TxnRecord | None, int]] = OrderedDict()
        self._scanner: asyncio.Task[None] | None = None
        self._cursor = 0

    # --- the coordinator's calls ---------------------------------------------------------------

    async def init_producer_id(self, txn_id: str, timeout_ms: int,
                               current: ProducerIds | None = None) -> ProducerIds | TxnRefusal:
        """InitProducerId(transactional id): the producer id (allocated once per id) with its epoch
        bumped, fencing every earlier producer of `txn_id`. An Ongoing transaction is aborted first;
        a Prepare* one is finished first (recovery). `current`: the ids the producer already holds
        (KIP-360, InitProducerId v3+; None or producer id -1: a new producer). Refusals:
        INVALID_TRANSACTION_TIMEOUT, PRODUCER_FENCED / INVALID_PRODUCER_ID_MAPPING (`current` stale),
        CONCURRENT_TRANSACTIONS, COORDINATOR_NOT_AVAILABLE."""
        return await self._answer("InitProducerId", txn_id, self._init(txn_id, timeout_ms, current))

    async def _init(self, txn_id: str, timeout_ms: int, current: ProducerIds | None) -> ProducerIds | TxnRefusal:
        async with self._lock(txn_id):
            for _ in range(ATTEMPTS):
                rec, version = await self._read(txn_id)
                if rec is not None and rec.state.open:
                    if (refused := state.check_current(rec, current)) is not None:
                        return refused
                    if rec.state is TxnState.ONGOING:   # the previous producer's: aborted, that producer fenced
                        log.info("transaction %r: InitProducerId aborts the open transaction of epoch %d",
                                 txn_id, rec.epoch)
                        try:
                            rec, version = await self._write(txn_id, _sure(state.abort_for_init(rec)), version)
                        except TxnConflictError:
                            continue
                    if not await self._finish(txn_id, rec, version):
                        return TxnRefusal.CONCURRENT_TRANSACTIONS
                    continue
                step = state.init(rec, timeout_ms, current, secrets.randbits(PRODUCER_ID_BITS), self._now_ms(),
                                  self.max_timeout_ms)
                if isinstance(step, TxnRefusal):
                    return step
                try:
                    await self._write(txn_id, step, version)
                except TxnConflictError:
                    continue
                return step.ids
            return TxnRefusal.CONCURRENT_TRANSACTIONS

    async def add_partitions(self, txn_id: str, ids: ProducerIds,
                             partitions: Iterable[TopicPartition]) -> TxnRefusal | None:
        """AddPartitionsToTxn (also memq's own producer before its first produce to a topic):
        begins the transaction if none is Ongoing. Refusals: PRODUCER_FENCED,
        INVALID_PRODUCER_ID_MAPPING, CONCURRENT_TRANSACTIONS (the previous one is being finished:
        retry), COORDINATOR_NOT_AVAILABLE. The door checks topics and ACLs before."""
        added = frozenset(partitions)
        now = self._now_ms()
        return await self._answer("AddPartitionsToTxn", txn_id,
                                  self._step(txn_id, lambda rec: state.add_partitions(rec, ids, added, now)))

    async def add_offsets(self, txn_id: str, ids: ProducerIds, group: str) -> TxnRefusal | None:
        """AddOffsetsToTxn: `group`'s offsets (sent next by TxnOffsetCommit) commit with the
        transaction. Refusals as `add_partitions`."""
        now = self._now_ms()
        return await self._answer("AddOffsetsToTxn", txn_id,
                                  self._step(txn_id, lambda rec: state.add_offsets(rec, ids, group, now)))

    async def stash_offsets(self, txn_id: str, ids: ProducerIds, group: str,
                            offsets: GroupOffsets) -> TxnRefusal | None:
        """TxnOffsetCommit (any broker: every broker is a group coordinator): keep `offsets` in
        the transaction's state until EndTxn. The group must have been added (AddOffsetsToTxn)
        and the transaction Ongoing, else INVALID_TXN_STATE; PRODUCER_FENCED,
        INVALID_PRODUCER_ID_MAPPING, COORDINATOR_NOT_AVAILABLE."""
        return await self._answer("TxnOffsetCommit", txn_id,
                                  self._step(txn_id, lambda rec: state.stash_offsets(rec, ids, group, offsets)))

    async def _step(self, txn_id: str, step: Callable[[TxnRecord | None], Step]) -> TxnRefusal | None:
        async with self._lock(txn_id):
            for _ in range(ATTEMPTS):
                rec, version = await self._read(txn_id)
                nxt = step(rec)
                if isinstance(nxt, TxnRefusal):
                    return nxt
                if nxt == rec:
                    return None
                try:
                    await self._write(txn_id, nxt, version)
                except TxnConflictError:
                    continue
                if nxt.state is TxnState.ONGOING:
                    self.open.add(txn_id)
                return None
            return TxnRefusal.CONCURRENT_TRANSACTIONS

    async def end(self, txn_id: str, ids: ProducerIds, commit: bool) -> TxnRefusal | None:
        """EndTxn: commit (publish the pending notifications, commit the stashed offsets) or abort
        (drop them). Returns once the transaction is complete: committed data is then readable.
        A retried EndTxn of a completed transaction answers None again. If carrying out the
        decision fails after it was made durable (Kafka unreachable), None is answered all the
        same and recovery finishes it (the next call on `txn_id` sees CONCURRENT_TRANSACTIONS
        until then). Refusals: PRODUCER_FENCED, INVALID_PRODUCER_ID_MAPPING, INVALID_TXN_STATE
        (no transaction, or the other decision), CONCURRENT_TRANSACTIONS, COORDINATOR_NOT_AVAILABLE."""
        return await self._answer("EndTxn", txn_id, self._end(txn_id, ids, commit))

    async def _end(self, txn_id: str, ids: ProducerIds, commit: bool) -> TxnRefusal | None:
        started = self._clock.monotonic()
        async with self._lock(txn_id):
            for _ in range(ATTEMPTS):
                rec, version = await self._read(txn_id)
                step = state.end(rec, ids, commit)
                if isinstance(step, TxnRefusal):
                    return step
                if step == rec:   # a retry: already complete
                    return None
                try:
                    step, version = await self._write(txn_id, step, version)
                except TxnConflictError:
                    continue
                self.open.add(txn_id)   # until complete: this broker's scan retries it
                if await self._finish(txn_id, step, version, publish_s=COMMIT_PUBLISH_S):
                    self.metrics.end_seconds.labels("commit" if commit else "abort").observe(
                        self._clock.monotonic() - started)
                return None
            return TxnRefusal.CONCURRENT_TRANSACTIONS

    # --- the partition leaders' side -----------------------------------------------------------

    async def check_produce(self, txn_id: str, ids: ProducerIds, topic: str, partition: int) -> TxnRefusal | None:
        """A transactional produce (any broker), before storing its records: None if (`ids`) are
        the current producer's and (topic, partition) was added to the Ongoing transaction.
        Refusals: INVALID_PRODUCER_EPOCH (an old epoch or another producer id),
        INVALID_TXN_STATE (partition not added, or no transaction Ongoing),
        INVALID_PRODUCER_ID_MAPPING (unknown `txn_id`), COORDINATOR_NOT_AVAILABLE. Cheap when
        repeated (the state read is cached here; `add_pending` checks again atomically)."""
        checked = await self._answer("Produce", txn_id, self._checked(txn_id, ids, (topic, partition)))
        return checked if isinstance(checked, TxnRefusal) else None

    async def _checked(self, txn_id: str, ids: ProducerIds, tp: TopicPartition
                       ) -> tuple[TxnRecord | None, int] | TxnRefusal:
        """The state `tp`'s produce passes its check against (the cache's, else read afresh)."""
        cached = self._cache.get(txn_id)
        if cached is not None and state.check_produce(cached[0], ids, tp) is None:
            return cached
        rec, version = fresh = await self._read(txn_id)
        refused = state.check_produce(rec, ids, tp)
        return fresh if refused is None else refused

    async def add_pending(self, txn_id: str, ids: ProducerIds, topic: str, partition: int,
                          notes: Sequence[Pending], audited: Sequence[Audited] = (), placed: int = -1) -> TxnRefusal | None:
        """Once the records are stored: record their notifications (and `audited`, the Messages
        to report as produced at the commit; `placed`, the notification partition they go to,
        -1: Kafka's pick) as a pending entry of the transaction (one store
        create, atomic with the check `check_produce` makes, so no entry can join a transaction
        after its decision). None: the produce may be acked. A refusal (as `check_produce`'s)
        leaves the stored object an orphan; answer the refusal."""
        return await self._answer("Produce", txn_id,
                                  self._add_pending(txn_id, ids, (topic, partition), notes, audited, placed))

    async def _add_pending(self, txn_id: str, ids: ProducerIds, tp: TopicPartition, notes: Sequence[Pending],
                           audited: Sequence[Audited], placed: int) -> TxnRefusal | None:
        for _ in range(ATTEMPTS):
            checked = await self._checked(txn_id, ids, tp)
            if isinstance(checked, TxnRefusal):
                return checked
            try:
                await asyncio.to_thread(self.store.add_pending, txn_id, checked[1], notes, audited, placed)
            except TxnConflictError:
                self._cache.pop(txn_id, None)
                continue
            self.metrics.pending.inc(len(notes))
            return None
        return TxnRefusal.COORDINATOR_NOT_AVAILABLE   # retriable for a producer: it sends again

    async def store_pending(self, txn_id: str, ids: ProducerIds, ticket: Storer, partition: int,
                            messages: list[memoryview], headers: list[MessageHeader], *,
                            audit: bool = True, after: asyncio.Future[Any] | None = None) -> TxnRefusal | None:
        """The whole transactional produce of one request-partition (every door's):
        `check_produce`, the Messages stored as one object (`ticket.store_apart`: one PUT),
        `add_pending` naming them for the audit with `audit` (a Kafka client has no audit emitter:
        the coordinator reports them at the commit; memq's Producer reports its own). None: ack it
        (its offset unknown until the commit). A StorageError from the PUT propagates (the door
        answers it as any failed store). `after`: the same producer's previous produce of this
        partition, still under way: the PUTs overlap, but this entry is added once that one is
        done, so a commit publishes the batches in the order they were sent (pipelined requests'
        PUTs finish in any order)."""
        topic = ticket.config.name
        refused = await self.check_produce(txn_id, ids, topic, partition)
        if refused is not None:
            return refused
        pending = await ticket.store_apart(messages, headers)
        if after is not None and not after.done():
            await asyncio.wait([after])   # its outcome is its own request's answer
        audited = [Audited(topic, h.producer_id, h.epoch, h.sequence, h.count, h.body_crc32c, h.created_ms)
                   for h in headers if audit]
        return await self.add_pending(txn_id, ids, topic, partition, [pending], audited, ticket.partition)

    # --- inspection ----------------------------------------------------------------------------

    async def describe(self, txn_id: str) -> TxnRecord | None:
        """The stored state of `txn_id` (None: unknown) for DescribeTransactions and tests;
        MemqError when the store cannot be read."""
        return (await self._read(txn_id))[0]

    async def list_ids(self) -> list[str]:
        """Every transactional id with state in the store, sorted (ListTransactions); MemqError
        when the store cannot be read."""
        return await asyncio.to_thread(self.store.ids)

    # --- recovery and timeouts -----------------------------------------------------------------

    def start(self, mine: Callable[[str], bool]) -> None:
        """Start the periodic scan (the Broker calls it on start): finishes Prepare* states and
        aborts timed-out transactions of the ids `mine` says this broker coordinates now (its
        first pass, over every id in the store, is the recovery after a restart)."""
        if self._scanner is None:
            self._scanner = asyncio.get_running_loop().create_task(self._scan_loop(mine))

    async def close(self) -> None:
        """Stop the scan (the Broker calls it on stop); transactions under way stay in the store."""
        if self._scanner is not None:
            self._scanner.cancel()
            await asyncio.gather(self._scanner, return_exceptions=True)
            self._scanner = None
        self._offsets.close()

    async def _scan_loop(self, mine: Callable[[str], bool]) -> None:
        last_full = -self.full_scan_s
        while True:
            full = self._clock.monotonic() - last_full >= self.full_scan_s
            try:
                if full:
                    last_full = self._clock.monotonic()
                await self.scan(mine, full=full)
            except MemqError as e:
                log.warning("transactions: scan failed, retrying in %gs: %s", self.scan_s, e)
            except Exception:   # a bug must not end the scan: timeouts and recovery depend on it
                log.exception("transactions: scan failed unexpectedly, retrying in %gs", self.scan_s)
            await asyncio.sleep(self.scan_s)

    async def scan(self, mine: Callable[[str], bool], *, full: bool = False) -> int:
        """One pass (at most SCAN_BATCH ids): finish the Prepare* and abort the timed-out
        transactions of the ids begun here that `mine` (`full`: of every id in the store that
        `mine`, and delete those unused for `id_expiration_ms`); how many it finished, aborted or
        deleted. Only the coordinator tends an id: another broker finishing a commit the
        coordinator is carrying out publishes it twice, which readers drop only within the
        dedup window (`kafka_api.dedup`), not a whole transaction of more parts.
        MemqError when the store cannot be listed."""
        if full:
            ids = [i for i in await asyncio.to_thread(self.store.ids) if mine(i)]
            if self._cursor >= len(ids):
                self._cursor = 0
            batch = ids[self._cursor:self._cursor + SCAN_BATCH]
            self._cursor += len(batch)
        else:   # a group's coordinator stashing a TxnOffsetCommit opens the id here too: not ours to finish
            self.open -= {i for i in self.open if not mine(i)}
            batch = sorted(self.open)[:SCAN_BATCH]
        tended = 0
        for txn_id in batch:
            try:
                tended += await self._tend(txn_id)
            except MemqError as e:
                log.warning("transaction %r: not tended, next scan retries: %s", txn_id, e)
        return tended

    async def _tend(self, txn_id: str) -> bool:
        async with self._lock(txn_id):
            rec, version = await self._read(txn_id)
            if rec is None or not rec.state.open:
                self.open.discard(txn_id)
                if rec is None or not rec.forgotten(self._now_ms(), self.id_expiration_ms):
                    return False
                try:
                    await asyncio.to_thread(self.store.delete, txn_id, version)
                except TxnConflictError:   # its producer came back meanwhile
                    return False
                self._cache.pop(txn_id, None)
                self.metrics.expired_ids.inc()
                log.info("transactional id %r: unused for %d ms, forgotten", txn_id, self.id_expiration_ms)
                return True
            if rec.state is TxnState.ONGOING:
                if not rec.expired(self._now_ms()):
                    return False
                log.warning("transaction %r: aborted after its timeout of %d ms (producer %d epoch %d fenced)",
                            txn_id, rec.timeout_ms, rec.producer_id, rec.epoch)
                try:
                    rec, version = await self._write(txn_id, _sure(state.abort_for_init(rec)), version)
                except TxnConflictError:   # the producer moved on meanwhile: the next scan looks again
                    return False
                self.metrics.timeouts.inc()
            else:
                log.info("transaction %r: finishing %s (recovery)", txn_id, rec.state.value)
            return await self._finish(txn_id, rec, version)

    async def _finish(self, txn_id: str, rec: TxnRecord, version: int, *, publish_s: float = 0.0) -> bool:
        """Carry out a Prepare* decision: publish the pending notifications (through the publish
        path, publishing failed ones again for up to `publish_s`) and commit the group offsets
        (commit), drop the pending entries, write Complete*. False (logged) when Kafka failed: the
        decision stays, the scan finishes it later. Idempotent (recovery may repeat it)."""
        commit = rec.state is TxnState.PREPARE_COMMIT
        entries = await asyncio.to_thread(self.store.entries, txn_id)
        if commit:
            notes = [n for e in entries for n in e.notes]
            placed = [e.partition for e in entries for _ in e.notes]
            if notes:
                published = await self._path.publish(notes, None if max(placed) < 0 else placed, within_s=publish_s)
                failed = [r for r in published if isinstance(r, NotifyError)]
                if failed:
                    log.warning("transaction %r: %d of %d notifications not published, retried later: %s",
                                txn_id, len(failed), len(notes), failed[0])
                    return False
            self._report_produced(entries)   # again if retried: the audit counts a Message once
            for group, offsets in sorted(rec.offsets.items()):
                try:
                    errors = await self._offsets.commit(group, offsets)
                except (NotifyError, CoordinationError) as e:
                    log.warning("transaction %r: offsets of group %r not committed, retried later: %s",
                                txn_id, group, e)
                    return False
                if errors:   # refused for good (a rebalance changed the generation): told, not retried
                    self.metrics.offset_refusals.inc(len(errors))
                    log.warning("transaction %r: offsets of group %r not committed: %s", txn_id, group,
                                dict(sorted(errors.items())[:5]))
        await asyncio.to_thread(self.store.drop_pending, txn_id)
        if not commit:
            self._report_aborted(entries)
        try:
            await self._write(txn_id, state.complete(rec), version)
        except TxnConflictError:   # another broker finished it meanwhile
            return True
        self.open.discard(txn_id)
        (self.metrics.commits if commit else self.metrics.aborts).inc()
        return True

    def _report_produced(self, entries: list[PendingEntry]) -> None:
        """A committed transaction's Messages named for the audit, reported as produced."""
        if self._audit is not None:
            for a in (a for e in entries for a in e.audited):
                self._audit.produced(topic=a.topic, producer_id=a.producer_id, epoch=a.epoch, sequence=a.sequence,
                                     count=a.count, digest=a.digest, created_ms=a.created_ms)

    def _report_aborted(self, entries: list[PendingEntry]) -> None:
        """An aborted transaction's LogMessages, per topic: never readable, counted apart."""
        per_topic: dict[str, int] = {}
        for _, n in (n for e in entries for n in e.notes):
            per_topic[n.topic] = per_topic.get(n.topic, 0) + n.logmessage_count
        self.metrics.aborted_records.inc(sum(per_topic.values()))
        if self._audit is not None:
            for topic, count in sorted(per_topic.items()):
                self._audit.aborted(topic=topic, count=count)

    # --- helpers -------------------------------------------------------------------------------

    async def _answer(self, what: str, txn_id: str, work: Awaitable[T]) -> T | TxnRefusal:
        """`work`'s answer; a store failure is COORDINATOR_NOT_AVAILABLE (the client retries). Logged."""
        try:
            answer = await work
        except MemqError as e:
            log.warning("%s of transaction %r: store unavailable: %s", what, txn_id, e)
            return TxnRefusal.COORDINATOR_NOT_AVAILABLE
        if isinstance(answer, TxnRefusal):
            log.info("%s of transaction %r refused: %s", what, txn_id, answer.name)
        return answer

    def _lock(self, txn_id: str) -> asyncio.Lock:
        lock = self._locks.get(txn_id)
        if lock is None:
            if len(self._locks) > CACHED_IDS:   # drop the idle ones
                self._locks = {k: v for k, v in self._locks.items() if v.locked()}
            lock = self._locks[txn_id] = asyncio.Lock()
        return lock

    async def _read(self, txn_id: str) -> tuple[TxnRecord | None, int]:
        found = await asyncio.to_thread(self.store.read, txn_id)
        self._remember(txn_id, found)
        return found

    async def _write(self, txn_id: str, rec: TxnRecord, version: int) -> tuple[TxnRecord, int]:
        try:
            version = await asyncio.to_thread(self.store.write, txn_id, rec, version)
        except TxnConflictError:
            self._cache.pop(txn_id, None)
            raise
        self._remember(txn_id, (rec, version))
        return rec, version

    def _remember(self, txn_id: str, found: tuple[TxnRecord | None, int]) -> None:
        self._cache[txn_id] = found
        self._cache.move_to_end(txn_id)
        if len(self._cache) > CACHED_IDS:
            self._cache.popitem(last=False)

    def _now_ms(self) -> int:
        return int(self._clock.time() * 1000)


def _sure(step: Step) -> TxnRecord:
    """A step the caller made legal beforehand (an Ongoing record aborted)."""
    assert isinstance(step, TxnRecord), step
    return step
