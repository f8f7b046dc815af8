"""memq.broker.group.service without servers: a coordinator over the memory store, a group moved
to another broker (it loads the state, the old one is fenced), classic joins answered when their
phase ends, offsets, and the migration from the relay."""

from __future__ import annotations

import asyncio

import pytest
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

from memq.broker.coordinator import coordinator_of
from memq.broker.group.service import GroupCoordinator
from memq.broker.group.store import MemoryGroupStore, Offsets
from memq.config import GroupConfig
from memq.kafka_api import embedded
from memq.format.metadata import BrokerMetadata, ClusterMetadata, StorageMetadata, TopicMetadata
from memq.kafka_api.protocol import ErrorCode
from tests.support.clock import FakeClock

TOPICS = {"t": TopicMetadata("t", "memq.t", 12)}
CONFIG = GroupConfig(initial_rebalance_delay_ms=0, tick_ms=10)


def _meta(*brokers: str) -> ClusterMetadata:
    return ClusterMetadata("c", brokers[0], "", StorageMetadata(),
                           tuple(BrokerMetadata(b, f"http://{b}", kafka_address=f"{b}:9092") for b in brokers), TOPICS)


def _group_of(broker: str, brokers: tuple[str, ...]) -> str:
    return next(g for g in (f"g{i}" for i in range(100)) if coordinator_of(_meta(*brokers), g) == broker)


def test_a_new_coordinator_loads_the_group_and_fences_the_old() -> None:
    async def run() -> None:
        store, clock = MemoryGroupStore(), FakeClock()
        both = ("b1", "b2")
        group = _group_of("b1", both)   # b1's while both are up, b2's once b1 is gone
        view = {"b1": both, "b2": both}
        one = GroupCoordinator(CONFIG, store, clock, "b1", lambda: _meta(*view["b1"]))
        two = GroupCoordinator(CONFIG, store, clock, "b2", lambda: _meta(*view["b2"]))
        beat = await one.heartbeat(group, "", 0, topics=("t",))
        beat = await one.heartbeat(group, beat.member_id, beat.epoch, owned=frozenset())
        assert beat.assignment is not None and len(beat.assignment) == 12
        assert await one.commit(group, beat.member_id, beat.epoch, {("t", 0): (42, "")}) == ErrorCode.NONE
        assert (await two.heartbeat(group, beat.member_id, beat.epoch)).error == ErrorCode.NOT_COORDINATOR
        view["b2"] = ("b2",)   # b2 sees b1 gone: it takes the group over with its members and offsets
        again = await two.heartbeat(group, beat.member_id, beat.epoch, owned=beat.assignment)
        assert again.error == ErrorCode.NONE and again.epoch == beat.epoch
        assert await two.offsets(group) == {("t", 0): (42, "")}
        # b1 still thinks it coordinates: its writes are refused, it lets the group go
        assert await one.commit(group, beat.member_id, beat.epoch, {("t", 0): (43, "")}) == ErrorCode.NOT_COORDINATOR
        assert await two.offsets(group) == {("t", 0): (42, "")}
        description = await two.describe(group)
        assert description.state == "Stable" and description.members[0].assigned == beat.assignment
        assert [g for g, _, _ in await two.listed()] == [group]
        assert await two.delete(group) == ErrorCode.NON_EMPTY_GROUP
        await two.heartbeat(group, beat.member_id, -1)
        assert await two.delete_offsets(group, [("t", 0)]) == ErrorCode.NONE
        assert await two.offsets(group) == {}
        assert await two.delete(group) == ErrorCode.NONE
        assert (await two.describe(group)).state == "Empty"   # claimed again, nothing stored

    asyncio.run(run())


def test_classic_joins_wait_for_their_phase() -> None:
    async def run() -> None:
        clock = FakeClock()
        coordinator = GroupCoordinator(CONFIG, MemoryGroupStore(), clock, "b1", lambda: _meta("b1"))
        coordinator.start()
        try:
            kw = dict(protocol_type="consumer", protocols=(("range", b"m"),), session_timeout_s=10.0,
                      rebalance_timeout_s=5.0, client_id="c", client_host="h", instance_id=None,
                      require_known_member=False)
            first = await coordinator.join("g", "", **kw)   # alone, no delay: generation 1 at once
            assert first.error == ErrorCode.NONE and first.generation == 1 and first.leader == first.member_id
            assert (await coordinator.sync("g", first.member_id, 1, [(first.member_id, b"all")])).assignment == b"all"
            second = asyncio.ensure_future(coordinator.join("g", "", **kw))
            await asyncio.sleep(0.05)
            assert await coordinator.classic_heartbeat("g", first.member_id, 1) == ErrorCode.REBALANCE_IN_PROGRESS
            assert await coordinator.commit("g", first.member_id, 1, {("t", 1): (4, "")}) == ErrorCode.NONE
            again = await coordinator.join("g", first.member_id, **kw)
            joined = await asyncio.wait_for(second, 1)
            assert again.generation == joined.generation == 2 and len(again.members) == 2
            follower = asyncio.ensure_future(coordinator.sync("g", joined.member_id, 2, []))
            await asyncio.sleep(0.01)
            assert not follower.done()
            await coordinator.sync("g", again.member_id, 2, [(again.member_id, b"a"), (joined.member_id, b"b")])
            assert (await asyncio.wait_for(follower, 1)).assignment == b"b"
            assert await coordinator.commit("g", joined.member_id, 2, {("t", 1): (5, "")}) == ErrorCode.NONE
            assert (await coordinator.heartbeat("g", "", 0, topics=("t",))).error == ErrorCode.GROUP_ID_NOT_FOUND
            clock.advance(11)   # both silent past their session: the ticker empties the group
            await asyncio.sleep(0.05)
            assert (await coordinator.describe("g")).state == "Empty"
            assert await coordinator.leave("g", [joined.member_id]) == (ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID])
        finally:
            await coordinator.close()

    asyncio.run(run())


@pytest.mark.parametrize("policy", ["bidirectional", "disabled"])
def test_a_classic_group_becomes_a_consumer_group_as_members_upgrade(policy: str) -> None:
    async def run() -> None:
        config = GroupConfig(initial_rebalance_delay_ms=0, tick_ms=10, migration_policy=policy)
        coordinator = GroupCoordinator(config, MemoryGroupStore(), FakeClock(), "b1", lambda: _meta("b1"))
        subscription = bytes(ConsumerProtocolSubscription(version=0, topics=["t"], user_data=None).encode())
        kw = dict(protocol_type="consumer", protocols=(("range", subscription),), session_timeout_s=10.0,
                  rebalance_timeout_s=5.0, client_id="c", client_host="h", instance_id=None,
                  require_known_member=False)
        first = await coordinator.join("g", "", **kw)
        every = frozenset(("t", p) for p in range(12))
        await coordinator.sync("g", first.member_id, 1, [(first.member_id, embedded.assignment(every, 0))])
        beat = await coordinator.heartbeat("g", "", 0, topics=("t",))
        if policy == "disabled":
            assert beat.error == ErrorCode.GROUP_ID_NOT_FOUND and (await coordinator.describe("g")).kind == "classic"
            return
        assert beat.error == ErrorCode.NONE and beat.assignment == frozenset()   # all still the classic member's
        assert (await coordinator.describe("g")).kind == "consumer"
        assert await coordinator.classic_heartbeat("g", first.member_id, 1) == ErrorCode.REBALANCE_IN_PROGRESS
        again = await coordinator.join("g", first.member_id, **kw)   # eager: it gave everything up
        assert again.error == ErrorCode.NONE and again.leader == "" and again.members == ()
        sync = await coordinator.sync("g", first.member_id, again.generation, [])
        assert sync.protocol == "range" and len(embedded.assigned(sync.assignment)) == 6
        assert await coordinator.commit("g", first.member_id, again.generation, {("t", 0): (3, "")}) == ErrorCode.NONE
        assert await coordinator.commit("g", first.member_id, 1, {("t", 0): (3, "")}) == ErrorCode.ILLEGAL_GENERATION
        beat = await coordinator.heartbeat("g", beat.member_id, beat.epoch, owned=frozenset())
        assert beat.assignment is not None and beat.assignment == every - embedded.assigned(sync.assignment)
        # its last consumer-protocol member gone, the group is classic again and rebalances
        await coordinator.heartbeat("g", beat.member_id, -1)
        d = await coordinator.describe("g")
        assert (d.kind, d.state) == ("classic", "PreparingRebalance")

    asyncio.run(run())


@pytest.mark.parametrize("stored", [False, True])
def test_offsets_committed_through_the_relay_are_taken_over_once(stored: bool) -> None:
    async def run() -> None:
        store = MemoryGroupStore()
        asked: list[str] = []

        async def legacy(group: str) -> Offsets:
            asked.append(group)
            return {("t", 3): (1 << 24, "")}

        if stored:   # memq committed for it already: the relay's are not read
            store.commit("g", None, {("t", 3): (7, "")})
        coordinator = GroupCoordinator(CONFIG, store, FakeClock(), "b1", lambda: _meta("b1"), legacy)
        assert await coordinator.offsets("g") == {("t", 3): (7, "") if stored else (1 << 24, "")}
        assert asked == ([] if stored else ["g"])

    asyncio.run(run())
