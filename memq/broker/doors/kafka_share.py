"""The Kafka door's share groups (KIP-932): queues on memq topics, over the core's read path.

Who does what, so that every broker agrees without talking to the others:
- a share group's coordinator (FindCoordinator, ShareGroupHeartbeat, ShareGroupDescribe) is
  the broker with a Kafka listener picked by a hash of the group id (`memq.broker.coordinator`);
- a share-partition's state (which records are acquired, acknowledged, archived) is kept by the
  partition's leader in Metadata, the broker a share consumer sends its ShareFetch and
  ShareAcknowledge to.
This module maps the four APIs onto the broker's share service (`memq.broker.share.service`,
`BrokerCore.shares`): sessions, acquisition, redelivery, acknowledgements and dead letters are
its; the door checks the group and topic ACLs and which broker leads a partition, and encodes
the answers (`memq.kafka_api.share`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence

from memq.errors import ProtocolError
from memq.format.metadata import ClusterMetadata
from memq.kafka_api.flexible import FlexReader, flex_body
from memq.kafka_api.mapping import metadata_view, node_id
from memq.kafka_api.metadata_flex import topic_id
from memq.kafka_api.protocol import Node, Reader, RequestHeader
from memq.kafka_api.share import (SHARE_ACKNOWLEDGE, SHARE_FETCH, SHARE_GROUP_DESCRIBE, SHARE_GROUP_HEARTBEAT,
                                  DescribedGroup, DescribedMember, Endpoint, Key, SharePartitionData, ShareError,
                                  decode_describe, decode_heartbeat, decode_share_acknowledge, decode_share_fetch,
                                  encode_describe, encode_heartbeat, encode_share_acknowledge, encode_share_fetch)
from memq.security.acl import Operation

from ..coordinator import coordinator_of
from ..seam import BrokerCore
from .kafka_family import Conn, Family, Response

log = logging.getLogger(__name__)

#: A ShareFetch that finds nothing waits at most this long for new records, whatever it asks.
MAX_WAIT_S = 5.0
DEFAULT_MAX_RECORDS = 500


def _endpoint(nodes: list[Node], nid: int) -> list[Endpoint]:
    return [Endpoint(n.node_id, n.host, n.port, n.rack) for n in nodes if n.node_id == nid]


class ShareDoor:
    """Answers one share-group request (a door object per request: the state is in `core.shares`)."""

    def __init__(self, core: BrokerCore, peer: object, principal: str | None) -> None:
        self._core = core
        self._principal = principal
        self._shares = core.shares
        self._peer = peer

    async def serve(self, h: RequestHeader, body: FlexReader) -> bytes:
        """The response; a frame that does not parse is answered INVALID_REQUEST in the API's shape."""
        try:
            if h.api_key == SHARE_GROUP_HEARTBEAT:
                return self.heartbeat(h, body)
            if h.api_key == SHARE_GROUP_DESCRIBE:
                return self.describe(h, body)
            if h.api_key == SHARE_FETCH:
                return await self.share_fetch(h, body)
            return await self.share_acknowledge(h, body)
        except ProtocolError as e:
            log.info("bad share request (API key %d) from %s: %s", h.api_key, self._peer, e)
            return invalid_request(h, str(e))

    def _may_group(self, operation: Operation, group: str) -> bool:
        """Whether the principal may do `operation` on `group` (ACL resource `group:NAME`), a
        refusal counted as a `group` denial: `consume` to be a member, fetch and acknowledge,
        `describe` to describe it."""
        return self._core.guard.allowed_group(self._principal, operation, group)

    # --- topics ----------------------------------------------------------------------------

    def _topics(self) -> tuple[ClusterMetadata, dict[uuid.UUID, str]]:
        meta = self._core.metadata()
        return meta, self._shares.topic_names(meta.cluster, meta.topics)

    def _partitions(self, topics: Sequence[str]) -> list[Key]:
        meta = self._core.metadata()
        out: list[Key] = []
        for name in sorted(set(topics)):
            t = meta.topics.get(name)
            if t is not None:
                tid = topic_id(meta.cluster, name)
                out += [(tid, p) for p in range(t.read_partitions)]
        return out

    # --- ShareGroupHeartbeat, ShareGroupDescribe -------------------------------------------

    def heartbeat(self, h: RequestHeader, body: FlexReader) -> bytes:
        req = decode_heartbeat(body)
        interval = self._shares.config.heartbeat_interval_ms
        if not self._may_group(Operation.CONSUME, req.group_id):
            return encode_heartbeat(h.correlation_id, ShareError.GROUP_AUTHORIZATION_FAILED,
                                    f"principal {self._principal} may not consume group {req.group_id!r}", None, 0,
                                    interval, None)
        if coordinator_of(self._core.metadata(), req.group_id) != self._core.broker_id:
            return encode_heartbeat(h.correlation_id, ShareError.NOT_COORDINATOR, "not this group's coordinator",
                                    None, 0, interval, None)
        if not req.group_id:
            return encode_heartbeat(h.correlation_id, ShareError.INVALID_GROUP_ID, "empty group id", None, 0,
                                    interval, None)
        beat = self._shares.groups.heartbeat(req.group_id, req.member_id, req.member_epoch, req.rack_id, req.topics,
                                             self._partitions, client_id=h.client_id or "",
                                             client_host=str(self._peer))
        if beat.error:
            return encode_heartbeat(h.correlation_id, ShareError[beat.error], beat.error, None, 0, interval, None)
        assignment: dict[uuid.UUID, tuple[int, ...]] | None = None
        if beat.assignment is not None:
            grouped: dict[uuid.UUID, list[int]] = {}
            for tid, p in beat.assignment:
                grouped.setdefault(tid, []).append(p)
            assignment = {t: tuple(ps) for t, ps in grouped.items()}
        return encode_heartbeat(h.correlation_id, ShareError.NONE, None, beat.member_id, beat.epoch, interval,
                                assignment)

    def describe(self, h: RequestHeader, body: FlexReader) -> bytes:
        meta, names = self._topics()
        out = []
        for gid in decode_describe(body):
            g = self._shares.groups.groups.get(gid)
            if not self._may_group(Operation.DESCRIBE, gid):
                out.append(DescribedGroup(gid, ShareError.GROUP_AUTHORIZATION_FAILED,
                                          f"principal {self._principal} may not describe group {gid!r}"))
            elif coordinator_of(meta, gid) != self._core.broker_id:
                out.append(DescribedGroup(gid, ShareError.NOT_COORDINATOR, "not this group's coordinator"))
            elif g is None:
                out.append(DescribedGroup(gid, ShareError.GROUP_ID_NOT_FOUND, f"no share group {gid}"))
            else:
                members = []
                for m in g.members.values():
                    per: dict[uuid.UUID, list[int]] = {}
                    for tid, p in g.target.get(m.member_id, ()):
                        per.setdefault(tid, []).append(p)
                    members.append(DescribedMember(m.member_id, m.rack, m.epoch, m.client_id, m.client_host, m.topics,
                                                   tuple((t, names.get(t, ""), tuple(ps)) for t, ps in per.items())))
                out.append(DescribedGroup(gid, state="Stable" if members else "Empty", epoch=g.epoch,
                                          members=tuple(members)))
        return encode_describe(h.correlation_id, out)

    # --- ShareFetch, ShareAcknowledge ------------------------------------------------------

    def _leader(self, name: str, partition: int) -> tuple[int, list[Node]]:
        nodes, topics = metadata_view(self._core.metadata(), (name,))
        leaders = topics[0].leaders if topics else ()
        return (leaders[partition] if 0 <= partition < len(leaders) else -1), nodes

    def _refusal(self, names: dict[uuid.UUID, str], key: Key, out: SharePartitionData,
                 endpoints: list[Endpoint]) -> str | None:
        """The topic name when this broker serves `key`; else None with `out.error` set."""
        tid, p = key
        name = names.get(tid)
        if name is None:
            out.error = ShareError.UNKNOWN_TOPIC_ID
            return None
        guard = self._core.guard
        if guard.enabled and not guard.may(self._principal, Operation.CONSUME, name):
            guard.count_denial(Operation.CONSUME)
            out.error = ShareError.TOPIC_AUTHORIZATION_FAILED
            return None
        leader, nodes = self._leader(name, p)
        out.leader = leader
        if leader < 0:
            out.error = ShareError.UNKNOWN_TOPIC_OR_PARTITION
            return None
        if leader != node_id(self._core.broker_id):
            out.error = ShareError.NOT_LEADER_OR_FOLLOWER
            endpoints += [e for e in _endpoint(nodes, leader) if e not in endpoints]
            return None
        return name

    async def share_fetch(self, h: RequestHeader, body: FlexReader) -> bytes:
        req = decode_share_fetch(body)
        lock_ms = self._shares.config.record_lock_ms
        if not self._may_group(Operation.CONSUME, req.group_id):
            return encode_share_fetch(h.correlation_id, ShareError.GROUP_AUTHORIZATION_FAILED,
                                      f"principal {self._principal} may not consume group {req.group_id!r}", lock_ms, {}, [])
        session, err = self._shares.open_session(req.group_id, req.member_id, req.session_epoch, list(req.partitions))
        if session is None:
            return encode_share_fetch(h.correlation_id, err, err.name, lock_ms, {}, [])
        _, names = self._topics()
        for key in req.forgotten:
            session.keys.discard(key)
        endpoints: list[Endpoint] = []
        outs: dict[Key, SharePartitionData] = {}
        served: dict[Key, str] = {}
        for key in list(req.partitions) + sorted(session.keys - set(req.partitions)):
            out = outs[key] = SharePartitionData(key[1])
            name = self._refusal(names, key, out, endpoints)
            if name is not None:
                served[key] = name
        acked = False
        for key, batches in req.partitions.items():
            if batches and key in served:
                outs[key].ack_error = await self._shares.acknowledge(req.group_id, req.member_id, served[key], key[1],
                                                                     batches)
                acked = True
        closing = req.session_epoch == -1
        if closing:
            self._shares.release(req.group_id, req.member_id, session.keys)
        elif req.max_records > 0 or req.max_bytes > 0:
            await self._shares.fetch(req.group_id, req.member_id, served, outs, req.max_records or DEFAULT_MAX_RECORDS,
                                     max(req.max_bytes, 1), min(req.max_wait_ms / 1000, MAX_WAIT_S))
        if acked or closing:
            await self._shares.committed()
        topics: dict[uuid.UUID, list[SharePartitionData]] = {}
        for (tid, _), out in outs.items():
            topics.setdefault(tid, []).append(out)
        return encode_share_fetch(h.correlation_id, ShareError.NONE, None, lock_ms, topics, endpoints)

    async def share_acknowledge(self, h: RequestHeader, body: FlexReader) -> bytes:
        req = decode_share_acknowledge(body)
        if not self._may_group(Operation.CONSUME, req.group_id):
            return encode_share_acknowledge(h.correlation_id, ShareError.GROUP_AUTHORIZATION_FAILED,
                                            f"principal {self._principal} may not consume group {req.group_id!r}", {}, [])
        session, err = self._shares.open_session(req.group_id, req.member_id, req.session_epoch, [])
        if session is None:
            return encode_share_acknowledge(h.correlation_id, err, err.name, {}, [])
        _, names = self._topics()
        endpoints: list[Endpoint] = []
        topics: dict[uuid.UUID, list[tuple[int, ShareError, str | None, int]]] = {}
        for key, batches in req.partitions.items():
            out = SharePartitionData(key[1])
            name = self._refusal(names, key, out, endpoints)
            code = out.error if name is None else await self._shares.acknowledge(
                req.group_id, req.member_id, name, key[1], batches)
            topics.setdefault(key[0], []).append((key[1], code, None if not code else code.name, out.leader))
        if req.session_epoch == -1:
            self._shares.release(req.group_id, req.member_id, session.keys)
        await self._shares.committed()
        return encode_share_acknowledge(h.correlation_id, ShareError.NONE, None, topics, endpoints)


def invalid_request(h: RequestHeader, why: str) -> bytes:
    """INVALID_REQUEST in the shape of the response to `h` (a share API)."""
    e, c = ShareError.INVALID_REQUEST, h.correlation_id
    if h.api_key == SHARE_GROUP_HEARTBEAT:
        return encode_heartbeat(c, e, why, None, 0, 0, None)
    if h.api_key == SHARE_GROUP_DESCRIBE:
        return encode_describe(c, [DescribedGroup("", e, why)])
    if h.api_key == SHARE_FETCH:
        return encode_share_fetch(c, e, why, 0, {}, [])
    return encode_share_acknowledge(c, e, why, {}, [])


async def serve(conn: Conn, h: RequestHeader, body: Reader) -> Response:
    return asyncio.ensure_future(ShareDoor(conn.core, conn.peer, conn.principal).serve(h, flex_body(body)))


FAMILY = Family("share", dict.fromkeys((SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_FETCH, SHARE_ACKNOWLEDGE),
                                      (1, 1)),
                "consume on the group and the topic (describe to describe the group)", serve)
