"""memq.broker.txn.service.Transactions without I/O: a memory store, a fake publisher and group relay.

Nothing uncommitted is published: a commit publishes each pending notification once and commits
the stashed offsets, an abort drops them; fencing, timeouts, recovery of a decided transaction,
and the atomicity of a pending entry with the check it passed."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from memq.broker.txn.service import (
    GroupOffsets,
    Pending,
    ProducerIds,
    Transactions,
    TxnRefusal,
    TxnState,
)
from memq.broker.txn.store import MemoryTxnStore
from memq.config import TopicConfig
from memq.errors import CoordinationError
from memq.format.message import Codec, MessageHeader
from memq.format.notification import Notification
from tests.support.clock import FakeClock
from tests.support.txn_fakes import FakeAudit, FakePublisher, FakeRelay, publish_path


def note(key: str) -> Notification:
    return Notification(2, "t", "bucket", key, 10, 4, 1, 0, 1, 2, 3, "b1", 0, 5)


class Rig:
    def __init__(self, store: MemoryTxnStore | None = None, republish_s: float = 0.0) -> None:
        self.store = store or MemoryTxnStore()
        self.publisher = FakePublisher()
        self.relay = FakeRelay()
        self.audit = FakeAudit()
        self.clock = FakeClock()
        self.registry = CollectorRegistry()
        path = publish_path(self.publisher, self.registry, self.clock, republish_s)   # the broker's, as its notes take
        self.txns = Transactions(self.store, path, self.relay, self.clock, registry=self.registry,
                                 scan_s=0.01, audit=self.audit)

    def metric(self, name: str) -> float:
        return self.registry.get_sample_value(name) or 0.0

    async def produce(self, txn: str, ids: ProducerIds, key: str, partition: int = 0) -> TxnRefusal | None:
        refused = await self.txns.check_produce(txn, ids, "t", partition)
        return refused or await self.txns.add_pending(txn, ids, "t", partition, [("memq.c.t", note(key))])


async def begun(rig: Rig, txn: str = "tx", partitions: Sequence[int] = (0,)) -> ProducerIds:
    ids = await rig.txns.init_producer_id(txn, 60_000)
    assert isinstance(ids, ProducerIds)
    assert await rig.txns.add_partitions(txn, ids, [("t", p) for p in partitions]) is None
    return ids


async def test_commit_publishes_pending_once_and_commits_offsets() -> None:
    rig = Rig()
    ids = await begun(rig)
    assert await rig.txns.add_offsets("tx", ids, "g") is None
    offsets = GroupOffsets(3, "m", None, {("in", 0): (41, "")})
    assert await rig.txns.stash_offsets("tx", ids, "g", offsets) is None
    assert await rig.produce("tx", ids, "k1") is None
    assert await rig.produce("tx", ids, "k2") is None
    assert rig.publisher.published == []   # nothing before the commit
    assert rig.store.pending_objects() == {"k1", "k2"}
    assert await rig.txns.end("tx", ids, commit=True) is None
    assert [n.key for _, n in rig.publisher.published] == ["k1", "k2"]
    assert rig.relay.commits == [("g", offsets)]
    rec = await rig.txns.describe("tx")
    assert rec is not None and rec.state is TxnState.COMPLETE_COMMIT and not rec.offsets
    assert rig.store.pending("tx") == [] and rig.store.pending_objects() == set()
    assert await rig.txns.end("tx", ids, commit=True) is None   # a retried EndTxn: answered again, nothing twice
    assert len(rig.publisher.published) == 2
    assert rig.metric("memq_txn_commits_total") == 1 and rig.metric("memq_txn_open") == 0
    assert rig.metric("memq_txn_pending_notifications_total") == 2


async def test_abort_drops_pending_and_publishes_nothing() -> None:
    rig = Rig()
    ids = await begun(rig)
    assert await rig.produce("tx", ids, "b") is None
    assert await rig.txns.end("tx", ids, commit=False) is None
    assert rig.publisher.published == [] and rig.store.pending("tx") == []
    assert await rig.txns.end("tx", ids, commit=True) is TxnRefusal.INVALID_TXN_STATE
    assert rig.metric("memq_txn_aborts_total") == 1
    assert await rig.txns.add_partitions("tx", ids, [("t", 0)]) is None   # the next transaction
    assert await rig.produce("tx", ids, "c") is None
    assert await rig.txns.end("tx", ids, commit=True) is None
    assert [n.key for _, n in rig.publisher.published] == ["c"]


async def test_a_new_producer_fences_the_old_one_and_aborts_its_transaction() -> None:
    rig = Rig()
    old = await begun(rig)
    assert await rig.produce("tx", old, "zombie") is None
    new = await rig.txns.init_producer_id("tx", 60_000)
    assert isinstance(new, ProducerIds) and new.producer_id == old.producer_id and new.epoch > old.epoch
    assert rig.store.pending("tx") == [] and rig.metric("memq_txn_aborts_total") == 1
    assert await rig.txns.add_partitions("tx", old, [("t", 0)]) is TxnRefusal.PRODUCER_FENCED
    assert await rig.txns.end("tx", old, commit=True) is TxnRefusal.PRODUCER_FENCED
    assert await rig.produce("tx", old, "late") is TxnRefusal.INVALID_PRODUCER_EPOCH
    assert await rig.txns.init_producer_id("tx", 60_000, current=old) is TxnRefusal.PRODUCER_FENCED
    assert rig.publisher.published == []


async def test_produce_checks() -> None:
    rig = Rig()
    ids = await begun(rig)
    assert await rig.produce("tx", ids, "k", partition=1) is TxnRefusal.INVALID_TXN_STATE   # not added
    assert await rig.produce("nobody", ids, "k") is TxnRefusal.INVALID_PRODUCER_ID_MAPPING
    assert await rig.txns.init_producer_id("tx", 0) is TxnRefusal.INVALID_TRANSACTION_TIMEOUT


async def test_no_pending_entry_joins_a_decided_transaction() -> None:
    """A produce checked before EndTxn, its object stored after: its entry is refused, not lost in a commit."""
    coordinator = Rig()
    leader = Rig(coordinator.store)   # the partition leader, another broker
    ids = await begun(coordinator)
    assert await leader.txns.check_produce("tx", ids, "t", 0) is None   # cached there as Ongoing
    assert await coordinator.txns.end("tx", ids, commit=True) is None
    refused = await leader.txns.add_pending("tx", ids, "t", 0, [("memq.c.t", note("late"))])
    assert refused is TxnRefusal.INVALID_TXN_STATE and coordinator.store.pending("tx") == []


async def test_a_stale_cache_on_another_broker_retries_its_pending_entry() -> None:
    coordinator = Rig()
    leader = Rig(coordinator.store)
    ids = await begun(coordinator)
    assert await leader.txns.check_produce("tx", ids, "t", 0) is None   # cached at this version
    assert await coordinator.txns.add_partitions("tx", ids, [("t", 1)]) is None   # version moves on
    assert await leader.produce("tx", ids, "k") is None
    assert await leader.produce("tx", ids, "k1", partition=1) is None   # re-read: partition 1 added since
    assert [n.key for _, n in coordinator.store.pending("tx")] == ["k", "k1"]


async def test_a_failed_publish_keeps_the_decision_and_recovery_finishes_it() -> None:
    rig = Rig()
    ids = await begun(rig)
    assert await rig.produce("tx", ids, "k") is None
    rig.publisher.failing = True
    assert await rig.txns.end("tx", ids, commit=True) is None   # decided: the answer is the decision
    rec = await rig.txns.describe("tx")
    assert rec is not None and rec.state is TxnState.PREPARE_COMMIT
    assert await rig.txns.add_partitions("tx", ids, [("t", 0)]) is TxnRefusal.CONCURRENT_TRANSACTIONS
    assert await rig.txns.init_producer_id("tx", 60_000) is TxnRefusal.CONCURRENT_TRANSACTIONS
    rig.publisher.failing = False
    other = Rig(rig.store)   # a broker that took over the coordination after a crash
    assert await other.txns.scan(lambda _: True, full=True) == 1
    assert [n.key for _, n in other.publisher.published] == ["k"]
    rec = await rig.txns.describe("tx")
    assert rec is not None and rec.state is TxnState.COMPLETE_COMMIT


async def test_a_commits_failed_publish_is_published_again_on_the_publish_path_not_left_to_the_scan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit's notifications take the broker's publish path: a first publish that fails is
    published again there (counted), so EndTxn answers with the transaction complete (no scan
    ran), each note published once and counted in the notification bytes of its topic."""
    monkeypatch.setattr("memq.broker.publish.REPUBLISH_BACKOFF_S", (0.01, 0.01))
    rig = Rig(republish_s=5.0)
    ids = await begun(rig)
    assert await rig.produce("tx", ids, "k1") is None
    assert await rig.produce("tx", ids, "k2") is None
    rig.publisher.fail_next = 1
    assert await rig.txns.end("tx", ids, commit=True) is None
    rec = await rig.txns.describe("tx")
    assert rec is not None and rec.state is TxnState.COMPLETE_COMMIT and rig.txns.open == set()
    assert rig.publisher.calls == 2 and [n.key for _, n in rig.publisher.published] == ["k1", "k2"]
    assert rig.metric("memq_broker_republished_notifications_total") == 2
    assert rig.metric("memq_txn_commits_total") == 1
    size = len(note("k1").to_bytes())
    assert rig.registry.get_sample_value("memq_broker_notification_bytes_total", {"topic": "t"}) == 2 * size


async def test_recovery_skips_ids_another_broker_coordinates() -> None:
    rig = Rig()
    ids = await begun(rig)
    rig.publisher.failing = True
    await rig.txns.end("tx", ids, commit=True)
    other = Rig(rig.store)
    assert await other.txns.scan(lambda _: False, full=True) == 0
    assert other.publisher.published == []


async def test_a_vanished_producer_is_aborted_after_its_timeout_and_fenced() -> None:
    rig = Rig()
    ids = await rig.txns.init_producer_id("tx", 5_000)
    assert isinstance(ids, ProducerIds)
    assert await rig.txns.add_partitions("tx", ids, [("t", 0)]) is None
    assert await rig.produce("tx", ids, "k") is None
    rig.clock.advance(4)
    assert await rig.txns.scan(lambda _: True) == 0
    rig.clock.advance(2)
    assert await rig.txns.scan(lambda _: True) == 1
    rec = await rig.txns.describe("tx")
    assert rec is not None and rec.state is TxnState.COMPLETE_ABORT and rec.epoch == ids.epoch + 1
    assert rig.store.pending("tx") == [] and rig.publisher.published == []
    assert rig.metric("memq_txn_timeouts_total") == 1 and rig.metric("memq_txn_aborts_total") == 1
    assert await rig.txns.end("tx", ids, commit=True) is TxnRefusal.PRODUCER_FENCED
    again = await rig.txns.init_producer_id("tx", 5_000, current=ids)   # KIP-360: it may re-init
    assert isinstance(again, ProducerIds) and again.epoch == ids.epoch + 2


async def test_the_full_scan_forgets_ids_unused_for_their_expiration() -> None:
    rig = Rig()
    rig.txns.id_expiration_ms = 10_000
    ids = await begun(rig, "idle")
    await begun(rig, "busy")
    assert await rig.txns.end("idle", ids, commit=True) is None
    rig.clock.advance(11)
    assert await rig.txns.scan(lambda _: True, full=True) == 1   # "busy" is Ongoing: aborted by its own timeout later
    assert await rig.txns.list_ids() == ["busy"]
    assert rig.metric("memq_txn_expired_ids_total") == 1
    again = await rig.txns.init_producer_id("idle", 60_000)   # a producer back later: a new start
    assert isinstance(again, ProducerIds) and again.epoch == 0


async def test_refused_offsets_are_counted_and_the_commit_completes() -> None:
    rig = Rig()
    ids = await begun(rig)
    await rig.txns.add_offsets("tx", ids, "g")
    await rig.txns.stash_offsets("tx", ids, "g", GroupOffsets(1, "m", None, {("in", 0): (5, "")}))
    rig.relay.refuse = {("in", 0): 22}   # ILLEGAL_GENERATION: a rebalance since
    assert await rig.txns.end("tx", ids, commit=True) is None
    assert rig.metric("memq_txn_offset_refusals_total") == 1 and rig.metric("memq_txn_commits_total") == 1


async def test_store_failures_answer_coordinator_not_available() -> None:
    class Down(MemoryTxnStore):
        def read(self, txn_id: str) -> tuple[None, int]:
            raise CoordinationError("ZooKeeper: no answer within 5s")

    rig = Rig(Down())
    assert await rig.txns.init_producer_id("tx", 1000) is TxnRefusal.COORDINATOR_NOT_AVAILABLE
    assert await rig.txns.check_produce("tx", ProducerIds(1, 0), "t", 0) is TxnRefusal.COORDINATOR_NOT_AVAILABLE


async def test_store_pending_stores_only_when_the_check_passes() -> None:
    class Ticket:
        config = TopicConfig("t")
        partition = -1
        stored = 0

        async def store_apart(self, messages: list[memoryview], headers: list[MessageHeader]) -> Pending:
            self.stored += 1
            return ("memq.c.t", note(f"o{self.stored}"))

    rig = Rig()
    ids = await begun(rig)
    ticket = Ticket()
    assert await rig.txns.store_pending("tx", ids, ticket, 0, [], []) is None
    assert await rig.txns.store_pending("tx", ids, ticket, 5, [], []) is TxnRefusal.INVALID_TXN_STATE
    assert ticket.stored == 1 and [n.key for _, n in rig.store.pending("tx")] == ["o1"]
    placed = Ticket()   # a compacted topic's partition 2: its records placed by key
    placed.partition = 2
    assert await rig.txns.store_pending("tx", ids, placed, 0, [], []) is None
    assert await rig.txns.end("tx", ids, commit=True) is None
    assert [(n.key, p) for (_, n), p in zip(rig.publisher.published, rig.publisher.partitions)] == [("o1", -1),
                                                                                                  ("o1", 2)]


async def test_the_scan_task_runs_until_closed() -> None:
    rig = Rig()
    ids = await begun(rig)
    rig.publisher.failing = True
    await rig.txns.end("tx", ids, commit=True)
    rig.publisher.failing = False
    rig.txns.start(lambda _: True)
    for _ in range(200):
        rec = await rig.txns.describe("tx")
        if rec is not None and rec.state is TxnState.COMPLETE_COMMIT:
            break
        await asyncio.sleep(0.01)
    await rig.txns.close()
    assert rec is not None and rec.state is TxnState.COMPLETE_COMMIT and rig.relay.closed


@pytest.mark.parametrize("commit", [True, False])
async def test_concurrent_end_calls_finish_once(commit: bool) -> None:
    rig = Rig()
    ids = await begun(rig)
    await rig.produce("tx", ids, "k")
    answers = await asyncio.gather(*(rig.txns.end("tx", ids, commit) for _ in range(3)))
    assert answers == [None, None, None]
    assert len(rig.publisher.published) == (1 if commit else 0)


class CountingTicket:
    """A Kafka door's ticket: stores a request-partition's Messages as one object of `count` LogMessages each."""

    config = TopicConfig("t")
    partition = -1

    def __init__(self) -> None:
        self.stored = 0

    async def store_apart(self, messages: list[memoryview], headers: list[MessageHeader]) -> Pending:
        self.stored += 1
        return ("memq.c.t", dataclasses.replace(note(f"o{self.stored}"), logmessage_count=sum(h.count for h in headers)))


def header(sequence: int, count: int) -> MessageHeader:
    return MessageHeader(1, Codec.KAFKA, 77, 3, sequence, count, 1, 2, 1_000 + sequence, 10, 0xC0DE + sequence, 40, 10)


async def test_the_audit_hears_committed_messages_as_produced_and_aborted_ones_apart() -> None:
    """A Kafka client has no audit emitter: its Messages are reported when their transaction commits
    (from the pending entries, once published); an abort's LogMessages are counted apart, per topic."""
    rig = Rig()
    ids = await begun(rig)
    ticket = CountingTicket()
    assert await rig.txns.store_pending("tx", ids, ticket, 0, [], [header(0, 5), header(5, 2)]) is None
    assert await rig.produce("tx", ids, "memq-producer") is None   # memq's Producer reports its own
    rig.publisher.failing = True
    assert await rig.txns.end("tx", ids, commit=True) is None
    assert rig.audit.produced_rows == []   # not published yet: not produced
    rig.publisher.failing = False
    assert await rig.txns.scan(lambda _: True) == 1
    assert rig.audit.produced_rows == [("t", 77, 3, 0, 5, 0xC0DE, 1_000), ("t", 77, 3, 5, 2, 0xC0DE + 5, 1_005)]
    assert await rig.txns.add_partitions("tx", ids, [("t", 0)]) is None
    assert await rig.txns.store_pending("tx", ids, ticket, 0, [], [header(7, 4)]) is None
    assert await rig.txns.store_pending("tx", ids, ticket, 0, [], [header(11, 1)]) is None
    assert await rig.txns.end("tx", ids, commit=False) is None
    assert len(rig.audit.produced_rows) == 2 and rig.audit.aborted_rows == [("t", 5)]
    assert rig.metric("memq_txn_aborted_records_total") == 5


async def test_pipelined_produces_of_a_partition_become_pending_in_the_order_they_came() -> None:
    """A Kafka producer pipelines its requests: their PUTs overlap and may finish in any order,
    but each one's pending entry waits for the previous one's (`after`), so the commit publishes
    the partition's records in the order the producer sent them (Quix's outputs came out swapped)."""
    class FirstSlow(CountingTicket):
        def __init__(self) -> None:
            super().__init__()
            self.release = asyncio.Event()

        async def store_apart(self, messages: list[memoryview], headers: list[MessageHeader]) -> Pending:
            self.stored += 1
            name = f"o{self.stored}"
            if self.stored == 1:
                await self.release.wait()
            return ("memq.c.t", note(name))

    rig = Rig()
    ids = await begun(rig)
    ticket = FirstSlow()
    first = asyncio.ensure_future(rig.txns.store_pending("tx", ids, ticket, 0, [], []))
    second = asyncio.ensure_future(rig.txns.store_pending("tx", ids, ticket, 0, [], [], after=first))
    for _ in range(200):   # the second's PUT is done, its entry waits for the first's
        await asyncio.sleep(0.005)
        if ticket.stored == 2:
            break
    await asyncio.sleep(0.05)
    assert ticket.stored == 2 and not second.done() and rig.store.pending("tx") == []
    ticket.release.set()
    assert await first is None and await second is None
    assert await rig.txns.end("tx", ids, commit=True) is None
    assert [n.key for _, n in rig.publisher.published] == ["o1", "o2"]


async def test_the_scan_leaves_an_id_another_broker_coordinates_though_it_stashed_its_offsets() -> None:
    """TxnOffsetCommit goes to the group's coordinator, which opens the id there too: its scan must
    not finish the coordinator's commit under way (published twice: Quix's outputs doubled)."""
    rig = Rig()
    ids = await begun(rig)
    group_side = Rig(rig.store)   # the group's coordinator: its TxnOffsetCommit
    assert await rig.txns.add_offsets("tx", ids, "g") is None
    assert await group_side.txns.stash_offsets("tx", ids, "g", GroupOffsets(1, "m", None, {("t", 0): (5, "")})) is None
    assert await rig.produce("tx", ids, "k") is None
    rig.publisher.failing = True
    await rig.txns.end("tx", ids, commit=True)   # decided; the coordinator carries it out
    assert await group_side.txns.scan(lambda _: False) == 0
    assert group_side.publisher.published == [] and group_side.txns.open == set()
    rig.publisher.failing = False
    assert await rig.txns.scan(lambda _: True) == 1
    assert [n.key for _, n in rig.publisher.published] == ["k"]
