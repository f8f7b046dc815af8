"""memq's group coordinator without I/O: the assignors, KIP-848 consumer groups, classic groups, classic
members of consumer groups (a group changing protocol live), regex subscriptions, transactional checks."""

from __future__ import annotations

import json
import random

from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription as S

from memq.broker.group import classic, consumer, migration
from memq.broker.group.assignors import TP, range_assign, uniform_assign
from memq.broker.group.classic import Answer, ClassicGroups, JoinAnswer, SyncAnswer
from memq.broker.group.consumer import ConsumerGroups
from memq.kafka_api import embedded
from memq.kafka_api.protocol import ErrorCode

PARTS = {"t": 12}


def _counts(a: dict[str, frozenset[TP]]) -> list[int]:
    return sorted(len(v) for v in a.values())


def test_range_gives_contiguous_ranges_per_topic() -> None:
    a = range_assign({"a": ("t", "u"), "b": ("t",), "c": ("t",)}, {"t": 7, "u": 2}, {})
    assert a["a"] == {("t", 0), ("t", 1), ("t", 2), ("u", 0), ("u", 1)}
    assert a["b"] == {("t", 3), ("t", 4)} and a["c"] == {("t", 5), ("t", 6)}


def test_uniform_is_even_and_sticky() -> None:
    three = uniform_assign({m: ("t",) for m in "abc"}, PARTS, {})
    assert _counts(three) == [4, 4, 4]
    four = uniform_assign({m: ("t",) for m in "abcd"}, PARTS, three)
    assert _counts(four) == [3, 3, 3, 3]
    assert sum(len(three[m] - four[m]) for m in "abc") == 3   # only the new member's share moves
    two = uniform_assign({m: ("t",) for m in "ab"}, PARTS, four)
    assert _counts(two) == [6, 6] and four["a"] <= two["a"] and four["b"] <= two["b"]
    mixed = uniform_assign({"a": ("t", "u"), "b": ("u",)}, {"t": 4, "u": 4}, {})
    assert {tp for v in mixed.values() for tp in v} == {(t, p) for t in "tu" for p in range(4)}
    assert all(tp[0] == "u" for tp in mixed["b"])


class _Client:
    """A KIP-848 member as librdkafka behaves: it reads what it was given, reports what it owns."""

    def __init__(self, groups: ConsumerGroups, name: str) -> None:
        self.groups, self.name = groups, name
        self.member_id, self.epoch = "", 0
        self.owned: frozenset[TP] = frozenset()

    def beat(self, now: float, *, join: bool = False) -> consumer.Beat:
        b = self.groups.heartbeat("g", self.member_id, self.epoch, now, PARTS, topics=("t",) if join else None,
                                  owned=self.owned, client_id=self.name)
        assert b.error == ErrorCode.NONE, b
        self.member_id, self.epoch = b.member_id, b.epoch
        if b.assignment is not None:
            self.owned = b.assignment   # revoked at once, new ones taken at once
        return b


def _no_partition_twice(groups: ConsumerGroups) -> None:
    seen: set[TP] = set()
    for m in groups.groups["g"].members.values():
        mine = m.assigned | m.revoking
        assert not (mine & seen), "a partition owned by two members"
        seen |= mine


def _settle(groups: ConsumerGroups, clients: list[_Client], now: float) -> None:
    for _ in range(6):
        for c in clients:
            c.beat(now)
            _no_partition_twice(groups)
            owned = [c.owned for c in clients]
            assert sum(len(o) for o in owned) == len(frozenset().union(*owned)), "two clients read one partition"
    assert groups.groups["g"].state() == "Stable"
    assert frozenset().union(*(c.owned for c in clients)) == {("t", p) for p in range(12)}


def test_consumer_group_revokes_before_it_reassigns() -> None:
    groups = ConsumerGroups(session_s=10)
    clients = [_Client(groups, f"c{i}") for i in range(3)]
    for c in clients:
        c.beat(0.0, join=True)
    _settle(groups, clients, 1.0)
    assert sorted(len(c.owned) for c in clients) == [4, 4, 4]
    epoch = groups.groups["g"].epoch
    d = _Client(groups, "c3")
    first = d.beat(2.0, join=True)
    assert first.assignment == frozenset()   # everything is still owned: it waits for revocations
    clients.append(d)
    _settle(groups, clients, 2.5)
    assert groups.groups["g"].epoch == epoch + 1 and sorted(len(c.owned) for c in clients) == [3, 3, 3, 3]
    for c in clients[:2]:   # two leave
        groups.heartbeat("g", c.member_id, -1, 3.0, PARTS)
    _settle(groups, clients[2:], 3.5)
    assert sorted(len(c.owned) for c in clients[2:]) == [6, 6]


def test_consumer_group_random_churn_never_shares_a_partition() -> None:
    rng = random.Random(7)
    groups = ConsumerGroups(session_s=1000)
    clients: list[_Client] = []
    now = 0.0
    for step in range(400):
        now += 0.1
        if rng.random() < 0.05 or not clients:
            clients.append(_Client(groups, f"c{step}"))
            clients[-1].beat(now, join=True)
        elif rng.random() < 0.03 and len(clients) > 1:
            gone = clients.pop(rng.randrange(len(clients)))
            groups.heartbeat("g", gone.member_id, -1, now, PARTS)
        else:
            rng.choice(clients).beat(now)
        _no_partition_twice(groups)
    _settle(groups, clients, now + 0.1)


def test_consumer_group_fencing_and_timeouts() -> None:
    groups = ConsumerGroups(session_s=10)
    a, b = _Client(groups, "a"), _Client(groups, "b")
    a.beat(0.0, join=True)
    _settle(groups, [a], 0.0)
    assert groups.heartbeat("g", a.member_id, a.epoch + 5, 1.0, PARTS).error == ErrorCode.FENCED_MEMBER_EPOCH
    assert groups.heartbeat("g", "nobody", 3, 1.0, PARTS).error == ErrorCode.UNKNOWN_MEMBER_ID
    assert groups.heartbeat("g", "", 0, 1.0, PARTS).error == ErrorCode.INVALID_REQUEST   # joins name topics
    assert groups.heartbeat("g", "", 0, 1.0, PARTS, topics=("t",), assignor="sticky").error == \
        ErrorCode.UNSUPPORTED_ASSIGNOR
    b.beat(1.0, join=True)
    # a never acknowledges its revocation: at its rebalance timeout it is fenced, b gets all
    groups.groups["g"].members[a.member_id].rebalance_timeout_s = 2.0
    groups.heartbeat("g", a.member_id, a.epoch, 1.5, PARTS, owned=a.owned)
    b.beat(2.0)
    assert b.owned == frozenset()
    groups.expire("g", 4.0)
    b.beat(4.0)
    b.beat(4.0)
    assert len(b.owned) == 12 and a.member_id not in groups.groups["g"].members
    assert groups.expire("g", 15.0) == [b.member_id]   # silent past its session
    assert groups.groups["g"].state() == "Empty"


def test_consumer_group_commits_and_restore() -> None:
    groups = ConsumerGroups()
    a = _Client(groups, "a")
    a.beat(0.0, join=True)
    a.beat(0.0)
    assert groups.commit_error("g", a.member_id, a.epoch) == ErrorCode.NONE
    assert groups.commit_error("g", a.member_id, a.epoch + 1) == ErrorCode.STALE_MEMBER_EPOCH
    assert groups.commit_error("g", "other", 1) == ErrorCode.UNKNOWN_MEMBER_ID
    assert groups.commit_error("g", "", -1) == ErrorCode.UNKNOWN_MEMBER_ID   # an admin's, while a member reads
    assert groups.commit_error("h", "", -1) == ErrorCode.NONE
    g = groups.groups["g"]
    back = consumer.restore("g", json.loads(json.dumps(consumer.snapshot(g))), 50.0)
    assert back.epoch == g.epoch and back.target == g.target
    assert back.members[a.member_id].assigned == g.members[a.member_id].assigned
    assert back.members[a.member_id].seen == 50.0


def _join(groups: ClassicGroups, member: str, now: float, meta: bytes = b"m") -> tuple[JoinAnswer | str, list[Answer]]:
    return groups.join("g", member, now, protocol_type="consumer", protocols=(("range", meta),),
                       session_timeout_s=10, rebalance_timeout_s=5, client_id=member or "c")


def test_classic_group_generations() -> None:
    groups = ClassicGroups(initial_delay_s=0.5)
    answer, _ = groups.join("g", "", 0.0, protocol_type="consumer", protocols=(("range", b""),),
                            session_timeout_s=10, rebalance_timeout_s=5, require_known_member=True)
    assert answer is not None and answer.error == ErrorCode.MEMBER_ID_REQUIRED
    a = answer.member_id
    assert _join(groups, a, 0.0, b"A") == (a, [])   # it waits
    assert isinstance(_join(groups, "", 0.1, b"B")[0], str)   # v0-3: a member id given with the join
    assert isinstance(_join(groups, "stranger", 0.1)[0], JoinAnswer)
    due = groups.tick("g", 0.6)   # the initial delay is over
    joins = {d.member_id: d.answer for d in due}
    assert len(joins) == 2 and all(isinstance(j, JoinAnswer) and j.generation == 1 for j in joins.values())
    leader = joins[a]
    assert isinstance(leader, JoinAnswer) and leader.leader == a and len(leader.members) == 2
    b = next(k for k in joins if k != a)
    assert groups.commit_error("g", b, 1) == ErrorCode.REBALANCE_IN_PROGRESS   # the leader assigns
    assert groups.sync("g", b, 1, 0.7, [])[0] is None   # waits for the leader
    mine, due = groups.sync("g", a, 1, 0.7, [(a, b"pa"), (b, b"pb")])
    assert mine == SyncAnswer(ErrorCode.NONE, b"pa", "range", "consumer")
    assert due == [Answer(b, SyncAnswer(ErrorCode.NONE, b"pb", "range", "consumer"))]
    assert groups.heartbeat("g", b, 1, 1.0)[0] == ErrorCode.NONE
    assert groups.heartbeat("g", b, 0, 1.0)[0] == ErrorCode.ILLEGAL_GENERATION
    assert groups.commit_error("g", b, 0) == ErrorCode.ILLEGAL_GENERATION
    assert groups.commit_error("g", b, 1) == ErrorCode.NONE
    assert groups.commit_error("g", "", -1) == ErrorCode.ILLEGAL_GENERATION
    # a third member: a rebalance; the two who do not rejoin by the rebalance timeout are dropped
    assert isinstance(_join(groups, "", 2.0)[0], str)
    assert groups.heartbeat("g", a, 1, 2.1)[0] == ErrorCode.REBALANCE_IN_PROGRESS
    assert groups.commit_error("g", a, 1) == ErrorCode.NONE   # what it gives up, committed while it rejoins
    assert _join(groups, a, 2.2)[0] == a
    due = groups.tick("g", 7.1)
    assert {d.member_id for d in due} == set(groups.groups["g"].members) and b not in groups.groups["g"].members
    assert all(isinstance(d.answer, JoinAnswer) and d.answer.generation == 2 for d in due)
    snap = json.loads(json.dumps(classic.snapshot(groups.groups["g"])))
    assert snap["state"] == "Empty" and snap["members"] == []   # a join phase in flight is not kept


def test_classic_group_rejoins_at_once_and_expires() -> None:
    groups = ClassicGroups(initial_delay_s=0.0)
    _, (first,) = _join(groups, "", 0.0)   # no delay: answered with the join
    a = first.member_id
    groups.sync("g", a, 1, 0.0, [(a, b"all")])
    _join(groups, "", 1.0)
    answer, due = _join(groups, a, 1.1)   # everyone rejoined: no wait for the rebalance timeout
    assert answer == a and {d.member_id for d in due} == set(groups.groups["g"].members)
    b = next(k for k in groups.groups["g"].members if k != a)
    groups.sync("g", a, 2, 1.2, [(a, b"x"), (b, b"y")])
    snap = classic.restore("g", json.loads(json.dumps(classic.snapshot(groups.groups["g"]))), 2.0)
    assert snap.state == "Stable" and snap.members[b].assignment == b"y"
    errors, _ = groups.leave("g", [b, "nobody"], 2.0)
    assert errors == [ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID]
    assert groups.groups["g"].state == "PreparingRebalance"
    assert groups.tick("g", 20.0) == []   # a, waiting in no call, is past its session
    assert groups.groups["g"].state == "Empty" and groups.commit_error("g", "", -1) == ErrorCode.NONE
    assert isinstance(_join(groups, "", 20.0)[0], str)
    assert groups.join("g", "", 20.0, protocol_type="connect", protocols=(("x", b""),), session_timeout_s=10,
                       rebalance_timeout_s=5)[0] == JoinAnswer(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)


def test_consumer_group_follows_a_topic_that_grows() -> None:
    groups = ConsumerGroups()
    a = _Client(groups, "a")
    a.beat(0.0, join=True)
    a.beat(0.0)
    assert len(a.owned) == 12
    epoch = a.epoch
    groups.refresh("g", PARTS)   # nothing changed: no new epoch
    assert groups.groups["g"].epoch == epoch
    groups.refresh("g", {"t": 16})
    b = groups.heartbeat("g", a.member_id, a.epoch, 1.0, {"t": 16}, owned=a.owned)
    assert b.epoch > epoch and b.assignment is not None and len(b.assignment) == 16


def test_a_restarted_static_member_takes_its_place_back_without_a_rebalance() -> None:
    groups = ClassicGroups(initial_delay_s=0.0)
    kw = dict(protocol_type="consumer", session_timeout_s=10.0, rebalance_timeout_s=5.0)
    _, (first,) = groups.join("g", "", 0.0, protocols=(("range", b"a"),), instance_id="app-1", **kw)
    a = first.member_id
    waiting, _ = groups.join("g", "", 0.1, protocols=(("range", b"b"),), instance_id="app-2", **kw)
    assert isinstance(waiting, str)
    groups.join("g", a, 0.2, protocols=(("range", b"a"),), instance_id="app-1", **kw)
    b = waiting
    groups.sync("g", a, 2, 0.3, [(a, b"pa"), (b, b"pb")])
    generation = groups.groups["g"].generation
    # app-2 is SIGKILLed and restarted: a new member id, the same instance id
    again, due = groups.join("g", "", 1.0, protocols=(("range", b"b"),), instance_id="app-2",
                             require_known_member=True, **kw)
    assert isinstance(again, JoinAnswer) and again.error == ErrorCode.NONE and again.member_id != b
    assert again.generation == generation and groups.groups["g"].state == "Stable" and due == []
    assert groups.sync("g", again.member_id, generation, 1.1, [])[0] == SyncAnswer(ErrorCode.NONE, b"pb", "range",
                                                                                     "consumer")
    assert groups.heartbeat("g", b, generation, 1.2)[0] == ErrorCode.UNKNOWN_MEMBER_ID   # the old one is gone


def test_a_static_consumer_member_away_for_now_comes_back_to_its_partitions() -> None:
    groups = ConsumerGroups(session_s=10)
    a, b = _Client(groups, "a"), _Client(groups, "b")
    for c, instance in ((a, "app-1"), (b, "app-2")):
        beat = groups.heartbeat("g", "", 0, 0.0, PARTS, topics=("t",), instance_id=instance)
        c.member_id, c.epoch = beat.member_id, beat.epoch
    _settle(groups, [a, b], 0.5)
    mine, epoch = b.owned, b.epoch
    # while app-2 is in the group, another process with its instance id is refused
    assert groups.heartbeat("g", "", 0, 1.0, PARTS, topics=("t",), instance_id="app-2").error == \
        ErrorCode.UNRELEASED_INSTANCE_ID
    assert groups.heartbeat("g", b.member_id, -2, 1.0, PARTS).error == ErrorCode.NONE   # away for now
    a.beat(1.5)
    assert len(a.owned) == 6   # nothing moved to a meanwhile
    back = groups.heartbeat("g", "new-id", 0, 2.0, PARTS, topics=("t",), instance_id="app-2", owned=frozenset())
    assert back.error == ErrorCode.NONE and back.member_id == "new-id" and back.assignment == mine
    assert back.epoch == epoch and b.member_id not in groups.groups["g"].members
    groups.heartbeat("g", "new-id", -2, 3.0, PARTS)
    groups.expire("g", 14.0)   # away past its session: gone
    assert "new-id" not in groups.groups["g"].members


def _subscription(owned: frozenset[TP] = frozenset()) -> bytes:
    parts = [S.TopicPartition(topic="t", partitions=sorted(p for _, p in owned))] if owned else []
    return bytes(S(version=1, topics=["t"], user_data=None, owned_partitions=parts).encode())


class _ClassicClient:
    """A classic member in a consumer group as librdkafka behaves: eager (it gives up everything
    before it joins) or cooperative (it reports what it owns, gives up what its assignment lacks
    and joins again at once)."""

    def __init__(self, groups: ConsumerGroups, name: str, *, cooperative: bool = False) -> None:
        self.groups, self.name, self.cooperative = groups, name, cooperative
        self.member_id, self.generation = name, -1
        self.owned: frozenset[TP] = frozenset()

    def join(self, now: float) -> None:
        if not self.cooperative:
            self.owned = frozenset()
        b = self.groups.classic_join("g", self.member_id, now, PARTS, topics=("t",), owned=self.owned,
                                     protocols=(("range", _subscription(self.owned)),), session_timeout_s=10,
                                     rebalance_timeout_s=5)
        assert b.error == ErrorCode.NONE, b
        self.generation = b.epoch
        error, assigned = self.groups.classic_sync("g", self.member_id, self.generation, now)
        if error == ErrorCode.REBALANCE_IN_PROGRESS:
            return
        assert error == ErrorCode.NONE, error
        lost = self.owned - assigned
        self.owned = assigned
        if lost and self.cooperative:
            self.join(now)

    def beat(self, now: float) -> None:
        error = self.groups.classic_heartbeat("g", self.member_id, self.generation, now)
        if error == ErrorCode.REBALANCE_IN_PROGRESS:
            self.join(now)
        else:
            assert error == ErrorCode.NONE, error


def _nobody_reads_twice(clients: list[_Client | _ClassicClient]) -> None:
    owned = [c.owned for c in clients]
    assert sum(len(o) for o in owned) == len(frozenset().union(*owned)), "two clients read one partition"


def test_classic_members_upgrade_live_to_a_consumer_group_and_back() -> None:
    halves = {"a": frozenset(("t", p) for p in range(6)), "b": frozenset(("t", p) for p in range(6, 12))}
    g = classic.ClassicGroup("g", "Stable", 3, "consumer", "range", "a", {
        k: classic.ClassicMember(k, k, "h", 10, 5, (("range", _subscription()),), assignment=embedded.assignment(v, 1))
        for k, v in halves.items()})
    groups = ConsumerGroups(session_s=10)
    groups.groups["g"] = migration.to_consumer(g, 1.0)
    cg = groups.groups["g"]
    assert cg.epoch == g.generation and cg.state() == "Stable"
    assert {k: m.assigned for k, m in cg.members.items()} == halves
    a, b = _ClassicClient(groups, "a"), _ClassicClient(groups, "b", cooperative=True)
    for c in (a, b):
        c.generation, c.owned = g.generation, halves[c.name]
        assert groups.commit_error("g", c.name, g.generation) == ErrorCode.NONE   # the same generation commits
    clients: list[_Client | _ClassicClient] = [a, b]
    d = _Client(groups, "d")
    d.beat(1.0, join=True)
    clients.append(d)
    for step in range(8):   # each heartbeats in turn: the classic ones are told to rejoin
        for c in clients:
            c.beat(2.0 + step / 10)
            _no_partition_twice(groups)
            _nobody_reads_twice(clients)
    assert cg.state() == "Stable" and sorted(len(c.owned) for c in clients) == [4, 4, 4]
    assert groups.commit_error("g", "a", a.generation - 1) == ErrorCode.ILLEGAL_GENERATION
    assert groups.heartbeat("g", "a", a.generation, 3.0, PARTS).error == ErrorCode.UNKNOWN_MEMBER_ID
    # the classic ones leave (restarted as consumer-protocol members): a plain consumer group
    assert groups.classic_leave("g", ["a", "b", "nobody"]) == [ErrorCode.NONE] * 2 + [ErrorCode.UNKNOWN_MEMBER_ID]
    d.beat(3.0)
    d.beat(3.0)
    assert len(d.owned) == 12 and all(m.classic is None for m in cg.members.values())
    # downgrade: only classic members left after the consumer-protocol one goes
    e = _ClassicClient(groups, "e")
    e.join(4.0)
    d.beat(4.1)
    e.beat(4.2)
    groups.heartbeat("g", d.member_id, -1, 4.3, PARTS)
    back = migration.to_classic(cg, 5.0)
    assert back.protocol_type == "consumer" and set(back.members) == {"e"} and back.generation == cg.epoch
    assert embedded.assigned(back.members["e"].assignment) == cg.members["e"].assigned
    snap = consumer.restore("g", json.loads(json.dumps(consumer.snapshot(cg))), 6.0)
    restored, before = snap.members["e"].classic, cg.members["e"].classic
    assert restored is not None and before is not None and restored.protocols == before.protocols


def test_classic_members_in_a_consumer_group_churn_without_sharing_a_partition() -> None:
    rng = random.Random(11)
    groups = ConsumerGroups(session_s=1000)
    clients: list[_Client | _ClassicClient] = []
    now = 0.0
    for step in range(400):
        now += 0.1
        if rng.random() < 0.05 or not clients:
            if clients and rng.random() < 0.6:
                c = _ClassicClient(groups, f"k{step}", cooperative=rng.random() < 0.5)
                c.join(now)
                clients.append(c)
            else:
                clients.append(_Client(groups, f"c{step}"))
                clients[-1].beat(now, join=True)
        elif rng.random() < 0.03 and len(clients) > 1:
            gone = clients.pop(rng.randrange(len(clients)))
            if isinstance(gone, _ClassicClient):
                groups.classic_leave("g", [gone.member_id])
            else:
                groups.heartbeat("g", gone.member_id, -1, now, PARTS)
        else:
            rng.choice(clients).beat(now)
        _no_partition_twice(groups)
        _nobody_reads_twice(clients)
    for _ in range(8):
        for c in clients:
            c.beat(now)
            _nobody_reads_twice(clients)
    assert frozenset().union(*(c.owned for c in clients)) == {("t", p) for p in range(12)}


def test_a_classic_member_that_does_not_rejoin_in_time_is_removed() -> None:
    groups = ConsumerGroups(session_s=100)
    d = _Client(groups, "d")
    d.beat(0.0, join=True)
    k = _ClassicClient(groups, "k")
    k.join(0.1)
    d.beat(0.2)   # gives up half: k's, at its next heartbeat
    d.beat(0.2)
    assert groups.classic_heartbeat("g", "k", k.generation, 0.3) == ErrorCode.REBALANCE_IN_PROGRESS
    assert groups.expire("g", 5.0) == []
    assert groups.expire("g", 5.4) == ["k"]   # no JoinGroup within its rebalance timeout (5 s)


def test_transactional_commits_and_fetches_check_the_member() -> None:
    groups = ConsumerGroups()
    a = _Client(groups, "a")
    a.beat(0.0, join=True)
    a.beat(0.0)
    assert groups.txn_commit_error("g", a.member_id, a.epoch) == ErrorCode.NONE
    assert groups.txn_commit_error("g", a.member_id, a.epoch + 3) == ErrorCode.ILLEGAL_GENERATION   # a zombie
    assert groups.txn_commit_error("g", "gone", a.epoch) == ErrorCode.UNKNOWN_MEMBER_ID
    assert groups.fetch_error("g", a.member_id, a.epoch) == ErrorCode.NONE
    assert groups.fetch_error("g", a.member_id, a.epoch + 3) == ErrorCode.STALE_MEMBER_EPOCH
    assert groups.fetch_error("g", None, -1) == ErrorCode.NONE   # an admin's
    kg = ClassicGroups(initial_delay_s=0.0)
    _, (first,) = _join(kg, "", 0.0)
    k = first.member_id
    kg.sync("g", k, 1, 0.0, [(k, b"all")])
    assert kg.txn_commit_error("g", k, 1) == ErrorCode.NONE
    assert kg.txn_commit_error("g", k, 0) == ErrorCode.ILLEGAL_GENERATION
    assert kg.txn_commit_error("g", "gone", 1) == ErrorCode.UNKNOWN_MEMBER_ID
    assert kg.txn_commit_error("g", "", -1) == ErrorCode.NONE   # an older producer's: no member named


def test_a_regex_subscription_follows_the_topics_it_matches() -> None:
    groups = ConsumerGroups()
    parts = {"orders-eu": 2, "orders-us": 2, "audit": 2}
    for bad in ("orders-(", "(a+)+b", "a.*a.*a.*a.*b", "(o)\\1"):   # unparsed, or slow to match, or not RE2
        assert groups.heartbeat("g", "", 0, 0.0, parts, regex=bad).error == ErrorCode.INVALID_REGULAR_EXPRESSION
    b = groups.heartbeat("g", "", 0, 0.0, parts, regex="^orders-.*", owned=frozenset())
    assert b.error == ErrorCode.NONE and b.assignment == {(t, p) for t in ("orders-eu", "orders-us") for p in (0, 1)}
    grown = {**parts, "orders-asia": 1}
    groups.refresh("g", grown)   # a matching topic created: a new target
    b = groups.heartbeat("g", b.member_id, b.epoch, 1.0, grown, owned=b.assignment)
    assert b.assignment is not None and ("orders-asia", 0) in b.assignment and ("audit", 0) not in b.assignment
    back = consumer.restore("g", json.loads(json.dumps(consumer.snapshot(groups.groups["g"]))), 2.0)
    assert back.members[b.member_id].regex == "^orders-.*"


def test_a_member_whose_connection_closed_leaves_after_the_grace_unless_it_speaks_again() -> None:
    groups = ConsumerGroups(session_s=45)
    a, b = _Client(groups, "a"), _Client(groups, "b")
    a.beat(0.0, join=True)
    b.beat(0.0, join=True)
    _settle(groups, [a, b], 0.0)
    groups.cut_session("g", a.member_id, 1.0, 5.0)   # a's process killed: its connection closed
    groups.cut_session("g", b.member_id, 1.0, 5.0)   # b's connection dropped, and it comes back
    b.beat(3.0)
    groups.cut_session("g", b.member_id, 100.0, 60.0)   # never later than its session
    assert groups.expire("g", 5.9) == []
    assert groups.expire("g", 6.1) == [a.member_id]      # 5 s after the close, not 45 s after its last beat
    _settle(groups, [b], 6.1)

    kg = ClassicGroups(initial_delay_s=0.0)
    _, (first,) = _join(kg, "", 0.0)
    kg.sync("g", first.member_id, 1, 0.0, [(first.member_id, b"all")])
    kg.cut_session("g", first.member_id, 1.0, 5.0)
    assert kg.tick("g", 5.9) == [] and first.member_id in kg.groups["g"].members
    kg.tick("g", 6.1)
    assert kg.groups["g"].state == "Empty"
    # a static member keeps its whole session: its restart takes its place back
    kw = dict(protocol_type="consumer", session_timeout_s=10.0, rebalance_timeout_s=5.0)
    _, (static,) = kg.join("s", "", 0.0, protocols=(("range", b"a"),), instance_id="app-1", **kw)
    kg.cut_session("s", static.member_id, 1.0, 1.0)
    kg.tick("s", 5.0)
    assert static.member_id in kg.groups["s"].members
