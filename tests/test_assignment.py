"""Direct tests of the pure placement function (no ZooKeeper)."""

from __future__ import annotations

import random

import pytest

from memq.errors import ConfigError
from memq.governor.assignment import (REPAIR_REASONS, BrokerInfo, CapacityAssignment,
                                      TopicSpec)


def brokers(n: int, racks: int = 0, cap: float = 100.0) -> list[BrokerInfo]:
    return [BrokerInfo(f"b{i}", f"http://127.0.0.1:{9000 + i}",
                       rack=f"r{i % racks}" if racks else "", capacity_mbps=cap)
            for i in range(n)]


def rack_of(bs: list[BrokerInfo]) -> dict[str, str]:
    return {b.id: b.rack for b in bs}


def loads(bs: list[BrokerInfo], topics: list[TopicSpec], assignment) -> dict[str, float]:
    out = {b.id: 0.0 for b in bs}
    for t in topics:
        for b in assignment[t.name]:
            out[b] += t.expected_mbps / len(assignment[t.name])
    return out


def test_every_topic_gets_at_least_two_brokers_on_different_racks() -> None:
    bs = brokers(6, racks=3)
    topics = [TopicSpec(f"t{i}", expected_mbps=5) for i in range(10)]
    res = CapacityAssignment()(bs, topics, {})
    racks = rack_of(bs)
    for t in topics:
        chosen = res.assignment[t.name]
        assert len(chosen) == 2
        assert len({racks[b] for b in chosen}) == 2, (t.name, chosen)
    assert not res.out_of_capacity
    assert {m.reason for m in res.moves} == {"new-topic"}


def test_broker_count_follows_traffic_and_capacity() -> None:
    bs = brokers(8, racks=4)
    big = TopicSpec("big", expected_mbps=130)          # ceil(130 / 25) = 6 brokers
    small = TopicSpec("small", expected_mbps=1)
    res = CapacityAssignment(topic_share_mbps=25)(bs, [big, small], {})
    assert len(res.assignment["big"]) == 6
    assert len(res.assignment["small"]) == 2
    assert len({rack_of(bs)[b] for b in res.assignment["big"]}) == 4   # all racks used
    # every broker within capacity, and the load reported matches the placement
    expected = loads(bs, [big, small], res.assignment)
    assert res.broker_load_mbps == pytest.approx(expected)
    assert max(expected.values()) <= 100


def test_fills_brokers_by_free_capacity() -> None:
    bs = [BrokerInfo("a", "u", capacity_mbps=10), BrokerInfo("b", "u", capacity_mbps=100),
          BrokerInfo("c", "u", capacity_mbps=100)]
    res = CapacityAssignment()(bs, [TopicSpec("t", expected_mbps=40)], {})
    assert res.assignment["t"] == ("b", "c")      # 20 MB/s each does not fit on a (10)


def test_sticky_keeps_valid_placements() -> None:
    bs = brokers(6, racks=3)
    topics = [TopicSpec(f"t{i}", expected_mbps=3) for i in range(12)]
    strategy = CapacityAssignment()
    first = strategy(bs, topics, {}).assignment
    # recomputing from the result changes nothing
    again = strategy(bs, topics, first)
    assert again.assignment == first and again.moves == ()
    # a new topic does not move existing ones
    more = strategy(bs, topics + [TopicSpec("new", expected_mbps=3)], first)
    assert [m.topic for m in more.moves] == ["new"]
    assert all(more.assignment[t] == first[t] for t in first)


def test_broker_death_moves_only_its_topics_to_survivors() -> None:
    bs = brokers(5, racks=0)
    topics = [TopicSpec(f"t{i}", expected_mbps=4) for i in range(10)]
    strategy = CapacityAssignment(max_rebalance_moves=0)
    first = strategy(bs, topics, {}).assignment
    survivors = [b for b in bs if b.id != "b2"]
    res = strategy(survivors, topics, first)
    for t, chosen in res.assignment.items():
        assert "b2" not in chosen and len(chosen) == 2
        if "b2" not in first[t]:
            assert chosen == first[t]
        else:  # the survivor stays, one new broker replaces b2
            assert set(first[t]) - {"b2"} <= set(chosen)
    moved = {m.topic for m in res.moves}
    assert moved == {t for t, c in first.items() if "b2" in c}
    assert {m.reason for m in res.moves} == {"broker-lost"}


def test_drain_moves_topics_off_draining_broker_regardless_of_rate_limit() -> None:
    bs = brokers(4, racks=2)
    topics = [TopicSpec(f"t{i}", expected_mbps=2) for i in range(8)]
    strategy = CapacityAssignment(max_rebalance_moves=1)
    first = strategy(bs, topics, {}).assignment
    hosted = {t for t, c in first.items() if "b1" in c}
    assert len(hosted) > 1
    draining = [BrokerInfo(b.id, b.url, b.rack, b.capacity_mbps, draining=b.id == "b1") for b in bs]
    res = strategy(draining, topics, first)
    assert all("b1" not in c for c in res.assignment.values())
    assert {m.topic for m in res.moves if m.reason == "drain"} == hosted
    racks = rack_of(bs)
    assert all(len({racks[b] for b in c}) == 2 for c in res.assignment.values())


def test_rebalance_is_rate_limited_and_converges() -> None:
    bs = brokers(3, racks=0)
    topics = [TopicSpec(f"t{i}", expected_mbps=8) for i in range(16)]
    strategy = CapacityAssignment(max_rebalance_moves=2, imbalance_threshold=0.1)
    current = strategy(bs, topics, {}).assignment
    bs.append(BrokerInfo("b9", "u", capacity_mbps=100))       # an empty new broker
    topics[0] = TopicSpec("t0", expected_mbps=60)               # and one hot topic (3 brokers)
    cycles = 0
    while True:
        res = strategy(bs, topics, current)
        optional = [m for m in res.moves if m.reason not in REPAIR_REASONS]
        assert len({m.topic for m in optional}) <= 2
        cycles += 1
        if not res.moves:
            break
        current = res.assignment
        assert cycles < 20, "rebalance does not converge"
    assert cycles > 2          # it took several rate-limited cycles
    final = loads(bs, topics, current)
    utils = [final[b.id] / b.capacity_mbps for b in bs]
    assert max(utils) - min(utils) <= 0.1 + 1e-9
    assert final["b9"] > 0


def test_out_of_capacity_keeps_current_assignment_and_says_so() -> None:
    bs = brokers(3, racks=0, cap=10)
    topics = [TopicSpec(f"t{i}", expected_mbps=4) for i in range(3)]
    strategy = CapacityAssignment()
    current = strategy(bs, topics, {}).assignment
    hot = [TopicSpec("t0", expected_mbps=80)] + topics[1:]
    res = strategy(bs, hot, current)
    assert res.out_of_capacity
    assert res.assignment == dict(current)
    assert res.moves == ()
    assert any("out of capacity" in w for w in res.warnings)
    # a broker death while out of capacity still repairs (overcommitting) rather than losing topics
    res2 = strategy(bs[:2], hot, current)
    assert res2.out_of_capacity
    assert all(len(c) == 2 and "b2" not in c for c in res2.assignment.values())


def test_deleted_topics_and_lower_traffic_shrink_placement() -> None:
    bs = brokers(6, racks=3)
    strategy = CapacityAssignment(topic_share_mbps=10)
    current = strategy(bs, [TopicSpec("a", 50), TopicSpec("gone", 1)], {}).assignment
    assert len(current["a"]) == 5
    res = strategy(bs, [TopicSpec("a", 15)], current)
    assert len(res.assignment["a"]) == 2 and set(res.assignment["a"]) <= set(current["a"])
    assert len({rack_of(bs)[b] for b in res.assignment["a"]}) == 2
    assert {(m.topic, m.reason) for m in res.moves} == {("a", "traffic"), ("gone", "deleted")}


def test_fewer_brokers_than_min_warns_and_uses_what_exists() -> None:
    res = CapacityAssignment()(brokers(1), [TopicSpec("t", 1)], {})
    assert res.assignment["t"] == ("b0",)
    assert any("only 1" in w for w in res.warnings)
    empty = CapacityAssignment()([], [TopicSpec("t", 1)], {"t": ("b0",)})
    assert empty.out_of_capacity and empty.assignment == {"t": ("b0",)}


def test_deterministic_regardless_of_input_order() -> None:
    bs = brokers(7, racks=3)
    topics = [TopicSpec(f"t{i}", expected_mbps=(i * 7) % 40 + 1) for i in range(20)]
    strategy = CapacityAssignment()
    ref = strategy(bs, topics, {})
    rng = random.Random(4)
    for _ in range(5):
        b2, t2 = bs[:], topics[:]
        rng.shuffle(b2)
        rng.shuffle(t2)
        assert strategy(b2, t2, {}) == ref


def test_rejects_bad_settings() -> None:
    with pytest.raises(ConfigError, match="capacity_mbps"):
        BrokerInfo("b", "u", capacity_mbps=0)
    with pytest.raises(ConfigError, match="min_brokers"):
        TopicSpec("t", min_brokers=0)
    with pytest.raises(ConfigError, match="topic_share_mbps"):
        CapacityAssignment(topic_share_mbps=0)
