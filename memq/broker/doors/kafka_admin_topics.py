"""The Kafka door's topics family: CreateTopics (v0-7), DeleteTopics (v0-6), CreatePartitions (v0-3).

Kafka's tools create, delete and grow topics through the path `memq topic create|alter` and
`memq governor topic delete` take (`BrokerCore.cluster_admin`: ZooKeeper, the governor, the
notification topic), with the same checks, and `admin` on the topic (TOPIC_AUTHORIZATION_FAILED
otherwise, before anything is read, so a refusal reveals nothing).

- CreateTopics: the partitions are the topic's read partitions (-1: the config file's entry for
  that name, else memq's default); configs are `topic_configs` names. A topic has dense offsets
  (memq's default, what Kafka applications count on) unless the request says `memq.offsets=sparse`
  or the config file's entry does. Any replication factor
  (-1 or >= 1) is taken, and the answer (v5+) says 1, as Metadata lists each partition's leader as
  its only replica: S3 replicates the data, not brokers. Replica assignments are refused
  (INVALID_REPLICA_ASSIGNMENT: the governor places topics). The answer comes once the governor
  placed the topic, its brokers serve it and this broker's metadata lists it, within the
  request's timeout_ms (REQUEST_TIMED_OUT after it: the topic exists and is placed later; 0: no
  wait, as Kafka). An existing topic is TOPIC_ALREADY_EXISTS, a name memq does not take
  INVALID_TOPIC_EXCEPTION, a bad setting INVALID_CONFIG naming it.
- DeleteTopics: by name, or by topic id (v6, the ids of `metadata_flex.topic_id`); the topic and
  its notification topic go (Kafka's delete removes the data: a topic created again under the
  name starts empty), its objects expire as orphans.
- CreatePartitions: more read partitions (TopicManager grows the notification topic first); never
  fewer, never the same count (INVALID_PARTITIONS, as Kafka). A notification Kafka without
  CreatePartitions (tansu 0.6) cannot grow: INVALID_PARTITIONS saying so. A compacted topic does
  not grow (INVALID_PARTITIONS, `TopicConfig.check_altered_from`): its records are placed by key,
  and more partitions would move keys (Kafka allows it and warns).

Without ZooKeeper each broker serves the topics of its config file: every call is answered
POLICY_VIOLATION saying so. Each refusal is logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from kafka.protocol.admin import (
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest,
    DeleteTopicsResponse)

from memq.config import TopicConfig
from memq.errors import ConfigError, CoordinationError, MemqError, UnknownTopicError
from memq.kafka_api import topic_configs
from memq.kafka_api.admin import Outcome, Refused, refusal
from memq.kafka_api.messages import decode_request, encode_response
from memq.kafka_api.metadata_flex import NO_TOPIC_ID, topic_id
from memq.kafka_api.protocol import ApiKey, ErrorCode, Reader, RequestHeader
from memq.security.acl import Operation

from ..cluster_admin import PLACEMENT_TIMEOUT_S, ClusterAdmin
from .kafka_family import AdminCall, Conn, Family, Response

log = logging.getLogger(__name__)

MAX_NAME_LENGTH = 249          # Kafka's limit on a topic name
REPLICATION_FACTOR = 1         # what Metadata says of every partition: its leader is its only replica
SEEN_POLL_S = 0.1


def timeout_of(timeout_ms: int) -> float:
    """The request's timeout in seconds, at most memq's placement timeout."""
    return min(max(timeout_ms, 0) / 1000, PLACEMENT_TIMEOUT_S)


class TopicsCall(AdminCall):
    """Answers one CreateTopics, DeleteTopics or CreatePartitions request."""

    async def until_seen(self, name: str, partitions: int | None, deadline: float) -> bool:
        """Whether this broker's metadata lists `name` placed with `partitions` read partitions
        (None: lists it no more) by `deadline` (monotonic)."""
        while True:
            t = self.core.metadata().topics.get(name)
            if (t is None) if partitions is None else (t is not None and t.brokers and t.read_partitions == partitions):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(SEEN_POLL_S)

    # --- CreateTopics ---------------------------------------------------------------------------

    async def create_topics(self, req: Any) -> bytes:
        names = [t.name for t in req.topics]
        twice = {n for n in names if names.count(n) > 1}
        timeout_s = timeout_of(req.timeout_ms)
        validate = bool(req.validate_only)

        async def one(t: Any) -> Any:
            if t.name in twice:
                outcome = Outcome(ErrorCode.INVALID_REQUEST, f"topic {t.name} is named more than once in the request")
                return self._created(t.name, outcome, None)
            try:
                cfg = await self._create(t, timeout_s, validate)
            except Refused as r:
                return self._created(t.name, self.logged(t.name, r.outcome), None)
            self.logged(t.name, Outcome(), validate)
            return self._created(t.name, Outcome(), cfg)
        results = await asyncio.gather(*(one(t) for t in req.topics))
        return encode_response(self.h, CreateTopicsResponse(throttle_time_ms=0, topics=list(results)))

    def _base(self, name: str) -> TopicConfig:
        """A new topic's settings before its configs: the config file's entry for it, else memq's
        defaults (dense offsets: record numbers, what Kafka applications count on)."""
        if len(name) > MAX_NAME_LENGTH:
            raise Refused(ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic name of {len(name)} characters: at most "
                                                             f"{MAX_NAME_LENGTH}")
        try:
            return (next((t for t in self.core.config.topics if t.name == name), None)
                    or TopicConfig(name=name))
        except ConfigError as e:
            raise Refused(ErrorCode.INVALID_TOPIC_EXCEPTION, str(e)) from None

    async def _create(self, t: Any, timeout_s: float, validate: bool) -> TopicConfig:
        self.authorize(Operation.ADMIN, t.name)
        admin = self.admin()
        base = self._base(t.name)
        if t.assignments:
            raise Refused(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                          "memq's governor places topics: create it without replica assignments")
        if t.num_partitions == 0 or t.num_partitions < -1:
            raise Refused(ErrorCode.INVALID_PARTITIONS, f"{t.num_partitions} partitions: want -1 (memq's default) "
                                                        "or at least 1")
        if t.replication_factor == 0 or t.replication_factor < -1:
            raise Refused(ErrorCode.INVALID_REPLICATION_FACTOR,
                          f"replication factor {t.replication_factor}: want -1 or at least 1 (S3 replicates the data)")
        try:
            changes = topic_configs.assigned(base, [(c.name, c.value) for c in t.configs], self.cluster)
            if t.num_partitions > 0:
                changes["read_partitions"] = t.num_partitions
            in_file = any(c.name == t.name for c in self.core.config.topics)
            cfg = topic_configs.altered(base, changes).created(set(changes) | ({"storage_group"} if in_file else set()))
        except ConfigError as e:
            raise Refused(ErrorCode.INVALID_CONFIG, str(e)) from None
        deadline = time.monotonic() + timeout_s
        try:
            await admin.topic(t.name)
            raise Refused(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {t.name} already exists")
        except UnknownTopicError:
            pass
        except MemqError as e:
            raise refusal(e, ErrorCode.INVALID_CONFIG) from None
        try:
            await admin.create_topic(cfg, validate_only=validate, timeout_s=timeout_s)
        except CoordinationError as e:
            if validate or not await self._stored(admin, t.name):
                raise refusal(e, ErrorCode.INVALID_CONFIG) from None
            if timeout_s > 0:   # created; the governor places it later
                raise Refused(ErrorCode.REQUEST_TIMED_OUT, str(e)) from None
            return cfg
        except MemqError as e:   # check_partitions: its notification topic exists with another count
            raise refusal(e, ErrorCode.INVALID_PARTITIONS) from None
        if not validate and timeout_s > 0 and not await self.until_seen(t.name, cfg.read_partitions, deadline):
            raise Refused(ErrorCode.REQUEST_TIMED_OUT, f"topic {t.name} is placed but not yet in broker "
                                                       f"{self.core.broker_id}'s metadata")
        return cfg

    @staticmethod
    async def _stored(admin: ClusterAdmin, name: str) -> bool:
        try:
            await admin.topic(name)
        except MemqError:
            return False
        return True

    def _created(self, name: str, outcome: Outcome, cfg: TopicConfig | None) -> Any:
        result = CreateTopicsResponse.CreatableTopicResult
        configs = None if cfg is None else [
            result.CreatableTopicConfigs(name=e.name, value=e.value, read_only=e.read_only, config_source=e.source,
                                         is_sensitive=False)
            for e in topic_configs.describe(cfg, self.cluster)]
        return result(name=name, topic_id=topic_id(self.cluster, name) if cfg else NO_TOPIC_ID,
                      error_code=outcome.error, error_message=outcome.message,
                      num_partitions=cfg.read_partitions if cfg else -1,
                      replication_factor=REPLICATION_FACTOR if cfg else -1, configs=configs)

    # --- DeleteTopics ---------------------------------------------------------------------------

    async def delete_topics(self, req: Any) -> bytes:
        if self.h.api_version >= 6:
            asked = [(t.name, t.topic_id) for t in req.topics]
        else:
            asked = [(n, NO_TOPIC_ID) for n in req.topic_names]
        deadline = time.monotonic() + timeout_of(req.timeout_ms)

        async def one(name: str | None, tid: uuid.UUID) -> Any:
            if name is None:
                name = self._by_id(tid)
            if name is None:
                outcome = self.logged(str(tid), Outcome(ErrorCode.UNKNOWN_TOPIC_ID, f"no topic has id {tid}"))
                return DeleteTopicsResponse.DeletableTopicResult(name=None, topic_id=tid, error_code=outcome.error,
                                                                 error_message=outcome.message)
            try:
                self.authorize(Operation.ADMIN, name)
                await self._delete(name, deadline)
                outcome = self.logged(name, Outcome())
            except Refused as r:
                outcome = self.logged(name, r.outcome)
            return DeleteTopicsResponse.DeletableTopicResult(name=name, topic_id=topic_id(self.cluster, name),
                                                             error_code=outcome.error, error_message=outcome.message)
        results = await asyncio.gather(*(one(n, tid) for n, tid in asked))
        return encode_response(self.h, DeleteTopicsResponse(throttle_time_ms=0, responses=list(results)))

    def _by_id(self, tid: uuid.UUID) -> str | None:
        return next((n for n in self.core.metadata().topics if topic_id(self.cluster, n) == tid), None)

    async def _delete(self, name: str, deadline: float) -> None:
        admin = self.admin()
        try:
            await admin.delete_topic(name, notifications=True)
        except MemqError as e:
            raise refusal(e, ErrorCode.INVALID_REQUEST) from None
        await self.until_seen(name, None, deadline)

    # --- CreatePartitions -----------------------------------------------------------------------

    async def create_partitions(self, req: Any) -> bytes:
        timeout_s = timeout_of(req.timeout_ms)
        validate = bool(req.validate_only)

        async def one(t: Any) -> Any:
            try:
                await self._grow(t, time.monotonic() + timeout_s, validate)
                outcome = self.logged(t.name, Outcome(), validate)
            except Refused as r:
                outcome = self.logged(t.name, r.outcome)
            return CreatePartitionsResponse.CreatePartitionsTopicResult(
                name=t.name, error_code=outcome.error, error_message=outcome.message)
        results = await asyncio.gather(*(one(t) for t in req.topics))
        return encode_response(self.h, CreatePartitionsResponse(throttle_time_ms=0, results=list(results)))

    async def _grow(self, t: Any, deadline: float, validate: bool) -> None:
        self.authorize(Operation.ADMIN, t.name)
        admin = self.admin()
        if t.assignments:
            raise Refused(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                          "memq's governor places topics: add partitions without replica assignments")
        try:
            current = await admin.topic(t.name)
        except MemqError as e:
            raise refusal(e, ErrorCode.INVALID_PARTITIONS) from None
        if t.count <= current.read_partitions:
            raise Refused(ErrorCode.INVALID_PARTITIONS,
                          f"topic {t.name} has {current.read_partitions} partitions: it can only grow, "
                          f"not to {t.count}")
        try:
            if validate:
                topic_configs.altered(current, {"read_partitions": t.count}).check_altered_from(current)
                return
            await admin.alter_topic(t.name, read_partitions=t.count)
        except MemqError as e:
            raise refusal(e, ErrorCode.INVALID_PARTITIONS) from None
        if deadline > time.monotonic() and not await self.until_seen(t.name, t.count, deadline):
            raise Refused(ErrorCode.REQUEST_TIMED_OUT, f"topic {t.name} has {t.count} partitions, not yet in "
                                                       f"broker {self.core.broker_id}'s metadata")


async def serve(conn: Conn, h: RequestHeader, body: Reader) -> Response:
    """Decode now (a frame that does not parse closes the connection, logged), answer in a task."""
    call = TopicsCall(conn, h)
    if h.api_key == ApiKey.CREATE_TOPICS:
        return asyncio.ensure_future(call.create_topics(decode_request(CreateTopicsRequest, h, body)))
    if h.api_key == ApiKey.DELETE_TOPICS:
        return asyncio.ensure_future(call.delete_topics(decode_request(DeleteTopicsRequest, h, body)))
    return asyncio.ensure_future(call.create_partitions(decode_request(CreatePartitionsRequest, h, body)))


FAMILY = Family("topics", {ApiKey.CREATE_TOPICS: (0, 7), ApiKey.DELETE_TOPICS: (0, 6), ApiKey.CREATE_PARTITIONS: (0, 3)},
                "admin on each topic", serve)
