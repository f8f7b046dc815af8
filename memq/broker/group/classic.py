"""Classic consumer groups (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) on their coordinator, pure.

A group goes Empty -> PreparingRebalance (members join) -> CompletingRebalance (the leader
assigns) -> Stable, and back to PreparingRebalance whenever a member joins, leaves or is
expired. The join phase ends when every known member has joined again, or at the rebalance
timeout (the largest of the members'), which drops those that did not; a first member's join
waits `initial_delay_s` for others (Kafka's `group.initial.rebalance.delay.ms`). Each ended
join phase starts a new **generation**; the leader (the first member to have joined) gets
every member's metadata and sends the assignment in its SyncGroup.

Calls that must wait (a join, a follower's sync) are answered later: each call returns what
can be answered now, and `tick(now)` (and every call) returns the answers that became due, as
`Answer`s keyed by member; the service holds their futures. A member not heard from for its
session timeout is removed (a member waiting in a join phase is not: it is waiting on us). A
static member (`group.instance.id`, KIP-345) that joins again under a new member id, restarted,
takes its old place at once: in a stable group with no rebalance at all.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memq.kafka_api.protocol import ErrorCode

Protocols = tuple[tuple[str, bytes], ...]   # (name, metadata), in the member's order of preference


@dataclass(slots=True)
class ClassicMember:
    member_id: str
    client_id: str
    client_host: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocols: Protocols
    instance_id: str | None = None
    assignment: bytes = b""
    seen: float = 0.0
    joining: bool = False    # its JoinGroup waits for the join phase to end
    syncing: bool = False    # its SyncGroup waits for the leader's


@dataclass(slots=True)
class ClassicGroup:
    group_id: str
    state: str = "Empty"
    generation: int = 0
    protocol_type: str = ""
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, ClassicMember] = field(default_factory=dict)
    join_deadline: float = 0.0
    delayed: bool = False   # this join phase waits out its deadline (the initial delay)
    pending: set[str] = field(default_factory=set)   # member ids handed out, not yet joined (v4+)


@dataclass(frozen=True, slots=True)
class JoinAnswer:
    error: ErrorCode
    generation: int = -1
    protocol: str | None = None
    leader: str = ""
    member_id: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()   # the leader's only: (id, instance id, metadata)
    protocol_type: str | None = None


@dataclass(frozen=True, slots=True)
class SyncAnswer:
    error: ErrorCode
    assignment: bytes = b""
    protocol: str | None = None
    protocol_type: str | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer that became due: to `member_id`'s waiting JoinGroup or SyncGroup."""

    member_id: str
    answer: JoinAnswer | SyncAnswer


class ClassicGroups:
    """The classic groups this coordinator holds; `changed` names groups to store again."""

    def __init__(self, *, initial_delay_s: float = 0.1) -> None:
        self.initial_delay_s = initial_delay_s
        self.groups: dict[str, ClassicGroup] = {}
        self.changed: set[str] = set()

    def join(self, group_id: str, member_id: str, now: float, *, protocol_type: str, protocols: Protocols,
             session_timeout_s: float, rebalance_timeout_s: float, client_id: str = "", client_host: str = "",
             instance_id: str | None = None, require_known_member: bool = False
             ) -> tuple[JoinAnswer | str, list[Answer]]:
        """A JoinGroup: its answer now, or the member id that waits for it, and the answers due."""
        g = self.groups.setdefault(group_id, ClassicGroup(group_id))
        due = self.tick(group_id, now)
        if g.members and g.protocol_type != protocol_type or not self._common(g, protocols, member_id):
            return JoinAnswer(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id), due
        static = self._static(g, instance_id, member_id, client_id, now)
        if static is not None:
            if g.state == "Stable" and protocols == g.members[static].protocols:
                return self._join_answer(g, g.members[static]), due   # its place back: no rebalance
            member_id = static
        if member_id and member_id not in g.members and member_id not in g.pending:
            return JoinAnswer(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member_id), due
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if require_known_member:   # v4+: it joins again with this id
                g.pending.add(member_id)
                return JoinAnswer(ErrorCode.MEMBER_ID_REQUIRED, member_id=member_id), due
        g.pending.discard(member_id)
        m = g.members.get(member_id)
        if m is None:
            m = g.members[member_id] = ClassicMember(member_id, client_id, client_host, session_timeout_s,
                                                     rebalance_timeout_s, protocols, instance_id)
            g.protocol_type = protocol_type
        elif g.state == "Stable" and protocols == m.protocols and member_id != g.leader:
            m.seen = now   # nothing changed: it gets the current generation (Kafka does the same)
            return self._join_answer(g, m), due
        m.protocols, m.session_timeout_s, m.rebalance_timeout_s = protocols, session_timeout_s, rebalance_timeout_s
        m.seen, m.joining = now, True
        if g.state != "PreparingRebalance":
            self._prepare(g, now)
        return member_id, due + self.tick(group_id, now)

    def _static(self, g: ClassicGroup, instance_id: str | None, member_id: str, client_id: str,
                now: float) -> str | None:
        """A static member (KIP-345) joining again under a new member id, e.g. restarted: it takes
        the place of the member its `instance_id` had, assignment and all; its new member id."""
        if not instance_id or member_id in g.members:
            return None
        old = next((k for k, x in g.members.items() if x.instance_id == instance_id), None)
        if old is None:
            return None
        m = g.members.pop(old)
        m.member_id, m.client_id, m.seen = member_id or f"{client_id or 'member'}-{uuid.uuid4()}", client_id, now
        g.members[m.member_id] = m
        if g.leader == old:
            g.leader = m.member_id
        self.changed.add(g.group_id)
        return m.member_id

    def sync(self, group_id: str, member_id: str, generation: int, now: float,
             assignments: Sequence[tuple[str, bytes]]) -> tuple[SyncAnswer | None, list[Answer]]:
        """A SyncGroup: its answer now, or None (a follower waits for the leader's)."""
        due = self.tick(group_id, now)
        g = self.groups.get(group_id)
        error = self._member_error(g, member_id, generation)
        if error is not None or g is None:
            return SyncAnswer(error or ErrorCode.UNKNOWN_MEMBER_ID), due
        m = g.members[member_id]
        m.seen = now
        if g.state == "PreparingRebalance":
            return SyncAnswer(ErrorCode.REBALANCE_IN_PROGRESS), due
        if g.state == "Stable":
            return SyncAnswer(ErrorCode.NONE, m.assignment, g.protocol, g.protocol_type), due
        if member_id != g.leader:
            m.syncing = True
            return None, due
        given = dict(assignments)
        for k, other in g.members.items():
            other.assignment = given.get(k, b"")
        g.state = "Stable"
        self.changed.add(group_id)
        for k, other in g.members.items():
            if other.syncing and k != member_id:
                other.syncing = False
                due.append(Answer(k, SyncAnswer(ErrorCode.NONE, other.assignment, g.protocol, g.protocol_type)))
        return SyncAnswer(ErrorCode.NONE, m.assignment, g.protocol, g.protocol_type), due

    def heartbeat(self, group_id: str, member_id: str, generation: int, now: float
                  ) -> tuple[ErrorCode, list[Answer]]:
        due = self.tick(group_id, now)
        g = self.groups.get(group_id)
        error = self._member_error(g, member_id, generation)
        if error is not None or g is None:
            return error or ErrorCode.UNKNOWN_MEMBER_ID, due
        g.members[member_id].seen = now
        return (ErrorCode.REBALANCE_IN_PROGRESS if g.state == "PreparingRebalance" else ErrorCode.NONE), due

    def leave(self, group_id: str, member_ids: Sequence[str], now: float) -> tuple[list[ErrorCode], list[Answer]]:
        """A LeaveGroup of each member (v3+: several): an error per member."""
        due = self.tick(group_id, now)
        g = self.groups.get(group_id)
        errors = []
        for k in member_ids:
            if g is None or k not in g.members:
                errors.append(ErrorCode.UNKNOWN_MEMBER_ID)
                continue
            errors.append(ErrorCode.NONE)
            due += self._remove(g, k, now)
        return errors, due

    def commit_error(self, group_id: str, member_id: str, generation: int) -> ErrorCode | None:
        """Why an OffsetCommit by `member_id` of `generation` is refused; NONE when taken (a
        commit by no member, generation -1, only while the group is Empty)."""
        g = self.groups.get(group_id)
        if generation < 0 and not member_id:
            return ErrorCode.NONE if g is None or not g.members else ErrorCode.ILLEGAL_GENERATION
        error = self._member_error(g, member_id, generation)
        if error is not None:
            return error
        assert g is not None
        # as Kafka: taken while members rejoin (they commit what they give up), not while the
        # leader assigns (the commit might be of a partition already moving)
        return ErrorCode.REBALANCE_IN_PROGRESS if g.state == "CompletingRebalance" else ErrorCode.NONE

    def adopt(self, g: ClassicGroup, now: float) -> None:
        """A group that was a consumer group (`migration.to_classic`): its members join again."""
        self.groups[g.group_id] = g
        self._prepare(g, now)

    def release(self, group_id: str) -> list[Answer]:
        """The group handed over to the consumer protocol: REBALANCE_IN_PROGRESS to every member
        waiting in a join or a sync, which joins again (as Kafka does)."""
        g = self.groups.pop(group_id, None)
        self.changed.discard(group_id)
        if g is None:
            return []
        return [Answer(k, JoinAnswer(ErrorCode.REBALANCE_IN_PROGRESS, member_id=k) if m.joining
                       else SyncAnswer(ErrorCode.REBALANCE_IN_PROGRESS))
                for k, m in g.members.items() if m.joining or m.syncing]

    def txn_commit_error(self, group_id: str, member_id: str, generation: int) -> ErrorCode:
        """Why a TxnOffsetCommit is refused: a member's at another generation (a zombie's) or of
        no member (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID); as Kafka, one with no member and no
        generation (an older producer's) is taken in any state, and none waits for the leader."""
        if generation < 0 and not member_id:
            return ErrorCode.NONE
        return self._member_error(self.groups.get(group_id), member_id, generation) or ErrorCode.NONE

    def cut_session(self, group_id: str, member_id: str, now: float, grace_s: float) -> None:
        """`member_id`'s connection closed: its session ends `grace_s` from now unless it speaks
        again (or sooner, as it was); a static member's is left whole (its restart takes its place)."""
        g = self.groups.get(group_id)
        m = None if g is None else g.members.get(member_id)
        if m is not None and m.instance_id is None:
            m.seen = min(m.seen, now + grace_s - m.session_timeout_s)

    def tick(self, group_id: str, now: float) -> list[Answer]:
        """Sessions expired and a join phase ended if due: the answers that became due."""
        g = self.groups.get(group_id)
        if g is None:
            return []
        due: list[Answer] = []
        for k, m in list(g.members.items()):
            if not m.joining and not m.syncing and now - m.seen > m.session_timeout_s and k in g.members:
                due += self._remove(g, k, now)
        if g.state == "PreparingRebalance" and (
                now >= g.join_deadline or not g.delayed and all(m.joining for m in g.members.values())):
            due += self._complete_join(g, now)
        return due

    def _prepare(self, g: ClassicGroup, now: float) -> None:
        g.delayed = g.state == "Empty"   # a first join waits for more members
        g.state = "PreparingRebalance"
        timeout = max(m.rebalance_timeout_s for m in g.members.values())
        g.join_deadline = now + (min(self.initial_delay_s, timeout) if g.delayed else timeout)
        for m in g.members.values():
            m.syncing = False
        self.changed.add(g.group_id)

    def _complete_join(self, g: ClassicGroup, now: float) -> list[Answer]:
        due: list[Answer] = []
        for k in [k for k, m in g.members.items() if not m.joining]:
            del g.members[k]   # did not rejoin in time
        if not g.members:
            self._empty(g)
            return due
        g.generation += 1
        g.protocol = self._choose(g)
        if g.leader not in g.members:
            g.leader = next(iter(g.members))
        g.state = "CompletingRebalance"
        for m in g.members.values():   # each keeps its assignment until the leader's: what it may still own
            m.joining, m.seen = False, now
            due.append(Answer(m.member_id, self._join_answer(g, m)))
        self.changed.add(g.group_id)
        return due

    def _join_answer(self, g: ClassicGroup, m: ClassicMember) -> JoinAnswer:
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        if m.member_id == g.leader:
            members = tuple((k, o.instance_id, dict(o.protocols)[g.protocol or ""]) for k, o in g.members.items())
        return JoinAnswer(ErrorCode.NONE, g.generation, g.protocol, g.leader or "", m.member_id, members,
                          g.protocol_type)

    def _remove(self, g: ClassicGroup, member_id: str, now: float) -> list[Answer]:
        due: list[Answer] = []
        del g.members[member_id]
        self.changed.add(g.group_id)
        if g.leader == member_id:
            g.leader = next(iter(g.members), None)
        if not g.members:
            self._empty(g)
        elif g.state != "PreparingRebalance":
            for k, m in g.members.items():   # a follower waiting for a sync that will not come
                if m.syncing:
                    due.append(Answer(k, SyncAnswer(ErrorCode.REBALANCE_IN_PROGRESS)))
            self._prepare(g, now)
        return due

    def _empty(self, g: ClassicGroup) -> None:
        g.state, g.protocol, g.leader = "Empty", None, None
        g.generation += 1
        self.changed.add(g.group_id)

    def _common(self, g: ClassicGroup, protocols: Protocols, member_id: str) -> bool:
        """Whether `protocols` shares a protocol with every other member (and names one)."""
        names = {n for n, _ in protocols}
        return bool(names) and all(names & {n for n, _ in m.protocols}
                                   for k, m in g.members.items() if k != member_id)

    def _choose(self, g: ClassicGroup) -> str:
        """The protocol every member supports that the most members prefer (Kafka's vote)."""
        common = set.intersection(*({n for n, _ in m.protocols} for m in g.members.values()))
        votes = [next(n for n, _ in m.protocols if n in common) for m in g.members.values()]
        return max(sorted(common), key=votes.count)

    def _member_error(self, g: ClassicGroup | None, member_id: str, generation: int) -> ErrorCode | None:
        if g is None or member_id not in g.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != g.generation:
            return ErrorCode.ILLEGAL_GENERATION
        return None


def snapshot(g: ClassicGroup) -> dict[str, Any]:
    """`g` as JSON-able data, when Stable or Empty (a join phase in flight is not kept: its members
    rejoin, as with Kafka); timers left out."""
    return {"generation": g.generation, "protocol_type": g.protocol_type, "protocol": g.protocol,
            "leader": g.leader, "state": g.state if g.state in ("Stable", "Empty") else "Empty",
            "members": [{"id": m.member_id, "client_id": m.client_id, "client_host": m.client_host,
                         "session_timeout_s": m.session_timeout_s, "rebalance_timeout_s": m.rebalance_timeout_s,
                         "instance_id": m.instance_id, "protocols": [[n, md.hex()] for n, md in m.protocols],
                         "assignment": m.assignment.hex()}
                        for m in g.members.values()] if g.state == "Stable" else []}


def restore(group_id: str, d: dict[str, Any], now: float) -> ClassicGroup:
    g = ClassicGroup(group_id, d["state"], int(d["generation"]), d["protocol_type"], d["protocol"], d["leader"])
    for r in d["members"]:
        g.members[r["id"]] = ClassicMember(
            r["id"], r["client_id"], r["client_host"], float(r["session_timeout_s"]), float(r["rebalance_timeout_s"]),
            tuple((n, bytes.fromhex(md)) for n, md in r["protocols"]), r["instance_id"],
            bytes.fromhex(r["assignment"]), now)
    return g
