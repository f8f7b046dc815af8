"""The Kafka door's configs family: DescribeConfigs (v0-4), AlterConfigs (v0-2), IncrementalAlterConfigs (v0-1).

A topic's settings are its `TopicConfig` under the names of `memq.kafka_api.topic_configs`
(Kafka's where one means the same, `memq.*` otherwise), read from ZooKeeper (a static broker:
its config file) and changed through `cluster_admin.alter_topic`, the path of `memq topic alter`
with its checks. Describing needs `describe` on the topic, altering `admin`
(TOPIC_AUTHORIZATION_FAILED otherwise). IncrementalAlterConfigs SETs and DELETEs (back to memq's
default); APPEND and SUBTRACT are INVALID_CONFIG (memq has no list setting to change).
AlterConfigs replaces as Kafka does: the settings not listed return to memq's defaults. A
setting memq does not have, a bad value or a change of a read-only one is INVALID_CONFIG naming it.

Brokers (resource type 4) are a read-only view (`topic_configs.broker_entries`) of the broker
asked (its Kafka node id; "" = the cluster's defaults: none), behind `describe` on the cluster
resource (`__cluster`); altering one is INVALID_REQUEST (a memq broker takes its settings from
its config file). Other resource types are INVALID_REQUEST. Each refusal is logged.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kafka.protocol.admin import (
    AlterConfigsRequest, AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse)

from memq.config import TopicConfig
from memq.errors import ConfigError, MemqError, UnknownTopicError
from memq.kafka_api import topic_configs
from memq.kafka_api.admin import Outcome, Refused, refusal
from memq.kafka_api.mapping import node_id
from memq.kafka_api.messages import decode_request, encode_response
from memq.kafka_api.protocol import ApiKey, ErrorCode, Reader, RequestHeader
from memq.kafka_api.topic_configs import ConfigEntry
from memq.security.acl import CLUSTER_RESOURCE, Operation

from .kafka_family import AdminCall, Conn, Family, Response

TOPIC, BROKER = 2, 4     # Kafka's ConfigResource types served


class ConfigsCall(AdminCall):
    """Answers one DescribeConfigs, AlterConfigs or IncrementalAlterConfigs request."""

    def _other(self, kind: int) -> Refused:
        return Refused(ErrorCode.INVALID_REQUEST, f"config resource type {kind} is not served: topics ({TOPIC}) "
                                                  f"and, read-only, brokers ({BROKER})")

    def _cluster(self, operation: Operation) -> None:
        self.authorize(operation, CLUSTER_RESOURCE, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "the cluster")

    async def _topic(self, name: str) -> TopicConfig:
        """Topic `name`'s settings: ZooKeeper's, or without it the config file's (a static broker's topics)."""
        admin = self.core.cluster_admin
        try:
            if admin is not None:
                return await admin.topic(name)
            found = next((t for t in self.core.config.topics if t.name == name), None)
            if found is None:
                raise UnknownTopicError(f"topic {name!r} is not in broker {self.core.broker_id}'s config file")
            return found
        except MemqError as e:
            raise refusal(e, ErrorCode.INVALID_CONFIG) from None

    # --- DescribeConfigs ------------------------------------------------------------------------

    async def describe(self, req: Any) -> bytes:
        synonyms = self.h.api_version >= 1 and bool(req.include_synonyms)
        docs = self.h.api_version >= 3 and bool(req.include_documentation)
        result = DescribeConfigsResponse.DescribeConfigsResult
        entry_of = result.DescribeConfigsResourceResult

        def entry(e: ConfigEntry) -> Any:
            return entry_of(name=e.name, value=e.value, read_only=e.read_only, config_source=e.source,
                            is_default=e.is_default, is_sensitive=False, config_type=e.type,
                            synonyms=[entry_of.DescribeConfigsSynonym(name=e.name, value=e.value, source=e.source)]
                            if synonyms else [], documentation=e.doc if docs else None)

        async def one(r: Any) -> Any:
            try:
                entries = await self._described(r.resource_type, r.resource_name, r.configuration_keys)
                outcome = Outcome()
            except Refused as refused:
                entries, outcome = [], self.logged(r.resource_name, refused.outcome)
            return result(error_code=outcome.error, error_message=outcome.message, resource_type=r.resource_type,
                          resource_name=r.resource_name, configs=[entry(e) for e in entries])
        results = await asyncio.gather(*(one(r) for r in req.resources))
        return encode_response(self.h, DescribeConfigsResponse(throttle_time_ms=0, results=list(results)))

    async def _described(self, kind: int, name: str, keys: list[str] | None) -> list[ConfigEntry]:
        if kind == TOPIC:
            self.authorize(Operation.DESCRIBE, name)
            return topic_configs.describe(await self._topic(name), self.cluster, keys)
        if kind != BROKER:
            raise self._other(kind)
        self._cluster(Operation.DESCRIBE)
        me = node_id(self.core.broker_id)
        if name == "":
            return []
        if name != str(me):
            raise Refused(ErrorCode.INVALID_REQUEST, f"broker {name} is not this one (node {me}): ask that broker")
        bc = self.core.config.broker
        entries = topic_configs.broker_entries(me, self.core.broker_id, bc.rack, bc.max_frame_bytes, self.cluster)
        return entries if keys is None else [e for e in entries if e.name in keys]

    # --- AlterConfigs, IncrementalAlterConfigs --------------------------------------------------

    async def alter(self, req: Any, incremental: bool) -> bytes:
        validate = bool(req.validate_only)
        result = (IncrementalAlterConfigsResponse if incremental else AlterConfigsResponse).AlterConfigsResourceResponse

        async def one(r: Any) -> Any:
            try:
                await self._altered(r, incremental, validate)
                outcome = self.logged(r.resource_name, Outcome(), validate)
            except Refused as refused:
                outcome = self.logged(r.resource_name, refused.outcome)
            return result(error_code=outcome.error, error_message=outcome.message, resource_type=r.resource_type,
                          resource_name=r.resource_name)
        results = await asyncio.gather(*(one(r) for r in req.resources))
        response = IncrementalAlterConfigsResponse if incremental else AlterConfigsResponse
        return encode_response(self.h, response(throttle_time_ms=0, responses=list(results)))

    async def _altered(self, r: Any, incremental: bool, validate: bool) -> None:
        if r.resource_type == BROKER:
            self._cluster(Operation.ADMIN)
            raise Refused(ErrorCode.INVALID_REQUEST, "a memq broker's settings are read-only over Kafka: they come "
                                                     "from its config file")
        if r.resource_type != TOPIC:
            raise self._other(r.resource_type)
        name = r.resource_name
        self.authorize(Operation.ADMIN, name)
        admin = self.admin()
        current = await self._topic(name)
        try:
            if incremental:
                changes = topic_configs.incremental(
                    current, [(c.name, c.config_operation, c.value) for c in r.configs], self.cluster)
            else:
                changes = topic_configs.replacement(current, [(c.name, c.value) for c in r.configs], self.cluster)
            cfg = topic_configs.altered(current, changes)
            cfg.check_altered_from(current)   # here too for validate_only: TopicManager.alter checks the rest
        except ConfigError as e:
            raise Refused(ErrorCode.INVALID_CONFIG, str(e)) from None
        changed = {k: v for k, v in changes.items() if getattr(current, k) != v}
        if validate or cfg == current:
            return
        try:
            await admin.alter_topic(name, **changed)
        except MemqError as e:
            raise refusal(e, ErrorCode.INVALID_CONFIG) from None


async def serve(conn: Conn, h: RequestHeader, body: Reader) -> Response:
    """Decode now (a frame that does not parse closes the connection, logged), answer in a task."""
    call = ConfigsCall(conn, h)
    if h.api_key == ApiKey.DESCRIBE_CONFIGS:
        return asyncio.ensure_future(call.describe(decode_request(DescribeConfigsRequest, h, body)))
    if h.api_key == ApiKey.ALTER_CONFIGS:
        return asyncio.ensure_future(call.alter(decode_request(AlterConfigsRequest, h, body), False))
    return asyncio.ensure_future(call.alter(decode_request(IncrementalAlterConfigsRequest, h, body), True))


FAMILY = Family("configs", {ApiKey.DESCRIBE_CONFIGS: (0, 4), ApiKey.ALTER_CONFIGS: (0, 2),
                            ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1)},
                "describe on each topic to describe, admin to alter; describe on the cluster for brokers", serve)
