"""memq.broker.share: the share-partition state machine, the assignment, membership and the
store's fencing, pure (a FakeClock, an in-memory store)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memq.errors import StateFencedError
from memq.broker.share.assignment import assign
from memq.broker.share.membership import ShareGroups
from memq.broker.share.partition import AckOutcome, RecordState, SharePartition, Snapshot
from memq.broker.share.service import Shares
from memq.config import ShareConfig
from memq.broker.share.store import MemoryStateStore, decode, encode
from tests.support.clock import FakeClock
from tests.support.share_fakes import FakeShareBroker

N = 1 << 24   # offsets of the next part start here: memq's offsets are sparse


def part(clock: FakeClock, **kw: float) -> SharePartition:
    sp = SharePartition(clock, lock_s=30, delivery_limit=3, **kw)   # type: ignore[arg-type]
    sp.begin(0)
    return sp


def test_acquire_accept_moves_the_window_start() -> None:
    clock = FakeClock()
    sp = part(clock)
    assert sp.acquire("a", [0, 1, 2, N, N + 1]) == [(0, 2, 1), (N, N + 1, 1)]
    assert (sp.start, sp.end, sp.in_flight(), sp.acquired()) == (0, N + 2, 5, 5)
    ok, archived = sp.acknowledge("a", 0, N + 1, AckOutcome.ACCEPT)   # one range across the gap
    assert ok and archived == []
    assert (sp.start, sp.in_flight()) == (N + 2, 0)
    assert sp.acquire("b", [1]) == []   # finished records are never acquired again


def test_a_member_cannot_acknowledge_records_it_does_not_hold() -> None:
    sp = part(FakeClock())
    sp.acquire("a", [0, 1])
    ok, _ = sp.acknowledge("b", 0, 1, AckOutcome.ACCEPT)
    assert not ok and sp.state_of(0) == (RecordState.ACQUIRED, 1)


def test_lock_timeout_then_redelivery_counts_deliveries() -> None:
    clock = FakeClock()
    sp = part(clock)
    sp.acquire("a", [0, 1])
    clock.advance(29)
    assert sp.expire() == [] and sp.redeliverable(10) == []
    clock.advance(2)
    assert sp.expire() == [] and sp.redeliverable(10) == [0, 1]
    assert sp.acquire("b", [0, 1]) == [(0, 1, 2)]
    assert (sp.counters.lock_timeouts, sp.counters.redeliveries) == (2, 2)


def test_release_redelivers_and_the_delivery_limit_archives() -> None:
    sp = part(FakeClock())
    for n in (1, 2):
        assert sp.acquire("a", [0]) == [(0, 0, n)]
        assert sp.acknowledge("a", 0, 0, AckOutcome.RELEASE) == (True, [])
    sp.acquire("a", [0])
    ok, archived = sp.acknowledge("a", 0, 0, AckOutcome.RELEASE)   # third delivery: the limit
    assert ok and [(a.offset, a.reason, a.deliveries) for a in archived] == [(0, "delivery_limit", 3)]
    assert sp.in_flight() == 0 and sp.start == sp.end == 1


def test_reject_archives_at_once() -> None:
    sp = part(FakeClock())
    sp.acquire("a", [0, 1])
    ok, archived = sp.acknowledge("a", 1, 1, AckOutcome.REJECT)
    assert ok and [(a.offset, a.reason, a.deliveries) for a in archived] == [(1, "rejected", 1)]
    assert sp.start == 0   # record 0 still in flight
    sp.acknowledge("a", 0, 0, AckOutcome.ACCEPT)
    assert sp.start == sp.end == 2


def test_a_member_gone_releases_its_records_only() -> None:
    sp = part(FakeClock())
    sp.acquire("a", [0, 1])
    sp.acquire("b", [2])
    sp.release_member("a")
    assert sp.redeliverable(10) == [0, 1] and sp.state_of(2) == (RecordState.ACQUIRED, 1)


def test_window_is_bounded_by_max_in_flight() -> None:
    sp = part(FakeClock(), max_in_flight=3)
    sp.acquire("a", [0, 1, 2])
    assert sp.room() == 0
    sp.acknowledge("a", 0, 0, AckOutcome.ACCEPT)
    assert sp.room() == 1


def test_snapshot_restores_acknowledged_and_makes_acquired_available() -> None:
    clock = FakeClock()
    sp = part(clock)
    sp.acquire("a", [0, 1, 2, 3])
    sp.acknowledge("a", 1, 2, AckOutcome.ACCEPT)
    snap = decode(encode("b1", sp.snapshot()))
    assert snap is not None and not sp.changed
    back = SharePartition(clock, lock_s=30, delivery_limit=3, snapshot=snap)
    assert (back.start, back.end) == (0, 4)
    assert back.redeliverable(10) == [0, 3]   # only what was not acknowledged comes again
    assert back.state_of(1) == (RecordState.ACKNOWLEDGED, 1)
    assert back.acquire("c", [0, 3]) == [(0, 0, 2), (3, 3, 2)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from(["acquire", "accept", "release", "reject", "tick",
                                                                   "leave"]), st.integers(0, 20)), max_size=60))
def test_every_record_finishes_once_and_the_window_stays_consistent(ops: list[tuple[str, str, int]]) -> None:
    clock = FakeClock()
    sp = part(clock, max_in_flight=8)
    finished: set[int] = set()
    for member, op, n in ops:
        if op == "acquire":
            new = list(range(sp.end, sp.end + n % 4))
            sp.acquire(member, sp.redeliverable(3) + new)
        elif op == "tick":
            clock.advance(n * 3)
            finished.update(a.offset for a in sp.expire())
            if n * 3 >= 30:   # every lock ran out: nothing stays acquired
                assert sp.acquired() == 0
        elif op == "leave":
            finished.update(a.offset for a in sp.release_member(member))
        else:
            before = {o for o in range(sp.start, sp.end) if (sp.state_of(o) or (None,))[0] is RecordState.ACQUIRED}
            outcome = {"accept": AckOutcome.ACCEPT, "release": AckOutcome.RELEASE, "reject": AckOutcome.REJECT}[op]
            _, archived = sp.acknowledge(member, n, n + 2, outcome)
            for a in archived:
                assert a.offset not in finished and a.offset in before
                finished.add(a.offset)
        assert sp.start <= sp.end and sp.in_flight() <= 8
        available = [o for o in range(sp.start, sp.end) if (sp.state_of(o) or (None,))[0] is RecordState.AVAILABLE]
        assert sp.redeliverable(100) == available
        for o in range(sp.start, sp.end):
            st_ = sp.state_of(o)
            if st_ is not None:
                assert 1 <= st_[1] <= 3 or st_[0] is RecordState.AVAILABLE


def test_assignment_shares_partitions_when_members_outnumber_them() -> None:
    parts = [("t", 0), ("t", 1)]
    got = assign(["m1", "m2", "m3"], {m: parts for m in ("m1", "m2", "m3")})
    assert all(v == tuple(parts) for v in got.values())
    got = assign(["m1", "m2"], {m: [("t", p) for p in range(5)] for m in ("m1", "m2")})
    assert sorted(got["m1"] + got["m2"]) == [("t", p) for p in range(5)] and not set(got["m1"]) & set(got["m2"])


def test_group_membership_join_assign_expire_and_fence() -> None:
    clock = FakeClock()
    groups = ShareGroups(clock, session_s=10)
    tid = uuid.uuid4()

    def partitions(topics: object) -> list[tuple[uuid.UUID, int]]:
        return [(tid, 0), (tid, 1)]

    a = groups.heartbeat("g", "", 0, None, ("t",), partitions)
    assert a.error == "" and a.member_id and a.assignment == ((tid, 0), (tid, 1))
    b = groups.heartbeat("g", "mb", 0, None, ("t",), partitions)
    assert b.assignment is not None and len(b.assignment) == 1
    again = groups.heartbeat("g", a.member_id, a.epoch, None, None, partitions)
    assert again.assignment is not None and len(again.assignment) == 1   # a gave one partition to b
    assert groups.heartbeat("g", a.member_id, again.epoch, None, None, partitions).assignment is None
    assert groups.heartbeat("g", a.member_id, again.epoch + 5, None, None, partitions).error == "FENCED_MEMBER_EPOCH"
    assert groups.heartbeat("g", "ghost", 3, None, None, partitions).error == "UNKNOWN_MEMBER_ID"
    clock.advance(8)
    groups.heartbeat("g", a.member_id, again.epoch, None, None, partitions)
    clock.advance(8)   # b silent for 16 s: dropped, a gets both partitions
    back = groups.heartbeat("g", a.member_id, again.epoch, None, None, partitions)
    assert back.assignment == ((tid, 0), (tid, 1)) and list(groups.groups["g"].members) == [a.member_id]
    assert groups.heartbeat("g", a.member_id, -1, None, None, partitions).epoch == -1
    assert groups.groups["g"].members == {}


def test_store_claim_fences_the_previous_owner() -> None:
    store = MemoryStateStore()
    key = ("g", "t", 0)
    snap, v1 = store.claim(key, "b1")
    assert snap is None
    sp = part(FakeClock())
    sp.acquire("a", [0])
    v1 = store.write(key, "b1", sp.snapshot(), v1)
    loaded, v2 = store.claim(key, "b2")
    assert loaded is not None and loaded.end == 1
    with pytest.raises(StateFencedError):
        store.write(key, "b1", sp.snapshot(), v1)
    store.write(key, "b2", loaded, v2)


async def test_an_admin_reset_goes_through_the_fenced_store_and_the_old_owner_reloads_it() -> None:
    store, clock = MemoryStateStore(), FakeClock()
    config = ShareConfig(flush_ms=0)
    broker = FakeShareBroker({"t": 1})
    leader, admin = Shares(config, store, clock, "leader", broker), Shares(config, store, clock, "admin", broker)
    key = ("g", "t", 0)
    sp = await leader.partition(key)
    sp.begin(0)
    sp.acquire("m", [0, 1, 2])
    sp.acknowledge("m", 0, 0, AckOutcome.ACCEPT)
    await leader.committed()
    assert await admin.start_of(key) == 1   # read from the store, not claimed
    await admin.reset(key, 5 * N)
    assert store.read(key) == Snapshot(5 * N, 5 * N, ())   # written before reset() returned
    assert await admin.start_of(key) == 5 * N
    sp.acknowledge("m", 1, 2, AckOutcome.ACCEPT)   # the old owner's next write is fenced: it drops its copy
    await leader.committed()
    assert key not in leader.partitions and store.read(key) == Snapshot(5 * N, 5 * N, ())
    again = await leader.partition(key)
    assert (again.start, again.end, again.in_flight()) == (5 * N, 5 * N, 0)
    await admin.reset(key, -1)   # deleted: the next fetch starts by the group's reset policy
    assert store.keys("g") == [key] and store.read(key) == Snapshot(-1, -1, ())
    assert store.keys("other") == []
