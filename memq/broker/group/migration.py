"""A group changing protocol with members in it (KIP-848's online migration), pure.

**Upgrade**: a classic group of protocol type `consumer` that a consumer-protocol member joins
becomes a consumer group (`to_consumer`, as Kafka's `ConsumerGroup.fromClassicGroup`): every
member is carried over at the group's generation as its member epoch, with the partitions its
last SyncGroup gave it as both what it owns and its target, so nothing moves until the joining
member bumps the group epoch; then the classic members, told REBALANCE_IN_PROGRESS by their
heartbeats, join again and are reconciled like any member (`consumer`): no partition is given
before its owner has reported it gone.

**Downgrade**: a consumer group whose last consumer-protocol member left, with classic members
still in it, becomes a classic group again (`to_classic`, as Kafka's
`ClassicGroup.fromConsumerGroup`) and starts a rebalance, which its members join as any classic
rebalance (they give up their partitions or report them before the leader assigns).

Which of the two a coordinator does is `[group] migration_policy`, Kafka's
`group.consumer.migration.policy`.
"""

from __future__ import annotations

from enum import Enum

from memq.errors import ProtocolError
from memq.kafka_api import embedded

from .classic import ClassicGroup, ClassicMember
from .consumer import Classic, ConsumerGroup, ConsumerMember


class MigrationPolicy(Enum):
    """Kafka 4's values; `bidirectional` is its default."""

    BIDIRECTIONAL = "bidirectional"
    UPGRADE = "upgrade"
    DOWNGRADE = "downgrade"
    DISABLED = "disabled"

    @property
    def upgrades(self) -> bool:
        return self in (MigrationPolicy.BIDIRECTIONAL, MigrationPolicy.UPGRADE)

    @property
    def downgrades(self) -> bool:
        return self in (MigrationPolicy.BIDIRECTIONAL, MigrationPolicy.DOWNGRADE)


def to_consumer(kg: ClassicGroup, now: float) -> ConsumerGroup:
    """`kg` as a consumer group; ProtocolError when a member's embedded protocol does not parse
    (the group then stays classic)."""
    if kg.protocol_type != "consumer":
        raise ProtocolError(f"group {kg.group_id!r} is of protocol type {kg.protocol_type!r}, not consumer")
    cg = ConsumerGroup(kg.group_id, kg.generation, kg.generation)
    for k, m in kg.members.items():
        sub = embedded.subscription(dict(m.protocols).get(kg.protocol or "", m.protocols[0][1]))
        assigned = embedded.assigned(m.assignment)
        cg.members[k] = ConsumerMember(
            k, kg.generation, sub.topics, None, m.rebalance_timeout_s, m.instance_id, sub.rack, m.client_id,
            m.client_host, kg.generation, assigned, seen=now, classic=Classic(m.session_timeout_s, m.protocols))
        cg.target[k] = assigned
    return cg


def to_classic(cg: ConsumerGroup, now: float) -> ClassicGroup:
    """`cg`, every member of which speaks the classic protocol, as a classic group at the group
    epoch as its generation; the caller starts its rebalance."""
    members = {}
    for k, m in cg.members.items():
        c = m.classic
        assert c is not None, "a consumer-protocol member cannot be carried into a classic group"
        members[k] = ClassicMember(k, m.client_id, m.client_host, c.session_timeout_s, m.rebalance_timeout_s,
                                   c.protocols, m.instance_id,
                                   embedded.assignment(m.assigned, embedded.version(c.protocols[0][1])), now)
    names = set.intersection(*({n for n, _ in m.protocols} for m in members.values()))
    first = next(iter(members.values()))
    protocol = next((n for n, _ in first.protocols if n in names), None)
    return ClassicGroup(cg.group_id, "Stable", cg.epoch, "consumer", protocol, first.member_id, members)
