"""The Kafka door's KIP-848 family: ConsumerGroupHeartbeat (v0-1) and ConsumerGroupDescribe (v0),
served by memq's group coordinator (`memq.broker.group`), which assigns the partitions itself
(`uniform` or `range`, as the member asks) and hands them over by revoking first. The codec is
`memq.kafka_api.consumer_protocol`; partitions travel by topic id (`metadata_flex.topic_id`).
A subscription by regular expression (v1's SubscribedTopicRegex, librdkafka's `^prefix.*`) is
resolved by the coordinator against the cluster's topics, again whenever they change.
A group's calls go to its coordinator (`coordinator_of`); elsewhere they are NOT_COORDINATOR.
ACLs as Kafka's: `consume` on the group to be a member, `describe` to describe it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable

from memq.kafka_api.consumer_protocol import (DescribedGroup, DescribedMember, HeartbeatRequest, NamedAssignment,
                                              decode_describe, decode_heartbeat, encode_describe, encode_heartbeat)
from memq.kafka_api.flexible import flex_body
from memq.kafka_api.metadata_flex import topic_id
from memq.kafka_api.protocol import ApiKey, ErrorCode, Reader, RequestHeader
from memq.security.acl import Operation

from ..group.service import CONSUMER
from .kafka_family import Conn, Family, GroupMembers, Response

log = logging.getLogger(__name__)


async def _heartbeat(conn: Conn, h: RequestHeader, req: HeartbeatRequest) -> bytes:
    core = conn.core
    interval = core.config.group.heartbeat_interval_ms
    if not core.guard.allowed_group(conn.principal, Operation.CONSUME, req.group_id):
        return encode_heartbeat(h.correlation_id, ErrorCode.GROUP_AUTHORIZATION_FAILED,
                                f"principal {conn.principal} may not consume group {req.group_id!r}", None, -1,
                                interval, None)
    cluster = core.metadata().cluster
    names = {topic_id(cluster, t): t for t in core.metadata().topics}
    owned = None if req.owned is None else frozenset(
        (names[tid], p) for tid, ps in req.owned.items() if tid in names for p in ps)
    beat = await core.group_coordinator.heartbeat(
        req.group_id, req.member_id, req.member_epoch, topics=req.topics, regex=req.regex, owned=owned,
        assignor=req.assignor,
        rebalance_timeout_s=req.rebalance_timeout_ms / 1000 if req.rebalance_timeout_ms > 0 else None,
        instance_id=req.instance_id, rack=req.rack_id, client_id=h.client_id or "", client_host=str(conn.peer))
    if beat.member_id:
        conn.state(GroupMembers).members.add((req.group_id, beat.member_id))
    if beat.error:
        log.info("Kafka ConsumerGroupHeartbeat of %r member %s epoch %d from %s: %s", req.group_id, req.member_id,
                 req.member_epoch, conn.peer, beat.error.name)
        return encode_heartbeat(h.correlation_id, beat.error, beat.message, None, -1, interval, None)
    assignment = None
    if beat.assignment is not None:
        by: dict[uuid.UUID, list[int]] = {}
        for t, p in sorted(beat.assignment):
            by.setdefault(topic_id(cluster, t), []).append(p)
        assignment = {tid: tuple(ps) for tid, ps in by.items()}
    return encode_heartbeat(h.correlation_id, ErrorCode.NONE, None, beat.member_id, beat.epoch, interval, assignment)


def _named(cluster: str, tps: Iterable[tuple[str, int]]) -> NamedAssignment:
    by: dict[str, list[int]] = {}
    for t, p in sorted(tps):
        by.setdefault(t, []).append(p)
    return tuple((topic_id(cluster, t), t, tuple(ps)) for t, ps in by.items())


async def _describe(conn: Conn, h: RequestHeader, groups: list[str]) -> bytes:
    core = conn.core
    cluster = core.metadata().cluster
    out = []
    for g in groups:
        if not core.guard.allowed_group(conn.principal, Operation.DESCRIBE, g):
            out.append(DescribedGroup(g, ErrorCode.GROUP_AUTHORIZATION_FAILED))
            continue
        d = await core.group_coordinator.describe(g)
        if d.error or d.kind != CONSUMER:
            error = d.error or ErrorCode.GROUP_ID_NOT_FOUND
            out.append(DescribedGroup(g, error, None if d.error else f"group {g!r} is not a consumer group"))
            continue
        out.append(DescribedGroup(g, ErrorCode.NONE, None, d.state, d.epoch, d.assignment_epoch, d.assignor,
                                  tuple(DescribedMember(m.member_id, m.instance_id, m.rack, m.epoch, m.client_id,
                                                        m.client_host, m.topics, m.regex, _named(cluster, m.assigned),
                                                        _named(cluster, m.target)) for m in d.members)))
    return encode_describe(h.correlation_id, out)


async def serve(conn: Conn, h: RequestHeader, body: Reader) -> Response:
    r = flex_body(body)
    if h.api_key == ApiKey.CONSUMER_GROUP_HEARTBEAT:
        return asyncio.ensure_future(_heartbeat(conn, h, decode_heartbeat(h.api_version, r)))
    return asyncio.ensure_future(_describe(conn, h, decode_describe(r)))


FAMILY = Family("consumer_groups",
                {ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, 1), ApiKey.CONSUMER_GROUP_DESCRIBE: (0, 0)},
                "consume on the group (heartbeat); describe (describe)", serve)
