"""Where a committed transaction's group offsets go (`txn.service.OffsetRelay`): a Kafka client's
group's into memq's group store (`GroupCoordinator.commit_transaction`, from whichever broker
coordinates the transaction), memq Consumer's (`GroupOffsets.native`) to the notification Kafka,
where memq's Consumer keeps its groups (`txn.relay.GroupOffsetRelay`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from memq.format.metadata import TopicMetadata
from memq.kafka_api.protocol import ErrorCode

from ..txn.relay import GroupOffsetRelay
from ..txn.state import GroupOffsets, TopicPartition
from .service import GroupCoordinator
from .store import Offsets


class TxnGroupOffsets:
    def __init__(self, coordinator: GroupCoordinator, relay: GroupOffsetRelay,
                 topics: Callable[[], Mapping[str, TopicMetadata]]) -> None:
        self._coordinator = coordinator
        self._relay = relay
        self._topics = topics

    async def commit(self, group: str, offsets: GroupOffsets) -> dict[TopicPartition, int]:
        """Each partition's Kafka error (none: committed); CoordinationError (the store) or
        NotifyError (the notification Kafka) when it cannot be stored now."""
        if offsets.native:
            return await self._relay.commit(group, offsets)
        topics = self._topics()
        errors: dict[TopicPartition, int] = {}
        valid: Offsets = {}
        for (t, p), v in offsets.offsets.items():
            if t in topics and 0 <= p < topics[t].read_partitions:
                valid[(t, p)] = v
            else:
                errors[(t, p)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if valid:
            await self._coordinator.commit_transaction(group, valid)
        return errors

    def close(self) -> None:
        self._relay.close()
