"""The migration path: offsets a Kafka client's group committed through the relay to the
notification Kafka (before memq coordinated groups) read once, when memq's coordinator first
loads the group (`GroupCoordinator`'s `legacy`), so existing groups keep their positions.

The relay kept them under the mapped group (`kafka_api.groups.mapped_group`) and the topics'
notification topics; one OffsetFetch asks for every partition of every topic the cluster has.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from memq.errors import CoordinationError, NotifyError, ProtocolError
from memq.format.metadata import TopicMetadata
from memq.kafka_api.groups import decode_offset_fetch_v1, offset_fetch_request

from ..consumer_groups import Groups
from .store import Offsets

TIMEOUT_S = 10.0


class LegacyOffsets:
    def __init__(self, groups: Groups, topics: Callable[[], Mapping[str, TopicMetadata]]) -> None:
        self._groups = groups
        self._topics = topics

    async def read(self, group: str) -> Offsets:
        """`group`'s offsets committed through the relay (memq topic names); CoordinationError
        when the notification Kafka does not answer (the load is retried)."""
        topics = self._topics()
        if not topics:
            return {}
        back = {t.notification_topic: name for name, t in topics.items()}
        asked = {t.notification_topic: list(range(t.read_partitions)) for t in topics.values()}
        mapped = self._groups.mapped(group)
        link = self._groups.link()
        try:
            response = await asyncio.wait_for(
                link.relay(mapped, offset_fetch_request(0, "memq-group-migration", mapped, asked)), TIMEOUT_S)
            found = decode_offset_fetch_v1(response)
        except (NotifyError, ProtocolError, TimeoutError) as e:
            raise CoordinationError(f"group {group!r}: offsets committed through the relay not read: {e}") from e
        finally:
            link.close()
        return {(back[t], p): (o, "") for (t, p), o in found.items() if t in back and o >= 0}
