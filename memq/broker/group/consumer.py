"""KIP-848 consumer groups on their coordinator, pure: heartbeats in, epochs and assignments out.

A member joins with epoch 0, leaves with -1 (or -2, a static member leaving for now) and
otherwise heartbeats with the member epoch it was given. Any change of members or of their
subscriptions bumps the **group epoch**; the next heartbeat recomputes the **target
assignment** (its assignor, `assignors.ASSIGNORS`) at that epoch. Each member then reconciles
towards its target, one step per heartbeat, never letting two members own a partition:

1. partitions it owns that are not in its target are **revoked** first: its assignment shrinks
   and it keeps its epoch until a heartbeat reports it no longer owns them (or its rebalance
   timeout passes: it is fenced, and its partitions go);
2. then it takes the target's partitions no other member owns or is still revoking, and its
   member epoch becomes the target's; the rest (**unreleased**) come on later heartbeats.

A member not heard from for the session timeout is removed.

**Classic members** (KIP-848's online migration, `migration`): a classic group that a
consumer-protocol member joins becomes a consumer group, its members carried over, and classic
members may join a consumer group with members. They are served by JoinGroup, SyncGroup and
Heartbeat at their member epoch (the generation they see): a JoinGroup reports what the member
owns (its subscription's owned partitions; an eager client owns none when it joins) and
reconciles it as a heartbeat would, its SyncGroup gets its assignment, and its Heartbeat answers
REBALANCE_IN_PROGRESS whenever it should join again (the group moved on, it has partitions to
give up, or its missing ones are free), after which it must join within its rebalance timeout;
the session is its own (JoinGroup's). A static member (`group.instance.id`)
leaving for now (epoch -2) keeps its place until then: joining again under a new member id, it
gets its assignment and epoch back at once (while it has not left, another member with its
instance id is UNRELEASED_INSTANCE_ID, as in Kafka). A heartbeat at an epoch that is
neither the member's nor its previous one (a lost answer) is FENCED_MEMBER_EPOCH: the client
drops its partitions and rejoins. An OffsetCommit is accepted from a member at its epoch (or
its previous one, for a commit sent before the answer that moved it), or from no member while
the group has none (an admin's). The state is a plain dataclass `snapshot`/`restore`d as JSON
by the store, so a new coordinator carries on with the same members and epochs.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memq.errors import InvalidInputError
from memq.kafka_api.protocol import ErrorCode

from .assignors import ASSIGNORS, DEFAULT_ASSIGNOR, TP
from .topic_regex import compile_regex


Protocols = tuple[tuple[str, bytes], ...]   # a classic member's JoinGroup protocols: (name, metadata)


@dataclass(slots=True)
class Classic:
    """What a member speaking the classic protocol adds."""

    session_timeout_s: float
    protocols: Protocols
    deadline: float = 0.0    # a JoinGroup or SyncGroup due by (0: none)


@dataclass(slots=True)
class ConsumerMember:
    member_id: str
    epoch: int
    topics: tuple[str, ...]
    assignor: str | None = None
    rebalance_timeout_s: float = 300.0
    instance_id: str | None = None
    rack: str | None = None
    client_id: str = ""
    client_host: str = ""
    previous_epoch: int = -1
    assigned: frozenset[TP] = frozenset()    # what it may read now
    revoking: frozenset[TP] = frozenset()    # what it must give up before it gets more
    revoking_since: float = 0.0
    seen: float = 0.0
    sent: frozenset[TP] | None = None        # the assignment last sent (None: send it)
    away: bool = False                       # a static member that left for now (epoch -2)
    classic: Classic | None = None           # a member speaking the classic protocol
    regex: str | None = None                 # subscribed topics by regular expression, besides `topics`

    def subscribed(self, partitions: Mapping[str, int]) -> tuple[str, ...]:
        """Its topics, with the cluster's (`partitions`) its regular expression matches whole."""
        if not self.regex:
            return self.topics
        pattern = compile_regex(self.regex)
        return self.topics + tuple(t for t in sorted(partitions) if t not in self.topics and pattern.fullmatch(t))


@dataclass(slots=True)
class ConsumerGroup:
    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    target: dict[str, frozenset[TP]] = field(default_factory=dict)

    def assignor(self) -> str:
        """The assignor most members ask for (ties by name), `uniform` when none asks."""
        asked = sorted(m.assignor for m in self.members.values() if m.assignor)
        return max(sorted(set(asked)), key=asked.count) if asked else DEFAULT_ASSIGNOR

    def state(self) -> str:
        """As Kafka names it: Empty, Assigning (target behind), Reconciling, Stable."""
        if not self.members:
            return "Empty"
        if self.assignment_epoch < self.epoch:
            return "Assigning"
        settled = all(m.epoch == self.assignment_epoch and not m.revoking and m.assigned == self.target.get(k)
                      for k, m in self.members.items())
        return "Stable" if settled else "Reconciling"

    def owner(self, tp: TP, but: str) -> str | None:
        """The member other than `but` that owns or is still revoking `tp`."""
        for k, m in self.members.items():
            if k != but and (tp in m.assigned or tp in m.revoking):
                return k
        return None


@dataclass(frozen=True, slots=True)
class Beat:
    """A heartbeat's answer: `assignment` None when the member already has it."""

    error: ErrorCode
    member_id: str = ""
    epoch: int = 0
    assignment: frozenset[TP] | None = None
    message: str | None = None


class ConsumerGroups:
    """The consumer groups this coordinator holds; `changed` names groups to store again."""

    def __init__(self, *, session_s: float = 45.0) -> None:
        self.session_s = session_s
        self.groups: dict[str, ConsumerGroup] = {}
        self.changed: set[str] = set()

    def heartbeat(self, group_id: str, member_id: str, epoch: int, now: float, partitions: Mapping[str, int], *,
                  topics: tuple[str, ...] | None = None, regex: str | None = None, owned: frozenset[TP] | None = None,
                  assignor: str | None = None, rebalance_timeout_s: float | None = None,
                  instance_id: str | None = None, rack: str | None = None, client_id: str = "",
                  client_host: str = "") -> Beat:
        """One ConsumerGroupHeartbeat. `partitions`: topic -> partition count of the cluster now;
        None fields did not change since the member's previous heartbeat; `regex` ("": none) is
        matched whole against topic names (`topic_regex`)."""
        if assignor is not None and assignor not in ASSIGNORS:
            return Beat(ErrorCode.UNSUPPORTED_ASSIGNOR, message=f"memq's assignors are {sorted(ASSIGNORS)}")
        if regex:
            try:
                compile_regex(regex)
            except InvalidInputError as e:
                return Beat(ErrorCode.INVALID_REGULAR_EXPRESSION, message=str(e))
        g = self.groups.setdefault(group_id, ConsumerGroup(group_id))
        self.expire(group_id, now)
        m = g.members.get(member_id)
        if m is not None and m.classic is not None:
            return Beat(ErrorCode.UNKNOWN_MEMBER_ID, message=f"member {member_id!r} speaks the classic protocol")
        if epoch == -2 and m is not None and m.instance_id:   # a static member away for now: keeps its place
            m.away = True
            self.changed.add(group_id)
            return Beat(ErrorCode.NONE, member_id, epoch)
        if epoch < 0:   # leaving
            if m is not None:
                self._remove(g, member_id)
            return Beat(ErrorCode.NONE, member_id, epoch)
        if m is None:
            if epoch != 0:
                return Beat(ErrorCode.UNKNOWN_MEMBER_ID, message=f"member {member_id!r} is not in group {group_id!r}")
            if topics is None and not regex:
                return Beat(ErrorCode.INVALID_REQUEST, message="a joining member names its topics or a regex")
            static = next((x for x in g.members.values() if instance_id and x.instance_id == instance_id), None)
            if static is not None and not static.away:
                return Beat(ErrorCode.UNRELEASED_INSTANCE_ID,
                            message=f"instance {instance_id!r} is member {static.member_id!r}, still in the group")
            if static is not None:   # back under a new member id: its place, assignment and epoch
                old, new = static.member_id, member_id or str(uuid.uuid4())
                m = g.members.pop(old)
                m.member_id, m.away, m.sent = new, False, None
                g.members[new] = m
                g.target[new] = g.target.pop(old, frozenset())
                self.changed.add(group_id)
            else:
                m = ConsumerMember(member_id or str(uuid.uuid4()), 0, topics or (), seen=now)
                g.members[m.member_id] = m
                self._bump(g)
        elif epoch == 0:   # it rejoins: what it had is gone
            m.assigned, m.revoking, m.epoch, m.previous_epoch, m.sent = frozenset(), frozenset(), 0, -1, None
            self._bump(g)
        elif epoch != m.epoch and not (epoch == m.previous_epoch and owned is not None and owned <= m.assigned):
            return Beat(ErrorCode.FENCED_MEMBER_EPOCH,
                        message=f"member {member_id!r} is at epoch {m.epoch}, not {epoch}")
        m.seen = now
        self._update(g, m, topics, assignor, rebalance_timeout_s, instance_id, rack, client_id, client_host)
        if regex is not None and (regex or None) != m.regex:
            m.regex = regex or None
            self._bump(g)
        if g.assignment_epoch < g.epoch:
            self._assign(g, partitions)
        self._reconcile(g, m, owned, now)
        if m.assigned != m.sent or (owned is not None and owned != m.assigned):
            m.sent = m.assigned
            return Beat(ErrorCode.NONE, m.member_id, m.epoch, m.assigned)
        return Beat(ErrorCode.NONE, m.member_id, m.epoch)

    def cut_session(self, group_id: str, member_id: str, now: float, grace_s: float) -> None:
        """As `ClassicGroups.cut_session`, for a member of a consumer group (of either protocol)."""
        g = self.groups.get(group_id)
        m = None if g is None else g.members.get(member_id)
        if m is not None and m.instance_id is None:
            m.seen = min(m.seen, now + grace_s - (m.classic.session_timeout_s if m.classic else self.session_s))

    def expire(self, group_id: str, now: float) -> list[str]:
        """Remove the members of `group_id` past their session, or past their rebalance timeout
        with partitions still to revoke; the removed member ids."""
        g = self.groups.get(group_id)
        if g is None:
            return []
        gone = [k for k, m in g.members.items()
                if now - m.seen > (m.classic.session_timeout_s if m.classic else self.session_s)
                or (m.revoking and now - m.revoking_since > m.rebalance_timeout_s)
                or (m.classic is not None and 0 < m.classic.deadline < now)]
        for k in gone:
            self._remove(g, k)
        return gone

    def refresh(self, group_id: str, partitions: Mapping[str, int]) -> None:
        """The cluster's topics changed: a new target if the assignment would differ."""
        g = self.groups.get(group_id)
        if g is not None and g.members and self._target(g, partitions) != g.target:
            self._bump(g)

    def commit_error(self, group_id: str, member_id: str, epoch: int) -> ErrorCode | None:
        """Why an OffsetCommit by `member_id` at `epoch` is refused; None when it is taken."""
        g = self.groups.get(group_id)
        if member_id == "" and epoch < 0:   # not a member: an admin's, only while nobody reads
            return ErrorCode.NONE if g is None or not g.members else ErrorCode.UNKNOWN_MEMBER_ID
        m = None if g is None else g.members.get(member_id)
        if m is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if m.classic is not None:   # as Kafka: its generation exactly
            return ErrorCode.NONE if epoch == m.epoch else ErrorCode.ILLEGAL_GENERATION
        if epoch not in (m.epoch, m.previous_epoch) or epoch < 0:
            return ErrorCode.STALE_MEMBER_EPOCH
        return ErrorCode.NONE

    def txn_commit_error(self, group_id: str, member_id: str, epoch: int) -> ErrorCode:
        """Why a TxnOffsetCommit by `member_id` at `epoch` is refused, as `commit_error` but a
        stale epoch is ILLEGAL_GENERATION (Kafka's code there: a zombie's transaction aborts)."""
        error = self.commit_error(group_id, member_id, epoch)
        return ErrorCode.ILLEGAL_GENERATION if error == ErrorCode.STALE_MEMBER_EPOCH else error or ErrorCode.NONE

    def fetch_error(self, group_id: str, member_id: str | None, epoch: int) -> ErrorCode:
        """Why an OffsetFetch (v9+) by `member_id` at `epoch` is refused: from a member, the
        epoch it may commit at (STALE_MEMBER_EPOCH, ILLEGAL_GENERATION for a classic member);
        from no member (an admin's, -1), never."""
        if not member_id and epoch < 0:
            return ErrorCode.NONE
        return self.commit_error(group_id, member_id or "", epoch) or ErrorCode.NONE

    # --- classic members ----------------------------------------------------------------------

    def classic_join(self, group_id: str, member_id: str, now: float, partitions: Mapping[str, int], *,
                     topics: tuple[str, ...], owned: frozenset[TP], protocols: Protocols, session_timeout_s: float,
                     rebalance_timeout_s: float, instance_id: str | None = None, rack: str | None = None,
                     client_id: str = "", client_host: str = "") -> Beat:
        """A classic member's JoinGroup: answered at once, `epoch` its generation; a SyncGroup is
        due within its rebalance timeout. `owned`: what its subscription says it still owns."""
        g = self.groups.setdefault(group_id, ConsumerGroup(group_id))
        self.expire(group_id, now)
        m = g.members.get(member_id)
        if m is not None and m.classic is None:
            return Beat(ErrorCode.UNKNOWN_MEMBER_ID, message=f"member {member_id!r} speaks the consumer protocol")
        if m is None:
            static = next((x for x in g.members.values() if instance_id and x.instance_id == instance_id), None)
            if static is not None and static.classic is not None:   # restarted (KIP-345): its place back
                m = g.members.pop(static.member_id)
                g.target[member_id] = g.target.pop(m.member_id, frozenset())
                m.member_id = member_id
                g.members[member_id] = m
            else:
                m = g.members[member_id] = ConsumerMember(member_id, 0, topics, seen=now)
                self._bump(g)
        m.classic = Classic(session_timeout_s, protocols)
        m.seen = now
        self._update(g, m, topics, None, rebalance_timeout_s, instance_id, rack, client_id, client_host)
        if g.assignment_epoch < g.epoch:
            self._assign(g, partitions)
        self._reconcile(g, m, owned, now)
        if m.revoking and not owned & m.revoking:   # it gave them up already (an eager client, all)
            self._reconcile(g, m, owned, now)
        m.classic.deadline = now + m.rebalance_timeout_s
        self.changed.add(group_id)
        return Beat(ErrorCode.NONE, m.member_id, m.epoch)

    def classic_sync(self, group_id: str, member_id: str, generation: int, now: float
                     ) -> tuple[ErrorCode, frozenset[TP]]:
        """A classic member's SyncGroup: its assignment, or why not (REBALANCE_IN_PROGRESS: the
        group moved on since its join, and it has nothing to give up first: join again)."""
        found = self._classic(group_id, member_id, generation)
        if isinstance(found, ErrorCode):
            return found, frozenset()
        g, m, c = found
        m.seen = now
        if g.epoch > m.epoch and not m.revoking:
            c.deadline = c.deadline or now + m.rebalance_timeout_s
            return ErrorCode.REBALANCE_IN_PROGRESS, frozenset()
        c.deadline, m.sent = 0.0, m.assigned
        self.changed.add(group_id)
        return ErrorCode.NONE, m.assigned

    def classic_heartbeat(self, group_id: str, member_id: str, generation: int, now: float) -> ErrorCode:
        """A classic member's Heartbeat: REBALANCE_IN_PROGRESS when it should join again, which it
        must do within its rebalance timeout."""
        found = self._classic(group_id, member_id, generation)
        if isinstance(found, ErrorCode):
            return found
        g, m, c = found
        m.seen = now
        missing = g.target.get(member_id, frozenset()) - m.assigned
        if g.epoch > m.epoch or m.revoking or any(g.owner(tp, member_id) is None for tp in missing):
            c.deadline = c.deadline or now + m.rebalance_timeout_s
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def classic_leave(self, group_id: str, member_ids: list[str]) -> list[ErrorCode]:
        """A LeaveGroup of classic members: an error per member."""
        g = self.groups.get(group_id)
        out = []
        for k in member_ids:
            m = g.members.get(k) if g else None
            if g is None or m is None or m.classic is None:
                out.append(ErrorCode.UNKNOWN_MEMBER_ID)
                continue
            self._remove(g, k)
            out.append(ErrorCode.NONE)
        return out

    def _classic(self, group_id: str, member_id: str, generation: int
                 ) -> tuple[ConsumerGroup, ConsumerMember, Classic] | ErrorCode:
        g = self.groups.get(group_id)
        m = g.members.get(member_id) if g else None
        if g is None or m is None or m.classic is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != m.epoch:
            return ErrorCode.ILLEGAL_GENERATION
        return g, m, m.classic

    def _update(self, g: ConsumerGroup, m: ConsumerMember, topics: tuple[str, ...] | None, assignor: str | None,
                rebalance_timeout_s: float | None, instance_id: str | None, rack: str | None, client_id: str,
                client_host: str) -> None:
        if topics is not None and tuple(sorted(topics)) != tuple(sorted(m.topics)):
            m.topics = topics
            self._bump(g)
        if assignor is not None and assignor != m.assignor:
            m.assignor = assignor
            self._bump(g)
        if rebalance_timeout_s is not None and rebalance_timeout_s > 0:
            m.rebalance_timeout_s = rebalance_timeout_s
        m.instance_id = instance_id or m.instance_id
        m.rack = rack or m.rack
        m.client_id = client_id or m.client_id
        m.client_host = client_host or m.client_host

    def _target(self, g: ConsumerGroup, partitions: Mapping[str, int]) -> dict[str, frozenset[TP]]:
        return ASSIGNORS[g.assignor()]({k: m.subscribed(partitions) for k, m in g.members.items()}, partitions,
                                       g.target)

    def _assign(self, g: ConsumerGroup, partitions: Mapping[str, int]) -> None:
        g.target = self._target(g, partitions)
        g.assignment_epoch = g.epoch
        self.changed.add(g.group_id)

    def _reconcile(self, g: ConsumerGroup, m: ConsumerMember, owned: frozenset[TP] | None, now: float) -> None:
        if m.revoking:
            if owned is None or owned & m.revoking:
                return   # still reading them: wait (until its rebalance timeout)
            m.revoking = frozenset()
            self.changed.add(g.group_id)
        target = g.target.get(m.member_id, frozenset())
        revoke = m.assigned - target
        if revoke:
            m.assigned, m.revoking, m.revoking_since = m.assigned & target, revoke, now
            self.changed.add(g.group_id)
            return
        free = frozenset(tp for tp in target - m.assigned if g.owner(tp, m.member_id) is None)
        if free or m.epoch != g.assignment_epoch:
            m.assigned |= free
            if m.epoch != g.assignment_epoch:
                m.previous_epoch, m.epoch = m.epoch, g.assignment_epoch
            self.changed.add(g.group_id)

    def _remove(self, g: ConsumerGroup, member_id: str) -> None:
        del g.members[member_id]
        g.target.pop(member_id, None)
        self._bump(g)

    def _bump(self, g: ConsumerGroup) -> None:
        g.epoch += 1
        self.changed.add(g.group_id)


def snapshot(g: ConsumerGroup) -> dict[str, Any]:
    """`g` as JSON-able data (the store's), timers left out: a loading coordinator restarts them."""
    return {"epoch": g.epoch, "assignment_epoch": g.assignment_epoch,
            "target": {k: sorted(v) for k, v in g.target.items()},
            "members": [{"id": m.member_id, "epoch": m.epoch, "previous_epoch": m.previous_epoch,
                         "topics": list(m.topics), "assignor": m.assignor,
                         "rebalance_timeout_s": m.rebalance_timeout_s, "instance_id": m.instance_id, "rack": m.rack,
                         "client_id": m.client_id, "client_host": m.client_host,
                         "assigned": sorted(m.assigned), "revoking": sorted(m.revoking), "away": m.away,
                         "regex": m.regex,
                         "classic": None if m.classic is None else {
                             "session_timeout_s": m.classic.session_timeout_s,
                             "protocols": [[n, md.hex()] for n, md in m.classic.protocols]}}
                        for m in g.members.values()]}


def restore(group_id: str, d: Mapping[str, Any], now: float) -> ConsumerGroup:
    """The group `snapshot` gave, every member's session and revocation starting at `now`."""
    def tps(raw: Any) -> frozenset[TP]:
        return frozenset((str(t), int(p)) for t, p in raw)

    g = ConsumerGroup(group_id, int(d["epoch"]), int(d["assignment_epoch"]),
                      target={k: tps(v) for k, v in d["target"].items()})
    for r in d["members"]:
        c = r.get("classic")
        g.members[r["id"]] = ConsumerMember(
            r["id"], int(r["epoch"]), tuple(r["topics"]), r["assignor"], float(r["rebalance_timeout_s"]),
            r["instance_id"], r["rack"], r["client_id"], r["client_host"], int(r["previous_epoch"]),
            tps(r["assigned"]), tps(r["revoking"]), now, now, away=bool(r.get("away")), regex=r.get("regex"),
            classic=None if c is None else Classic(float(c["session_timeout_s"]),
                                                   tuple((n, bytes.fromhex(md)) for n, md in c["protocols"])))
    return g
