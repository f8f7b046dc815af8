"""Share-group membership on its coordinator, pure: heartbeats in, member epochs and assignments out.

A member joins with epoch 0 and gets an id, leaves with -1, and is dropped when it has not
heartbeated for `session_s`. Any change of members or subscriptions bumps the group epoch and
recomputes the assignment (`assignment.assign`); a member is sent its assignment whenever it
differs from the last one it was sent. Membership is soft state: a coordinator that restarts
loses it and members rejoin (their UNKNOWN_MEMBER_ID answer tells them to), as with Kafka's
consumer groups; what must survive, the records' delivery state, is in `partition`/`store`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memq.clock import Clock

from .assignment import assign


Part = tuple[uuid.UUID, int]   # (topic id, partition)


@dataclass(slots=True)
class Member:
    member_id: str
    epoch: int
    topics: tuple[str, ...]
    rack: str | None
    client_id: str
    client_host: str
    seen: float
    sent: tuple[Part, ...] | None = None   # the assignment last sent


@dataclass(frozen=True, slots=True)
class Beat:
    """A heartbeat's answer: `error` a ShareError name or ""; `assignment` None when unchanged."""

    error: str
    member_id: str = ""
    epoch: int = 0
    assignment: tuple[Part, ...] | None = None


@dataclass(slots=True)
class ShareGroup:
    group_id: str
    epoch: int = 0
    members: dict[str, Member] = field(default_factory=dict)
    target: dict[str, tuple[Part, ...]] = field(default_factory=dict)


Partitions = Callable[[Sequence[str]], Sequence[Part]]   # topic names -> their partitions, sorted


class ShareGroups:
    """The share groups this broker coordinates."""

    def __init__(self, clock: Clock, *, session_s: float = 45.0) -> None:
        self._clock = clock
        self.session_s = session_s
        self.groups: dict[str, ShareGroup] = {}

    def heartbeat(self, group_id: str, member_id: str, epoch: int, rack: str | None, topics: tuple[str, ...] | None,
                  partitions: Partitions, *, client_id: str = "", client_host: str = "") -> Beat:
        now = self._clock.monotonic()
        g = self.groups.setdefault(group_id, ShareGroup(group_id))
        self._expire(g, partitions, now)
        if epoch == -1:   # leaving
            if g.members.pop(member_id, None) is not None:
                self._rebalance(g, partitions)
            return Beat("", member_id, -1)
        m = g.members.get(member_id)
        if m is None:
            if epoch != 0:
                return Beat("UNKNOWN_MEMBER_ID")
            if topics is None:
                return Beat("INVALID_REQUEST")
            mid = member_id or str(uuid.uuid4())
            m = g.members[mid] = Member(mid, 0, topics, rack, client_id, client_host, now)
            self._rebalance(g, partitions)
        else:
            if epoch > m.epoch:
                return Beat("FENCED_MEMBER_EPOCH")
            m.seen = now
            if epoch == 0:
                m.sent = None   # it rejoined: send its assignment again
            if topics is not None and topics != m.topics:
                m.topics = topics
                self._rebalance(g, partitions)
        target = g.target.get(m.member_id, ())
        if target != m.sent:
            m.sent, m.epoch = target, g.epoch
            return Beat("", m.member_id, m.epoch, target)
        return Beat("", m.member_id, m.epoch)

    def active(self, group_id: str) -> int:
        """Members of `group_id` heard from within the session timeout (an admin may change its
        offsets only when there are none, as in Kafka)."""
        g = self.groups.get(group_id)
        now = self._clock.monotonic()
        return 0 if g is None else sum(1 for m in g.members.values() if now - m.seen <= self.session_s)

    def _expire(self, g: ShareGroup, partitions: Partitions, now: float) -> None:
        gone = [k for k, m in g.members.items() if now - m.seen > self.session_s]
        for k in gone:
            del g.members[k]
        if gone:
            self._rebalance(g, partitions)

    def _rebalance(self, g: ShareGroup, partitions: Partitions) -> None:
        g.epoch += 1
        g.target = assign(list(g.members), {k: partitions(m.topics) for k, m in g.members.items()})

    def refresh(self, partitions: Partitions) -> None:
        """Topics changed (a partition count, a topic created): recompute every group's assignment."""
        for g in self.groups.values():
            new = assign(list(g.members), {k: partitions(m.topics) for k, m in g.members.items()})
            if new != g.target:
                g.epoch += 1
                g.target = new
