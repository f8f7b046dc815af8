"""The Kafka door's consumer-group family, served by memq's group coordinator (`memq.broker.group`):
FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch,
OffsetDelete, DescribeGroups, ListGroups and DeleteGroups, decoded and encoded by kafka-python's
codec of Kafka's schemas (`memq.kafka_api.messages`). A group's calls go to the broker
`coordinator_of` names (FindCoordinator says which); any other broker answers NOT_COORDINATOR
and the client finds it again. KIP-848's ConsumerGroupHeartbeat and ConsumerGroupDescribe are
`kafka_consumer_groups`' (the same coordinator, another family).

Committed offsets are memq's Kafka offsets under the memq topic's name. What each OffsetCommit
covers is reported to the audit as that group's consumption (`memq.broker.consumer_group_audit`).
Group ACLs as Kafka's: `consume` on the group to be a member and commit, `describe` to find its
coordinator, fetch its offsets, describe or list it, `admin` to delete it or its offsets
(OffsetDelete: Kafka's DELETE on the group, and READ, memq's `consume`, on each topic).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from kafka.protocol.admin.groups import (DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest,
                                         DescribeGroupsResponse, ListGroupsRequest, ListGroupsResponse)
from kafka.protocol.consumer.group import (HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse,
                                           LeaveGroupRequest, LeaveGroupResponse, OffsetCommitRequest,
                                           OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse,
                                           OffsetFetchRequest, OffsetFetchResponse, SyncGroupRequest,
                                           SyncGroupResponse)

from memq.kafka_api.groups import Described, decode_find_coordinator, encode_find_coordinator
from memq.kafka_api.mapping import node_id, split_address
from memq.kafka_api.messages import decode_request, encode_response
from memq.kafka_api.protocol import ApiKey, ErrorCode, Reader, RequestHeader
from memq.security.acl import Operation

from ..consumer_group_audit import GroupAudit
from ..coordinator import coordinator_of
from ..group.service import Description, GroupCoordinator
from ..group.store import Offsets
from .kafka_family import Conn, Family, GroupMembers, Response

log = logging.getLogger(__name__)

_CommitTopic = OffsetCommitResponse.OffsetCommitResponseTopic
_CommitPartition = _CommitTopic.OffsetCommitResponsePartition
_FetchTopic = OffsetFetchResponse.OffsetFetchResponseTopic
_FetchPartition = _FetchTopic.OffsetFetchResponsePartition
_FetchGroup = OffsetFetchResponse.OffsetFetchResponseGroup
_FetchGroupTopic = _FetchGroup.OffsetFetchResponseTopics
_FetchGroupPartition = _FetchGroupTopic.OffsetFetchResponsePartitions
_DeleteTopic = OffsetDeleteResponse.OffsetDeleteResponseTopic
_DeletePartition = _DeleteTopic.OffsetDeleteResponsePartition
_Described = DescribeGroupsResponse.DescribedGroup
_DescribedMember = _Described.DescribedGroupMember
_JoinMember = JoinGroupResponse.JoinGroupResponseMember
_LeftMember = LeaveGroupResponse.MemberResponse


class GroupState:
    """A connection's view of its groups' commits, for the audit."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.audit = GroupAudit(conn.core.reads, conn.core.logs, conn.audit) if conn.audit is not None else None
        # Kafka groups' commits counted by the audit: (group, topic, partition) -> last commit
        self.committed: dict[tuple[str, str, int], int] = {}
        self.auditing: set[asyncio.Future[int]] = set()

    @property
    def coordinator(self) -> GroupCoordinator:
        return self.conn.core.group_coordinator

    def may(self, operation: Operation, group: str) -> bool:
        """Whether the principal may do `operation` on group `group` (a refusal counted)."""
        return self.conn.core.guard.allowed_group(self.conn.principal, operation, group)


async def _join(st: GroupState, h: RequestHeader, req: Any) -> bytes:
    v = h.api_version
    if not st.may(Operation.CONSUME, req.group_id):
        return encode_response(h, JoinGroupResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED,
                                                     member_id=req.member_id, leader="", protocol_name=""))
    st.committed = {k: c for k, c in st.committed.items() if k[0] != req.group_id}   # others may commit now
    a = await st.coordinator.join(
        req.group_id, req.member_id, protocol_type=req.protocol_type,
        protocols=tuple((p.name, bytes(p.metadata)) for p in req.protocols),
        session_timeout_s=req.session_timeout_ms / 1000,
        rebalance_timeout_s=(req.rebalance_timeout_ms if v >= 1 else req.session_timeout_ms) / 1000,
        client_id=h.client_id or "", client_host=str(st.conn.peer),
        instance_id=req.group_instance_id if v >= 5 else None, require_known_member=v >= 4)
    if a.member_id:
        st.conn.state(GroupMembers).members.add((req.group_id, a.member_id))
    return encode_response(h, JoinGroupResponse(
        throttle_time_ms=0, error_code=a.error, generation_id=a.generation, protocol_type=a.protocol_type,
        protocol_name=a.protocol if a.protocol is not None or v >= 7 else "", leader=a.leader, skip_assignment=False,
        member_id=a.member_id, members=[_JoinMember(member_id=m, group_instance_id=i, metadata=md)
                                        for m, i, md in a.members]))


async def _sync(st: GroupState, h: RequestHeader, req: Any) -> bytes:
    if not st.may(Operation.CONSUME, req.group_id):
        return encode_response(h, SyncGroupResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, assignment=b""))
    a = await st.coordinator.sync(req.group_id, req.member_id, req.generation_id,
                                  [(x.member_id, bytes(x.assignment)) for x in req.assignments])
    return encode_response(h, SyncGroupResponse(throttle_time_ms=0, error_code=a.error, protocol_type=a.protocol_type,
                                                protocol_name=a.protocol, assignment=a.assignment))


async def _heartbeat(st: GroupState, h: RequestHeader, req: Any) -> bytes:
    error = ErrorCode.GROUP_AUTHORIZATION_FAILED
    if st.may(Operation.CONSUME, req.group_id):
        st.conn.state(GroupMembers).members.add((req.group_id, req.member_id))
        error = await st.coordinator.classic_heartbeat(req.group_id, req.member_id, req.generation_id)
    return encode_response(h, HeartbeatResponse(throttle_time_ms=0, error_code=error))


async def _leave(st: GroupState, h: RequestHeader, req: Any) -> bytes:
    members = [req.member_id] if h.api_version < 3 else [m.member_id for m in req.members]
    each: list[ErrorCode] = []
    if not st.may(Operation.CONSUME, req.group_id):
        error = ErrorCode.GROUP_AUTHORIZATION_FAILED
    else:
        error, each = await st.coordinator.leave(req.group_id, members)
    if h.api_version < 3 and each and not error:
        error = each[0]
    return encode_response(h, LeaveGroupResponse(throttle_time_ms=0, error_code=error, members=[
        _LeftMember(member_id=m, group_instance_id=None, error_code=e) for m, e in zip(members, each, strict=False)]))


async def _commit(st: GroupState, h: RequestHeader, req: Any) -> bytes:
    group = req.group_id
    asked = [(t.name, p.partition_index, p.committed_offset, p.committed_metadata or "")
             for t in req.topics for p in t.partitions]
    errors: dict[tuple[str, int], int] = {}
    topics = st.conn.core.metadata().topics
    valid: Offsets = {}
    for t, p, o, md in asked:
        if not st.may(Operation.CONSUME, group):
            errors[(t, p)] = ErrorCode.GROUP_AUTHORIZATION_FAILED
        elif not st.conn.core.guard.allowed(st.conn.principal, Operation.CONSUME, t):
            errors[(t, p)] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif t not in topics or not 0 <= p < topics[t].read_partitions:
            errors[(t, p)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        else:
            valid[(t, p)] = (o, md)
    if valid:
        before = await _before(st, group, valid) if st.audit is not None else {}
        error = await st.coordinator.commit(group, req.member_id if h.api_version >= 1 else "",
                                            req.generation_id_or_member_epoch if h.api_version >= 1 else -1, valid)
        errors.update({tp: error for tp in valid})
        if error == ErrorCode.NONE and st.audit is not None:
            _audit(st, group, valid, before)
    by_topic: dict[str, list[Any]] = {}
    for t, p, _, _ in asked:
        by_topic.setdefault(t, []).append(_CommitPartition(partition_index=p, error_code=errors[(t, p)]))
    return encode_response(h, OffsetCommitResponse(throttle_time_ms=0, topics=[
        _CommitTopic(name=t, partitions=ps) for t, ps in by_topic.items()]))


async def _before(st: GroupState, group: str, offsets: Offsets) -> dict[tuple[str, int], int]:
    """The group's previous commits of the partitions this connection has not seen it commit."""
    if all((group, t, p) in st.committed for t, p in offsets):
        return {}
    stored = await st.coordinator.offsets(group)
    return {} if isinstance(stored, ErrorCode) else {tp: o for tp, (o, _) in stored.items()}


def _audit(st: GroupState, group: str, offsets: Offsets, before: dict[tuple[str, int], int]) -> None:
    """Report to the audit what each committed partition's group consumed since its previous commit."""
    audit = st.audit
    assert audit is not None
    topics = st.conn.core.metadata().topics
    for (t, p), (offset, _) in offsets.items():
        prev = st.committed.get((group, t, p), before.get((t, p), -1))
        st.committed[(group, t, p)] = offset
        task = asyncio.ensure_future(audit.committed(group, topics[t], p, prev, offset))
        st.auditing.add(task)
        task.add_done_callback(st.auditing.discard)


async def _fetch_one(st: GroupState, group: str, asked: list[tuple[str, list[int]]] | None,
                     member: tuple[str | None, int] = (None, -1)
                     ) -> tuple[ErrorCode, list[tuple[str, list[tuple[int, int, str]]]]]:
    """A group's offsets: (error, [(topic, [(partition, offset, metadata)])]) for the asked topics
    (None: every committed one); -1 where nothing is committed. `member`: (id, epoch) of a v9+
    fetch, checked against the group (STALE_MEMBER_EPOCH)."""
    if not st.may(Operation.DESCRIBE, group):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED, []
    if member != (None, -1):
        refused = await st.coordinator.fetch_error(group, *member)
        if refused:
            return refused, []
    stored = await st.coordinator.offsets(group)
    if isinstance(stored, ErrorCode):
        return stored, []
    if asked is None:
        by: dict[str, list[int]] = {}
        for t, p in sorted(stored):
            by.setdefault(t, []).append(p)
        asked = list(by.items())
    return ErrorCode.NONE, [(t, [(p, *stored.get((t, p), (-1, ""))) for p in ps]) for t, ps in asked]


async def _fetch(st: GroupState, h: RequestHeader, req: Any) -> bytes:
    v = h.api_version
    if v >= 8:
        groups = []
        for g in req.groups:
            asked = None if g.topics is None else [(t.name, list(t.partition_indexes)) for t in g.topics]
            member = (g.member_id, g.member_epoch) if v >= 9 else (None, -1)
            error, topics = await _fetch_one(st, g.group_id, asked, member)
            groups.append(_FetchGroup(group_id=g.group_id, error_code=error, topics=[
                _FetchGroupTopic(name=t, partitions=[_FetchGroupPartition(
                    partition_index=p, committed_offset=o, committed_leader_epoch=-1, metadata=md, error_code=0)
                    for p, o, md in ps]) for t, ps in topics]))
        return encode_response(h, OffsetFetchResponse(throttle_time_ms=0, groups=groups))
    asked = None if req.topics is None else [(t.name, list(t.partition_indexes)) for t in req.topics]
    error, topics = await _fetch_one(st, req.group_id, asked)
    if error and v < 2:   # no top-level error before v2: on each partition asked
        topics = [(t, [(p, -1, "") for p in ps]) for t, ps in asked or []]
    partition_error = error if v < 2 else 0
    return encode_response(h, OffsetFetchResponse(throttle_time_ms=0, error_code=error, topics=[
        _FetchTopic(name=t, partitions=[_FetchPartition(partition_index=p, committed_offset=o, committed_leader_epoch=-1,
                                                        metadata=md, error_code=partition_error) for p, o, md in ps])
        for t, ps in topics]))


async def _offset_delete(st: GroupState, h: RequestHeader, req: Any) -> bytes:
    """Each asked partition's offset deleted; a topic the principal may not consume is refused on
    its partitions, an unknown one is UNKNOWN_TOPIC_OR_PARTITION."""
    core = st.conn.core
    if not st.may(Operation.ADMIN, req.group_id):
        return encode_response(h, OffsetDeleteResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED,
                                                       throttle_time_ms=0, topics=[]))
    topics = core.metadata().topics
    errors: dict[str, ErrorCode] = {}
    tps = []
    for t in req.topics:
        if not core.guard.allowed(st.conn.principal, Operation.CONSUME, t.name):
            errors[t.name] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif t.name not in topics:
            errors[t.name] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        else:
            tps += [(t.name, p.partition_index) for p in t.partitions]
    top = ErrorCode.NONE
    if tps:
        done = await st.coordinator.delete_offsets(req.group_id, tps)
        if done == ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC:
            errors.update({t: done for t, _ in tps})
        elif done:
            top = done
        for t, p in tps:   # the audit asks the coordinator afresh before the next commit
            st.committed.pop((req.group_id, t, p), None)
    return encode_response(h, OffsetDeleteResponse(error_code=top, throttle_time_ms=0, topics=[
        _DeleteTopic(name=t.name, partitions=[_DeletePartition(partition_index=p.partition_index,
                                                               error_code=errors.get(t.name, ErrorCode.NONE))
                                              for p in t.partitions]) for t in req.topics]))


def _described(d: Description | Described) -> Any:
    if isinstance(d, Described):   # a share group
        return _Described(error_code=d.error, group_id=d.group, group_state=d.state, protocol_type=d.protocol_type,
                          protocol_data="", members=[_DescribedMember(
                              member_id=m, group_instance_id=None, client_id=c, client_host=host, member_metadata=b"",
                              member_assignment=b"") for m, c, host in d.members], authorized_operations=None)
    return _Described(error_code=d.error, group_id=d.group_id, group_state=d.state, protocol_type=d.protocol_type,
                      protocol_data=d.protocol, members=[_DescribedMember(
                          member_id=m.member_id, group_instance_id=m.instance_id, client_id=m.client_id,
                          client_host=m.client_host, member_metadata=m.metadata, member_assignment=m.assignment)
                          for m in d.members], authorized_operations=None)


async def _describe(st: GroupState, h: RequestHeader, req: Any) -> bytes:
    shared = st.conn.core.shares.described()
    out = []
    for g in req.groups:
        if not st.may(Operation.DESCRIBE, g):
            out.append(_described(Described(g, ErrorCode.GROUP_AUTHORIZATION_FAILED)))
        elif g in shared:
            out.append(_described(shared[g]))
        else:
            out.append(_described(await st.coordinator.describe(g)))
    return encode_response(h, DescribeGroupsResponse(throttle_time_ms=0, groups=out))


async def _list(st: GroupState, h: RequestHeader, req: Any) -> bytes:
    """The groups this broker coordinates (admin tools ask every broker), those the principal may
    describe, by state (v4+) and type (v5+: classic, consumer, share)."""
    conn = st.conn
    states = {s.lower() for s in req.states_filter} if h.api_version >= 4 else set()
    types = {t.lower() for t in req.types_filter} if h.api_version >= 5 else set()
    listed = await st.coordinator.listed()
    listed += [(g, "share", d.state) for g, d in conn.core.shares.described().items()]
    groups = [ListGroupsResponse.ListedGroup(group_id=g, protocol_type="share" if kind == "share" else "consumer",
                                             group_state=state, group_type=kind)
              for g, kind, state in listed
              if conn.core.guard.may_group(conn.principal, Operation.DESCRIBE, g)
              and (not states or state.lower() in states) and (not types or kind in types)]
    return encode_response(h, ListGroupsResponse(throttle_time_ms=0, error_code=0, groups=groups))


async def _delete_groups(st: GroupState, h: RequestHeader, req: Any) -> bytes:
    """Each group deleted (needs `admin` on the group); one answer."""
    results = []
    for g in req.groups_names:
        error = ErrorCode.GROUP_AUTHORIZATION_FAILED
        if st.may(Operation.ADMIN, g):
            error = await st.coordinator.delete(g)
        log.info("Kafka DeleteGroups of %r from %s: %s", g, st.conn.peer, error.name)
        results.append(DeleteGroupsResponse.DeletableGroupResult(group_id=g, error_code=error))
    return encode_response(h, DeleteGroupsResponse(throttle_time_ms=0, results=results))


def _find_coordinator(st: GroupState, h: RequestHeader, body: Reader) -> bytes:
    """A group (key type 0), a transactional id (1) or a share group: the broker `coordinator_of` names."""
    key, key_type = decode_find_coordinator(h, body)
    if key_type == 0 and not st.may(Operation.DESCRIBE, key):   # as Kafka: DESCRIBE on the group
        return encode_find_coordinator(h, ErrorCode.GROUP_AUTHORIZATION_FAILED, -1, "", -1,
                                       f"principal {st.conn.principal} may not describe group {key!r}")
    meta = st.conn.core.metadata()
    coordinator = coordinator_of(meta, key)
    me = [b for b in meta.brokers if b.id == coordinator and b.kafka_address]
    if key_type not in (0, 1) or not me:
        log.info("Kafka FindCoordinator of %r (key type %d) from %s: COORDINATOR_NOT_AVAILABLE", key, key_type,
                 st.conn.peer)
        return encode_find_coordinator(h, ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, "", -1,
                                       "memq coordinates groups and transactional ids, on brokers with a Kafka "
                                       "listener")
    host, port = split_address(me[0].kafka_address)
    return encode_find_coordinator(h, ErrorCode.NONE, node_id(me[0].id), host, port)


_Handler = Callable[[GroupState, RequestHeader, Any], Awaitable[bytes]]
_CALLS: dict[int, tuple[Any, _Handler]] = {
    ApiKey.JOIN_GROUP: (JoinGroupRequest, _join), ApiKey.SYNC_GROUP: (SyncGroupRequest, _sync),
    ApiKey.HEARTBEAT: (HeartbeatRequest, _heartbeat), ApiKey.LEAVE_GROUP: (LeaveGroupRequest, _leave),
    ApiKey.OFFSET_COMMIT: (OffsetCommitRequest, _commit), ApiKey.OFFSET_FETCH: (OffsetFetchRequest, _fetch),
    ApiKey.OFFSET_DELETE: (OffsetDeleteRequest, _offset_delete),
    ApiKey.DESCRIBE_GROUPS: (DescribeGroupsRequest, _describe), ApiKey.LIST_GROUPS: (ListGroupsRequest, _list),
    ApiKey.DELETE_GROUPS: (DeleteGroupsRequest, _delete_groups),
}


async def serve(conn: Conn, h: RequestHeader, body: Reader) -> Response:
    st = conn.state(GroupState)
    if h.api_key == ApiKey.FIND_COORDINATOR:
        return _find_coordinator(st, h, body)
    cls, handler = _CALLS[h.api_key]
    return asyncio.ensure_future(handler(st, h, decode_request(cls, h, body)))


FAMILY = Family(
    "groups",
    {ApiKey.FIND_COORDINATOR: (0, 2), ApiKey.OFFSET_COMMIT: (2, 9), ApiKey.OFFSET_FETCH: (1, 9),
     ApiKey.JOIN_GROUP: (0, 9), ApiKey.HEARTBEAT: (0, 4), ApiKey.LEAVE_GROUP: (0, 5), ApiKey.SYNC_GROUP: (0, 5),
     ApiKey.DESCRIBE_GROUPS: (0, 5), ApiKey.LIST_GROUPS: (0, 5), ApiKey.DELETE_GROUPS: (0, 2),
     ApiKey.OFFSET_DELETE: (0, 0)},
    "consume on the group (member, commit); describe (find, fetch offsets, describe, list); admin (delete, "
    "delete offsets, with consume on each topic)",
    serve)
