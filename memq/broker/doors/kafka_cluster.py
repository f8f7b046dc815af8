"""The Kafka door's cluster family: Metadata (v1-8 fixed-width, v9-12 flexible with topic ids).

Every broker leads every partition of every topic it knows, in the cluster view all brokers
share (`BrokerCore.metadata`): the data is in S3, so any broker can serve any read, and a
topic's produce goes to a broker that hosts it. Metadata lists only the topics the principal
may describe, and answers a requested one it may not describe TOPIC_AUTHORIZATION_FAILED,
existing or not.
"""

from __future__ import annotations

from memq.kafka_api.flexible import flex_body
from memq.kafka_api.mapping import metadata_view, node_id
from memq.kafka_api.protocol import ApiKey, Reader, RequestHeader, decode_metadata, encode_metadata

from . import kafka_share
from .kafka_family import Conn, Family, Response


async def serve(conn: Conn, h: RequestHeader, body: Reader) -> Response:
    core = conn.core
    if h.api_version >= 9:   # flexible, with topic ids (share consumers)
        return kafka_share.metadata(core, conn.principal, h, flex_body(body))
    req = decode_metadata(h, body)
    meta = core.guard.visible(conn.principal, core.metadata(), req.topics or ())
    nodes, topics = metadata_view(meta, req.topics)
    return encode_metadata(h, nodes, meta.cluster, node_id(core.broker_id), topics)


FAMILY = Family("cluster", {ApiKey.METADATA: (1, 12)}, "describe on each topic listed", serve)
