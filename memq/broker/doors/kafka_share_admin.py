"""The Kafka door's share-group offset admin calls: Describe-, Alter- and DeleteShareGroupOffsets.

They go to the group's coordinator (`memq.broker.coordinator`), as in Kafka. Describing reads
each share-partition's start offset (this broker's copy when it holds one, else the store's); altering
or deleting goes through the same fenced store as acknowledgements (`Shares.reset`), and only
while the group has no active member (NON_EMPTY_GROUP otherwise). Group ACLs as Kafka's: `describe`
on the group to describe (and `describe` on each topic), `admin` to alter or delete (and `consume`
on each topic).
"""

from __future__ import annotations

import asyncio
import logging

from memq.errors import MemqError, ProtocolError
from memq.kafka_api.flexible import FlexReader, flex_body
from memq.kafka_api.mapping import metadata_view, node_id
from memq.kafka_api.metadata_flex import topic_id
from memq.kafka_api.protocol import Reader, RequestHeader
from memq.kafka_api.share import ShareError
from memq.kafka_api.share_admin import (APIS, ALTER_SHARE_GROUP_OFFSETS, DESCRIBE_SHARE_GROUP_OFFSETS,
                                        PartitionResult, TopicResults, decode_alter_offsets, decode_delete_offsets,
                                        decode_describe_offsets, encode_changed_offsets, encode_describe_offsets)
from memq.security.acl import Operation

from ..coordinator import coordinator_of
from ..seam import BrokerCore
from .kafka_family import Conn, Family, Response

log = logging.getLogger(__name__)

class ShareAdminDoor:
    """Answers one share-group offsets request."""

    def __init__(self, core: BrokerCore, peer: object, principal: str | None) -> None:
        self._core = core
        self._shares = core.shares
        self._peer = peer
        self._principal = principal

    async def serve(self, h: RequestHeader, body: FlexReader) -> bytes:
        """The response; a frame that does not parse is answered INVALID_REQUEST in the API's shape."""
        try:
            if h.api_key == DESCRIBE_SHARE_GROUP_OFFSETS:
                return await self.describe(h, body)
            return await self.change(h, body)
        except ProtocolError as e:
            log.info("bad share offsets request (API key %d) from %s: %s", h.api_key, self._peer, e)
            if h.api_key == DESCRIBE_SHARE_GROUP_OFFSETS:
                return encode_describe_offsets(h.correlation_id, [("", [], ShareError.INVALID_REQUEST, str(e))])
            return encode_changed_offsets(h.correlation_id, ShareError.INVALID_REQUEST, str(e), [])

    def _group_error(self, group: str, operation: Operation) -> tuple[ShareError, str | None]:
        if not self._core.guard.allowed_group(self._principal, operation, group):
            return ShareError.GROUP_AUTHORIZATION_FAILED, f"principal {self._principal} may not {operation} group {group!r}"
        if coordinator_of(self._core.metadata(), group) != self._core.broker_id:
            return ShareError.NOT_COORDINATOR, "not this group's coordinator"
        return ShareError.NONE, None

    def _partition_error(self, topic: str, partition: int, operation: Operation) -> PartitionResult | None:
        """The refusal of `topic`'s `partition`, or None when it may be served."""
        guard = self._core.guard
        if guard.enabled and not guard.may(self._principal, operation, topic):
            guard.count_denial(operation)
            return PartitionResult(partition, ShareError.TOPIC_AUTHORIZATION_FAILED,
                                   f"principal {self._principal} may not {operation} topic {topic!r}")
        t = self._core.metadata().topics.get(topic)
        if t is None or not 0 <= partition < t.read_partitions:
            return PartitionResult(partition, ShareError.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {topic}[{partition}]")
        return None

    # --- DescribeShareGroupOffsets ---------------------------------------------------------

    async def describe(self, h: RequestHeader, body: FlexReader) -> bytes:
        cluster = self._core.metadata().cluster
        out: list[tuple[str, TopicResults, ShareError, str | None]] = []
        for group, asked in decode_describe_offsets(body):
            error, message = self._group_error(group, Operation.DESCRIBE)
            if error:
                out.append((group, [], error, message))
                continue
            wanted = asked
            if wanted is None or group not in self._shares.groups.groups:
                try:
                    stored = await self._shares.stored(group)
                except MemqError as e:
                    out.append((group, [], ShareError.KAFKA_STORAGE_ERROR, str(e)))
                    continue
                if not stored and group not in self._shares.groups.groups:
                    out.append((group, [], ShareError.GROUP_ID_NOT_FOUND, f"no share group {group}"))
                    continue
                if wanted is None:
                    wanted = {}
                    for _, t, p in stored:
                        wanted[t] = wanted.get(t, ()) + (p,)
            topics: TopicResults = []
            for name, partitions in wanted.items():
                parts = []
                for p in partitions:
                    refused = self._partition_error(name, p, Operation.DESCRIBE)
                    if refused is not None:
                        parts.append(refused)
                        continue
                    try:
                        parts.append(PartitionResult(p, start_offset=await self._shares.start_of((group, name, p))))
                    except MemqError as e:
                        parts.append(PartitionResult(p, ShareError.KAFKA_STORAGE_ERROR, str(e)))
                topics.append((name, topic_id(cluster, name), parts))
            out.append((group, topics, ShareError.NONE, None))
        return encode_describe_offsets(h.correlation_id, out)

    # --- AlterShareGroupOffsets, DeleteShareGroupOffsets -----------------------------------

    async def change(self, h: RequestHeader, body: FlexReader) -> bytes:
        """Alter (each partition's new start) or Delete (each partition forgotten: start -1)."""
        if h.api_key == ALTER_SHARE_GROUP_OFFSETS:
            group, offsets = decode_alter_offsets(body)
        else:
            group, asked = decode_delete_offsets(body)
            offsets = {t: dict.fromkeys(ps, -1) for t, ps in asked.items()}
        error, message = self._group_error(group, Operation.ADMIN)
        if not error and self._shares.groups.active(group):
            error, message = ShareError.NON_EMPTY_GROUP, f"share group {group} has active members"
        if error:
            return encode_changed_offsets(h.correlation_id, error, message, [])
        cluster = self._core.metadata().cluster
        topics: TopicResults = []
        for name, parts in offsets.items():
            results = []
            for p, offset in parts.items():
                refused = self._partition_error(name, p, Operation.CONSUME)
                if refused is None and h.api_key == ALTER_SHARE_GROUP_OFFSETS and offset < 0:
                    refused = PartitionResult(p, ShareError.INVALID_REQUEST, f"start offset {offset} is negative")
                results.append(refused or await self._reset(group, name, p, offset))
            topics.append((name, topic_id(cluster, name), results))
        return encode_changed_offsets(h.correlation_id, ShareError.NONE, None, topics)

    async def _reset(self, group: str, name: str, partition: int, offset: int) -> PartitionResult:
        key = (group, name, partition)
        try:
            await self._shares.reset(key, offset)
        except MemqError as e:
            log.warning("share-partition %s: start not reset to %d: %s", key, offset, e)
            return PartitionResult(partition, ShareError.KAFKA_STORAGE_ERROR, str(e))
        finally:
            _, topics = metadata_view(self._core.metadata(), (name,))
            leaders = topics[0].leaders if topics else ()
            if not (partition < len(leaders) and leaders[partition] == node_id(self._core.broker_id)):
                self._shares.drop(key)   # its leader keeps it: hold no copy that would go stale here
        log.info("share-partition %s: start reset to %d by %s", key, offset, self._principal)
        return PartitionResult(partition)


async def serve(conn: Conn, h: RequestHeader, body: Reader) -> Response:
    return asyncio.ensure_future(ShareAdminDoor(conn.core, conn.peer, conn.principal).serve(h, flex_body(body)))


FAMILY = Family("share-admin", dict.fromkeys(APIS, (0, 0)),
                "describe on the group and topics to describe; admin on the group, consume on topics to change",
                serve)
