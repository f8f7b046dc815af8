"""The Kafka door's cluster family: Metadata (v1-8 fixed-width, v9-12 flexible with topic ids),
DescribeCluster, DescribeLogDirs, OffsetForLeaderEpoch and DescribeProducers.

Every broker leads every partition of every topic it knows, in the cluster view all brokers
share (`BrokerCore.metadata`): the data is in S3, so any broker can serve any read, and a
topic's produce goes to a broker that hosts it. Metadata lists only the topics the principal
may describe, and answers a requested one it may not describe TOPIC_AUTHORIZATION_FAILED,
existing or not. The other calls answer from the same view (`memq.kafka_api.cluster`), with
Kafka's ACLs mapped onto memq's: DescribeCluster needs nothing (its cluster operations are
asked of `describe` on the cluster, `acl.CLUSTER_RESOURCE`), DescribeLogDirs `describe` on the
cluster, OffsetForLeaderEpoch what ListOffsets needs (`consume`: its end offset is ListOffsets'
latest), DescribeProducers `consume` (Kafka's READ) on each topic.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from kafka.protocol.admin import (DescribeClusterRequest,
                                  DescribeLogDirsRequest, DescribeProducersRequest)
from kafka.protocol.consumer import OffsetForLeaderEpochRequest

from memq.errors import MemqError
from memq.format.metadata import TopicMetadata
from memq.kafka_api.cluster import (EpochAnswer, cluster_operations, controller, describe_cluster,
                                    describe_log_dirs, describe_producers, epoch_end, led_here,
                                    offset_for_leader_epoch)
from memq.kafka_api.flexible import FlexReader, flex_body
from memq.kafka_api.mapping import metadata_view, node_id
from memq.kafka_api.messages import decode_request, encode_response
from memq.kafka_api.metadata_flex import FlexMetadataRequest, decode_metadata_flex, encode_metadata_flex
from memq.kafka_api.protocol import ApiKey, ErrorCode, Reader, RequestHeader, decode_metadata, encode_metadata
from memq.security.acl import CLUSTER_RESOURCE, Operation

from ..seam import BrokerCore
from .kafka_family import Conn, Family, Response

log = logging.getLogger(__name__)


async def serve(conn: Conn, h: RequestHeader, body: Reader) -> Response:
    core = conn.core
    if h.api_key == ApiKey.DESCRIBE_CLUSTER:
        return asyncio.ensure_future(_describe_cluster(conn, h, decode_request(DescribeClusterRequest, h, body)))
    if h.api_key == ApiKey.DESCRIBE_LOG_DIRS:
        return _describe_log_dirs(conn, h, decode_request(DescribeLogDirsRequest, h, body))
    if h.api_key == ApiKey.OFFSET_FOR_LEADER_EPOCH:
        req = decode_request(OffsetForLeaderEpochRequest, h, body)
        return asyncio.ensure_future(_offset_for_leader_epoch(conn, h, req))
    if h.api_key == ApiKey.DESCRIBE_PRODUCERS:
        return _describe_producers(conn, h, decode_request(DescribeProducersRequest, h, body))
    if h.api_version >= 9:   # flexible, with topic ids (share consumers)
        return _metadata_flex(core, conn.principal, h, flex_body(body))
    req = decode_metadata(h, body)
    meta = core.guard.visible(conn.principal, core.metadata(), req.topics or ())
    nodes, topics = metadata_view(meta, req.topics)
    return encode_metadata(h, nodes, meta.cluster, node_id(core.broker_id), topics)


def _metadata_flex(core: BrokerCore, principal: str | None, h: RequestHeader, body: FlexReader) -> bytes:
    """Metadata with topic ids (v10+), by name or by id."""
    req: FlexMetadataRequest = decode_metadata_flex(h.api_version, body)
    meta = core.metadata()
    names = req.names
    unknown: tuple[uuid.UUID, ...] = ()
    if req.ids:
        by_id = core.shares.topic_names(meta.cluster, meta.topics)
        names = tuple(names or ()) + tuple(by_id[i] for i in req.ids if i in by_id)
        unknown = tuple(i for i in req.ids if i not in by_id)
    meta = core.guard.visible(principal, meta, names or ())
    nodes, topics = metadata_view(meta, names)
    return encode_metadata_flex(h.api_version, h.correlation_id, nodes, meta.cluster,
                                node_id(core.broker_id), topics, unknown)


def _may_cluster(conn: Conn, operation: str) -> bool:
    return conn.core.guard.may(conn.principal, Operation(operation), CLUSTER_RESOURCE)


async def _describe_cluster(conn: Conn, h: RequestHeader, req: Any) -> bytes:
    """The brokers and the governor's broker as controller (asked of ZooKeeper each time: rare)."""
    core = conn.core
    governor = None
    if core.cluster_admin is not None:
        try:
            governor = await asyncio.to_thread(core.cluster_admin.registry.governor)
        except Exception as e:   # kazoo's errors (ZooKeeper away): this broker is named controller
            log.info("Kafka DescribeCluster: governor unknown (%s: %s)", type(e).__name__, e)
    meta = core.metadata()
    ops = None
    if req.include_cluster_authorized_operations:
        ops = cluster_operations(lambda op: _may_cluster(conn, op))
    endpoint_type = req.endpoint_type if h.api_version >= 1 else 1
    if endpoint_type != 1:
        log.info("Kafka DescribeCluster from %s for endpoint type %d: refused (brokers only)", conn.peer,
                 endpoint_type)
    return encode_response(h, describe_cluster(meta, controller(meta, governor, core.broker_id), endpoint_type, ops))


def _describe_log_dirs(conn: Conn, h: RequestHeader, req: Any) -> bytes:
    core = conn.core
    if not _may_cluster(conn, "describe"):
        core.guard.count_denial(Operation.DESCRIBE)
        log.info("Kafka DescribeLogDirs from %s: principal %s may not describe the cluster", conn.peer,
                 conn.principal)
        return encode_response(h, describe_log_dirs(core.metadata().storage, (),
                                                    ErrorCode.CLUSTER_AUTHORIZATION_FAILED))
    asked = None if req.topics is None else [(t.topic, t.partitions) for t in req.topics]
    meta = core.guard.visible(conn.principal, core.metadata(), ())
    return encode_response(h, describe_log_dirs(meta.storage, led_here(meta, core.broker_id, asked)))


async def _offset_for_leader_epoch(conn: Conn, h: RequestHeader, req: Any) -> bytes:
    """Each partition's end for its asked epoch (`cluster.epoch_end`): the partition log's high
    watermark, as ListOffsets' latest answers it, with ListOffsets' checks."""
    core = conn.core
    topics = core.metadata().topics
    answer: list[EpochAnswer] = []
    for t in req.topics:
        meta = topics.get(t.topic)
        out = []
        for p in t.partitions:
            error = _consume_refusal(conn, t.topic, meta, p.partition)
            if meta is not None and not error:
                try:
                    plog = await core.logs.current(meta, p.partition, conn.peer)
                except MemqError as e:
                    log.warning("Kafka OffsetForLeaderEpoch of %s[%d]: %s", t.topic, p.partition, e)
                    error = ErrorCode.KAFKA_STORAGE_ERROR
                else:
                    out.append((p.partition, int(ErrorCode.NONE), *epoch_end(p.leader_epoch, plog.high_watermark)))
                    continue
            log.info("Kafka OffsetForLeaderEpoch of %s[%d] from %s: %s", t.topic, p.partition, conn.peer, error.name)
            out.append((p.partition, int(error), -1, -1))
        answer.append((t.topic, out))
    return encode_response(h, offset_for_leader_epoch(answer))


def _consume_refusal(conn: Conn, topic: str, meta: TopicMetadata | None, partition: int) -> ErrorCode:
    """Why a partition's consume-side call is refused (NONE: it is not): the ACL, then the partition."""
    if not conn.core.guard.allowed(conn.principal, Operation.CONSUME, topic):
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED
    if meta is None or not 0 <= partition < meta.read_partitions:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return ErrorCode.NONE


def _describe_producers(conn: Conn, h: RequestHeader, req: Any) -> bytes:
    core = conn.core
    topics = core.metadata().topics
    answer = []
    for t in req.topics:
        meta = topics.get(t.name)
        parts = []
        for p in t.partition_indexes:
            error = ErrorCode.NONE
            if not core.guard.allowed(conn.principal, Operation.CONSUME, t.name):
                error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif meta is None or not 0 <= p < meta.read_partitions:
                error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            if error:
                log.info("Kafka DescribeProducers of %s[%d] from %s: %s", t.name, p, conn.peer, error.name)
            parts.append((p, int(error)))
        answer.append((t.name, parts))
    return encode_response(h, describe_producers(answer))


FAMILY = Family(
    "cluster",
    {ApiKey.METADATA: (1, 12), ApiKey.DESCRIBE_CLUSTER: (0, 2), ApiKey.DESCRIBE_LOG_DIRS: (0, 4),
     ApiKey.OFFSET_FOR_LEADER_EPOCH: (0, 4), ApiKey.DESCRIBE_PRODUCERS: (0, 0)},
    "describe on each topic listed (Metadata); describe on the cluster (DescribeLogDirs); consume on each "
    "topic (OffsetForLeaderEpoch, DescribeProducers)",
    serve)
