"""The Kafka door's consumer-group family, relayed to the notification Kafka's coordinator
(`memq.kafka_api.groups`): FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit, OffsetFetch, OffsetDelete, DescribeGroups, ListGroups and DeleteGroups.

A JoinGroup v0-3 member joins though the coordinator answers MEMBER_ID_REQUIRED (tansu does
at every version; Kafka only from v4 on, which such a member cannot act on): the relay joins
again at once with the member id given, and the member gets that answer, in its version's shape.
OffsetDelete is an OffsetCommit of -1 ("no committed offset") by no member: every coordinator
takes it (tansu serves no OffsetDelete), only while the group has no members.

What each OffsetCommit of a Kafka group covers is reported to the audit as that group's
consumption (`memq.broker.consumer_group_audit`). Group ACLs as Kafka's: `consume` on the group to be a
member and commit, `describe` to find its coordinator, fetch its offsets or describe it,
`admin` to delete it or its offsets (OffsetDelete: Kafka's DELETE on the group, and READ, memq's
`consume`, on each topic).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from memq.errors import NotifyError, ProtocolError
from memq.kafka_api.flexible import flex_body
from memq.kafka_api.groups import (Described, OffsetDelete, commit_errors, committed_offsets, decode_delete_groups,
                                   decode_find_coordinator, decode_offset_delete, decode_offset_fetch_v1,
                                   delete_group_request, delete_group_result, describe_groups_of,
                                   describe_groups_request, describe_groups_response, encode_delete_groups,
                                   encode_find_coordinator, encode_offset_delete, group_of, list_groups_filters,
                                   list_groups_flex_response, list_groups_response, offset_delete_commit,
                                   offset_fetch_request, offsets_request, offsets_response, refusal, rejoin_as,
                                   with_described, with_member_id, with_size)
from memq.kafka_api.mapping import node_id, split_address
from memq.kafka_api.protocol import ApiKey, ErrorCode, Reader, RequestHeader, Writer
from memq.security.acl import Operation

from ..coordinator import coordinator_of
from ..consumer_group_audit import GroupAudit
from ..consumer_groups import GroupLink
from .kafka_family import Conn, Family, Response

log = logging.getLogger(__name__)

#: What each relayed group API needs on its group (Kafka: READ, and DESCRIBE for OffsetFetch).
_GROUP_OPERATION = {ApiKey.OFFSET_COMMIT: Operation.CONSUME, ApiKey.OFFSET_FETCH: Operation.DESCRIBE,
                    ApiKey.JOIN_GROUP: Operation.CONSUME, ApiKey.SYNC_GROUP: Operation.CONSUME,
                    ApiKey.HEARTBEAT: Operation.CONSUME, ApiKey.LEAVE_GROUP: Operation.CONSUME}


class GroupState:
    """A connection's relay to group coordinators and what its groups' commits told the audit."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self._link: GroupLink | None = None
        self.audit = GroupAudit(conn.core.reads, conn.core.logs, conn.audit) if conn.audit is not None else None
        # Kafka groups' commits counted by the audit: (group, topic, partition) -> last commit
        self.committed: dict[tuple[str, str, int], int] = {}
        self.auditing: set[asyncio.Future[int]] = set()

    def link(self) -> GroupLink:
        if self._link is None:
            self._link = self.conn.core.groups.link()
        return self._link

    def close(self) -> None:
        if self._link is not None:
            self._link.close()

    def may(self, operation: Operation, group: str) -> bool:
        """Whether the principal may do `operation` on Kafka client group `group` (a refusal
        counted as a `group` denial)."""
        return self.conn.core.guard.allowed_group(self.conn.principal, operation, group)


async def serve(conn: Conn, h: RequestHeader, body: Reader) -> Response:
    st = conn.state(GroupState)
    core = conn.core
    if h.api_key == ApiKey.FIND_COORDINATOR:
        return _find_coordinator(st, h, body)
    if h.api_key == ApiKey.OFFSET_DELETE:
        return asyncio.ensure_future(_offset_delete(st, h, decode_offset_delete(body)))
    if h.api_key == ApiKey.DELETE_GROUPS:
        return asyncio.ensure_future(_delete_groups(st, h, body.buf, body.pos, decode_delete_groups(body)))
    if h.api_key in (ApiKey.DESCRIBE_GROUPS, ApiKey.LIST_GROUPS):   # admin tools: this cluster's groups
        cluster = core.groups.cluster
        local: list[Described] = []   # answered here: refused, or share groups (kept by memq)
        filters: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
        if h.api_key == ApiKey.LIST_GROUPS:
            if h.api_version >= 3:
                filters = list_groups_filters(h, flex_body(body))
            else:
                body.done()
            request = with_size(body.buf)
        else:
            asked = describe_groups_of(body)
            allowed = [g for g in asked if st.may(Operation.DESCRIBE, g)]
            shared = core.shares.described()
            local = [Described(g, ErrorCode.GROUP_AUTHORIZATION_FAILED) for g in asked if g not in allowed]
            local += [shared[g] for g in allowed if g in shared]
            relayed = [g for g in allowed if g not in shared]
            if not relayed:
                return with_described(h, _no_groups(h), local)
            request = describe_groups_request(h, body.buf, body.pos, cluster, relayed)
        return asyncio.ensure_future(_relay(st, h, core.groups.mapped(""), request, {}, local, filters))
    asked_group = group_of(body)
    if not st.may(_GROUP_OPERATION[ApiKey(h.api_key)], asked_group):
        return refusal(h, body.buf, body.pos, ErrorCode.GROUP_AUTHORIZATION_FAILED)
    if h.api_key == ApiKey.JOIN_GROUP:   # a rebalance: another member may commit these partitions now
        st.committed = {k: v for k, v in st.committed.items() if k[0] != asked_group}
    group = core.groups.mapped(asked_group)
    names = {n: t.notification_topic for n, t in core.metadata().topics.items()}
    request = offsets_request(h, body.buf, body.pos, group, names)
    back = {v: k for k, v in names.items()}
    if h.api_key == ApiKey.OFFSET_COMMIT and st.audit is not None:
        commits = [(t, p, o) for t, p, o in committed_offsets(h, body.buf, body.pos) if t in names]
        return asyncio.ensure_future(_audited_commit(st, h, asked_group, request, names, commits))
    if h.api_key == ApiKey.JOIN_GROUP and h.api_version < 4:
        return asyncio.ensure_future(_join_old(st, h, group, request))
    return asyncio.ensure_future(_relay(st, h, group, request, back))


async def _join_old(st: GroupState, h: RequestHeader, group: str, request: bytes) -> bytes:
    """A JoinGroup v0-3 relayed; answered MEMBER_ID_REQUIRED, joined again with the member id
    given, so the member gets the join's answer in its version's shape (see the module doc)."""
    response = await _relay(st, h, group, request, {})
    member = rejoin_as(h, response) if response else None
    if member is None:
        return response
    log.debug("Kafka group %r: JoinGroup v%d joined again as %s", group, h.api_version, member)
    return await _relay(st, h, group, with_member_id(h, request, member), {})


async def _offset_delete(st: GroupState, h: RequestHeader, req: OffsetDelete) -> bytes:
    """Each asked partition's offset deleted (`offset_delete_commit`); a topic the principal may
    not consume is refused on its partitions, an unknown one is UNKNOWN_TOPIC_OR_PARTITION."""
    core = st.conn.core
    if not st.may(Operation.ADMIN, req.group):
        return encode_offset_delete(h, ErrorCode.GROUP_AUTHORIZATION_FAILED, ())
    topics = core.metadata().topics
    refused: dict[str, ErrorCode] = {}
    asked: dict[str, list[int]] = {}   # notification topic -> partitions
    for name, parts in req.topics:
        if not core.guard.allowed(st.conn.principal, Operation.CONSUME, name):
            refused[name] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif name not in topics:
            refused[name] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        else:
            asked.setdefault(topics[name].notification_topic, []).extend(parts)
    errors: dict[tuple[str, int], int] = {}
    if asked:
        group = core.groups.mapped(req.group)
        request = offset_delete_commit(h.correlation_id, "memq-offset-delete", group, asked)
        try:
            errors = commit_errors(_COMMIT_V2, await st.link().relay(group, request))
        except NotifyError as e:   # no answer in the API's shape: close, the client retries
            st.conn.close(f"group coordinator unreachable: {e}")
            return b""
    answer = []
    for name, parts in req.topics:
        if name in refused:
            answer.append((name, [(p, int(refused[name])) for p in parts]))
            continue
        ntopic = topics[name].notification_topic
        answer.append((name, [(p, errors.get((ntopic, p), ErrorCode.UNKNOWN_SERVER_ERROR)) for p in parts]))
        for p in parts:   # the audit asks the coordinator afresh before the next commit
            st.committed.pop((req.group, name, p), None)
    return encode_offset_delete(h, ErrorCode.NONE, answer)


#: The header `commit_errors` reads the OffsetCommit v2 answer to an OffsetDelete with.
_COMMIT_V2 = RequestHeader(ApiKey.OFFSET_COMMIT, 2, 0, None)


def _find_coordinator(st: GroupState, h: RequestHeader, body: Reader) -> bytes:
    """Any broker coordinates any group: it relays to the notification Kafka's coordinator. A
    transactional id (key_type 1) and a share group have one coordinator: `coordinator.coordinator_of`."""
    key, key_type = decode_find_coordinator(h, body)
    if key_type == 0 and not st.may(Operation.DESCRIBE, key):   # as Kafka: DESCRIBE on the group
        return encode_find_coordinator(h, ErrorCode.GROUP_AUTHORIZATION_FAILED, -1, "", -1,
                                       f"principal {st.conn.principal} may not describe group {key!r}")
    meta = st.conn.core.metadata()   # a share group needs one coordinator: a hash picks it
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


async def _audited_commit(st: GroupState, h: RequestHeader, asked_group: str, request: bytes, names: dict[str, str],
                          commits: list[tuple[str, int, int]]) -> bytes:
    """Relay an OffsetCommit, then report to the audit what each committed partition's
    group consumed since its previous commit (`consumer_group_audit`), asked of the coordinator
    once per partition and connection, before the commit moves it."""
    group = st.conn.core.groups.mapped(asked_group)
    unknown: dict[str, list[int]] = {}
    for t, p, _ in commits:
        if (asked_group, t, p) not in st.committed:
            unknown.setdefault(names[t], []).append(p)
    before: dict[tuple[str, int], int] = {}
    if unknown:
        try:
            fetched = await st.link().relay(group, offset_fetch_request(0, "memq-audit", group, unknown))
            back = {v: k for k, v in names.items()}
            before = {(back[t], p): o for (t, p), o in decode_offset_fetch_v1(fetched).items() if t in back}
        except (NotifyError, ProtocolError) as e:   # the commit goes on; only its audit is lost
            log.warning("Kafka group %r: previous commits not read for the audit: %s", asked_group, e)
            commits = [c for c in commits if (asked_group, c[0], c[1]) in st.committed]
    response = await _relay(st, h, group, request, {v: k for k, v in names.items()})
    if not response:
        return response
    errors = commit_errors(h, response)
    audit = st.audit
    assert audit is not None
    for t, p, offset in commits:
        if errors.get((t, p)) != ErrorCode.NONE:
            continue
        prev = st.committed.get((asked_group, t, p), before.get((t, p), -1))
        st.committed[(asked_group, t, p)] = offset
        task = asyncio.ensure_future(audit.committed(asked_group, st.conn.core.metadata().topics[t], p, prev, offset))
        st.auditing.add(task)
        task.add_done_callback(st.auditing.discard)
    return response


async def _relay(st: GroupState, h: RequestHeader, group: str, request: bytes, names: dict[str, str],
                 local: Sequence[Described] = (),
                 filters: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())) -> bytes:
    conn = st.conn
    try:
        response = await st.link().relay(group, request)
        cluster = conn.core.groups.cluster
        if h.api_key == ApiKey.LIST_GROUPS:   # as Kafka lists them: those the principal may describe
            def visible(g: str) -> bool:
                return conn.core.guard.may_group(conn.principal, Operation.DESCRIBE, g)
            states, types = filters
            shared = [(g, d.protocol_type, d.state, "share") for g, d in
                      conn.core.shares.described().items()
                      if visible(g) and (not states or d.state.lower() in states)
                      and (not types or "share" in types)]
            if h.api_version >= 3:
                return list_groups_flex_response(h, response, cluster, visible, shared, types)
            return list_groups_response(h, response, cluster, visible, [(g, p) for g, p, _, _ in shared])
        if h.api_key == ApiKey.DESCRIBE_GROUPS:
            return with_described(h, describe_groups_response(h, response, cluster), local)
        return offsets_response(h, response, names)
    except NotifyError as e:   # no answer in the API's shape: close, the client reconnects and retries
        conn.close(f"group coordinator unreachable: {e}")
        return b""


async def _delete_groups(st: GroupState, h: RequestHeader, frame: bytes | memoryview, body_at: int,
                         groups: list[str]) -> bytes:
    """Each group deleted on its own coordinator (needs `admin` on the group); one answer."""
    results = []
    for g in groups:
        if not st.may(Operation.ADMIN, g):
            results.append((g, int(ErrorCode.GROUP_AUTHORIZATION_FAILED)))
            continue
        mapped = st.conn.core.groups.mapped(g)
        try:
            results.append((g, delete_group_result(
                await st.link().relay(mapped, delete_group_request(frame, body_at, mapped)))))
        except (NotifyError, ProtocolError) as e:   # retriable for the client, unlike a close mid-list
            log.warning("Kafka connection from %s: deleting group %r: %s", st.conn.peer, g, e)
            results.append((g, int(ErrorCode.COORDINATOR_NOT_AVAILABLE)))
    return encode_delete_groups(h, results)


def _no_groups(h: RequestHeader) -> bytes:
    """A DescribeGroups response describing no group (every one asked for was refused)."""
    w = Writer(h.correlation_id)
    if h.api_version >= 1:
        w.i32(0)
    return w.i32(0).frame()


FAMILY = Family(
    "groups",
    {ApiKey.FIND_COORDINATOR: (0, 2), ApiKey.OFFSET_COMMIT: (2, 7), ApiKey.OFFSET_FETCH: (1, 5),
     ApiKey.JOIN_GROUP: (0, 5), ApiKey.HEARTBEAT: (0, 3), ApiKey.LEAVE_GROUP: (0, 3), ApiKey.SYNC_GROUP: (0, 3),
     ApiKey.DESCRIBE_GROUPS: (0, 4), ApiKey.LIST_GROUPS: (0, 5), ApiKey.DELETE_GROUPS: (0, 1),
     ApiKey.OFFSET_DELETE: (0, 0)},
    "consume on the group (member, commit); describe (find, fetch offsets, describe, list); admin (delete, "
    "delete offsets, with consume on each topic)",
    serve)
