"""memq.broker.txn.state: the transaction state machine's legal steps and Kafka's error for each illegal one."""

from __future__ import annotations

import dataclasses

import pytest

from memq.broker.txn import state
from memq.broker.txn.state import (
    GroupOffsets,
    ProducerIds,
    TxnRecord,
    TxnRefusal,
    TxnState,
)
from memq.kafka_api.protocol import ErrorCode

NOW = 1_800_000_000_000
IDS = ProducerIds(7, 3)


def rec(st: TxnState = TxnState.EMPTY, **kw: object) -> TxnRecord:
    return dataclasses.replace(TxnRecord(7, 3, st, started_ms=NOW), **kw)  # type: ignore[arg-type]


def test_init_allocates_once_then_bumps_the_epoch() -> None:
    first = state.init(None, 60_000, None, 42, NOW)
    assert first == TxnRecord(42, 0, TxnState.EMPTY, timeout_ms=60_000, updated_ms=NOW)
    again = state.init(first, 30_000, None, 99, NOW + 1)   # a second producer: same id, fenced epoch
    assert isinstance(again, TxnRecord) and (again.producer_id, again.epoch, again.timeout_ms) == (42, 1, 30_000)
    done = rec(TxnState.COMPLETE_COMMIT, partitions=frozenset({("t", 0)}))
    bumped = state.init(done, 1000, ProducerIds(7, 3), 99, NOW)
    assert bumped == TxnRecord(7, 4, TxnState.EMPTY, timeout_ms=1000, updated_ms=NOW)


@pytest.mark.parametrize("timeout_ms", [0, -1, state.DEFAULT_MAX_TIMEOUT_MS + 1])
def test_init_refuses_a_timeout_out_of_range(timeout_ms: int) -> None:
    assert state.init(None, timeout_ms, None, 1, NOW) is TxnRefusal.INVALID_TRANSACTION_TIMEOUT


def test_init_with_stale_current_ids_is_fenced_and_open_ones_wait() -> None:
    assert state.init(rec(), 1000, ProducerIds(7, 2), 1, NOW) is TxnRefusal.PRODUCER_FENCED
    assert state.init(rec(), 1000, ProducerIds(8, 3), 1, NOW) is TxnRefusal.INVALID_PRODUCER_ID_MAPPING
    assert state.init(rec(last_epoch=2), 1000, ProducerIds(7, 2), 1, NOW) == TxnRecord(  # KIP-360
        7, 4, timeout_ms=1000, updated_ms=NOW)
    for st in (TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
        assert state.init(rec(st), 1000, None, 1, NOW) is TxnRefusal.CONCURRENT_TRANSACTIONS


def test_epoch_exhausted_moves_to_a_new_producer_id() -> None:
    assert state.init(rec(epoch=state.MAX_EPOCH), 1000, None, 55, NOW) == TxnRecord(55, 0, timeout_ms=1000,
                                                                                    updated_ms=NOW)


def test_add_partitions_begins_a_transaction_and_accumulates() -> None:
    step = state.add_partitions(rec(TxnState.COMPLETE_ABORT, partitions=frozenset({("old", 1)})), IDS,
                                [("t", 0)], NOW + 5)
    assert isinstance(step, TxnRecord)
    assert step.state is TxnState.ONGOING and step.started_ms == step.updated_ms == NOW + 5
    assert step.partitions == {("t", 0)}
    more = state.add_partitions(step, IDS, [("t", 1)], NOW + 9)
    assert isinstance(more, TxnRecord) and more.partitions == {("t", 0), ("t", 1)} and more.started_ms == NOW + 5


def test_calls_of_a_fenced_or_unknown_producer_are_refused() -> None:
    old = ProducerIds(7, 2)
    assert state.add_partitions(rec(), old, [("t", 0)], NOW) is TxnRefusal.PRODUCER_FENCED
    assert state.add_offsets(rec(), ProducerIds(8, 3), "g", NOW) is TxnRefusal.INVALID_PRODUCER_ID_MAPPING
    assert state.add_partitions(None, IDS, [("t", 0)], NOW) is TxnRefusal.INVALID_PRODUCER_ID_MAPPING
    assert state.end(rec(TxnState.ONGOING), old, True) is TxnRefusal.PRODUCER_FENCED
    assert state.add_partitions(rec(TxnState.PREPARE_COMMIT), IDS, [("t", 0)], NOW) \
        is TxnRefusal.CONCURRENT_TRANSACTIONS


def test_check_produce() -> None:
    ongoing = rec(TxnState.ONGOING, partitions=frozenset({("t", 0)}))
    assert state.check_produce(ongoing, IDS, ("t", 0)) is None
    assert state.check_produce(ongoing, IDS, ("t", 1)) is TxnRefusal.INVALID_TXN_STATE
    assert state.check_produce(ongoing, ProducerIds(7, 2), ("t", 0)) is TxnRefusal.INVALID_PRODUCER_EPOCH
    assert state.check_produce(ongoing, ProducerIds(9, 3), ("t", 0)) is TxnRefusal.INVALID_PRODUCER_EPOCH
    assert state.check_produce(rec(TxnState.PREPARE_COMMIT, partitions=frozenset({("t", 0)})), IDS, ("t", 0)) \
        is TxnRefusal.INVALID_TXN_STATE
    assert state.check_produce(None, IDS, ("t", 0)) is TxnRefusal.INVALID_PRODUCER_ID_MAPPING


def test_stash_offsets_needs_the_group_added_and_merges() -> None:
    first = GroupOffsets(5, "m1", None, {("t", 0): (10, "")})
    assert state.stash_offsets(rec(TxnState.ONGOING), IDS, "g", first) is TxnRefusal.INVALID_TXN_STATE
    added = state.add_offsets(rec(), IDS, "g", NOW)
    assert isinstance(added, TxnRecord) and added.groups == {"g"}
    one = state.stash_offsets(added, IDS, "g", first)
    assert isinstance(one, TxnRecord)
    two = state.stash_offsets(one, IDS, "g", GroupOffsets(6, "m1", None, {("t", 1): (4, "x")}))
    assert isinstance(two, TxnRecord)
    assert two.offsets["g"] == GroupOffsets(6, "m1", None, {("t", 0): (10, ""), ("t", 1): (4, "x")})


def test_end_steps_and_retries() -> None:
    ongoing = rec(TxnState.ONGOING)
    assert state.end(ongoing, IDS, True) == rec(TxnState.PREPARE_COMMIT)
    assert state.end(ongoing, IDS, False) == rec(TxnState.PREPARE_ABORT)
    assert state.end(rec(TxnState.COMPLETE_COMMIT), IDS, True) == rec(TxnState.COMPLETE_COMMIT)   # a retry
    assert state.end(rec(TxnState.COMPLETE_COMMIT), IDS, False) is TxnRefusal.INVALID_TXN_STATE
    assert state.end(rec(TxnState.PREPARE_ABORT), IDS, False) is TxnRefusal.CONCURRENT_TRANSACTIONS
    assert state.end(rec(TxnState.PREPARE_ABORT), IDS, True) is TxnRefusal.INVALID_TXN_STATE
    assert state.end(rec(), IDS, True) is TxnRefusal.INVALID_TXN_STATE
    done = state.complete(rec(TxnState.PREPARE_COMMIT, groups=frozenset({"g"}), partitions=frozenset({("t", 0)})))
    assert done == rec(TxnState.COMPLETE_COMMIT)


def test_abort_for_init_fences_the_producer_that_left_it() -> None:
    step = state.abort_for_init(rec(TxnState.ONGOING))
    assert isinstance(step, TxnRecord)
    assert (step.state, step.epoch, step.last_epoch) == (TxnState.PREPARE_ABORT, 4, 3)
    assert state.abort_for_init(rec()) is TxnRefusal.INVALID_TXN_STATE
    assert rec(TxnState.ONGOING, timeout_ms=1000).expired(NOW + 1001)
    assert not rec(TxnState.ONGOING, timeout_ms=1000).expired(NOW + 1000)
    assert not rec(TxnState.COMPLETE_COMMIT, timeout_ms=1000).expired(NOW + 5000)


def test_an_id_is_forgotten_only_when_idle_and_closed() -> None:
    idle = rec(TxnState.COMPLETE_COMMIT, updated_ms=NOW)
    assert idle.forgotten(NOW + 1001, expiration_ms=1000) and not idle.forgotten(NOW + 1000, expiration_ms=1000)
    assert not rec(TxnState.ONGOING, updated_ms=NOW).forgotten(NOW + 5000, expiration_ms=1000)
    assert not rec(TxnState.PREPARE_COMMIT, updated_ms=NOW).forgotten(NOW + 5000, expiration_ms=1000)


def test_refusals_are_kafka_codes_and_old_versions_see_invalid_epoch() -> None:
    assert TxnRefusal.CONCURRENT_TRANSACTIONS.code is ErrorCode.CONCURRENT_TRANSACTIONS
    assert TxnRefusal.PRODUCER_FENCED.code_for(True) is ErrorCode.PRODUCER_FENCED
    assert TxnRefusal.PRODUCER_FENCED.code_for(False) is ErrorCode.INVALID_PRODUCER_EPOCH
    assert TxnRefusal.INVALID_TXN_STATE.code_for(False) is ErrorCode.INVALID_TXN_STATE
