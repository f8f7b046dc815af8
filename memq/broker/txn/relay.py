"""A committed transaction's group offsets, relayed to the notification Kafka's group coordinator.

Kafka clients' groups live there under their mapped name (`Groups.mapped`), memq Consumer's
(`GroupOffsets.native`) under their own; either way memq topic names become notification topics.
One OffsetCommit (v2, with the member's generation and id) per group, over one upstream link.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping

from memq.errors import NotifyError, ProtocolError
from memq.format.metadata import TopicMetadata
from memq.kafka_api.groups import commit_errors, offset_commit_request
from memq.kafka_api.protocol import ApiKey, ErrorCode, RequestHeader

from ..consumer_groups import Groups
from .state import GroupOffsets, TopicPartition

_COMMIT_V2 = RequestHeader(ApiKey.OFFSET_COMMIT, 2, 0, None)


class GroupOffsetRelay:
    """`OffsetRelay` over the broker's group relay; `topics()`: the cluster's topics now."""

    def __init__(self, groups: Groups, topics: Callable[[], Mapping[str, TopicMetadata]], client_id: str) -> None:
        self._groups = groups
        self._topics = topics
        self._client_id = client_id
        self._link = groups.link()
        self._ids = itertools.count(1)

    async def commit(self, group: str, offsets: GroupOffsets) -> dict[TopicPartition, int]:
        """Each partition's Kafka error (none: committed); a topic no longer known is
        UNKNOWN_TOPIC_OR_PARTITION. NotifyError when the coordinator cannot be reached."""
        topics = self._topics()
        errors: dict[TopicPartition, int] = {}
        asked: dict[str, list[tuple[int, int, str]]] = {}
        back: dict[str, str] = {}
        for (topic, p), (offset, metadata) in sorted(offsets.offsets.items()):
            meta = topics.get(topic)
            if meta is None:
                errors[(topic, p)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            asked.setdefault(meta.notification_topic, []).append((p, offset, metadata))
            back[meta.notification_topic] = topic
        if not asked:
            return errors
        name = group if offsets.native else self._groups.mapped(group)
        request = offset_commit_request(next(self._ids), self._client_id, name, offsets.generation,
                                        offsets.member_id, asked)
        response = await self._link.relay(name, request)   # one at a time: the link holds a lock
        try:
            answered = commit_errors(_COMMIT_V2, response)
        except ProtocolError as e:   # retried as an unreachable coordinator would be
            raise NotifyError(f"group {name!r}: OffsetCommit response does not parse: {e}") from None
        for (ntopic, p), code in answered.items():
            if code:
                errors[(back.get(ntopic, ntopic), p)] = code
        return errors

    def close(self) -> None:
        self._link.close()
