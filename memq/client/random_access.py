"""Random access: one LogMessage by position (read partition, notification offset, index).

The notification is read by a throw-away assigned Kafka consumer, so the reading Consumer's
own positions are untouched; the LogMessage by two ranged GETs (the batch header, then its
Message) through the batch reader.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Protocol

from memq.client.consumer_record import ConsumerRecord, batch_pointer, record_at
from memq.client.reader import BatchReader
from memq.clock import Clock
from memq.errors import ConsumerError, InvalidInputError
from memq.notify import NotificationRecord


class Probe(Protocol):
    """A notification consumer assigned explicitly (a NotificationConsumer fits)."""

    def assign(self, partitions_offsets: Mapping[int, int]) -> None: ...
    def poll(self, timeout_s: float, max_records: int = 500) -> list[NotificationRecord]: ...
    def close(self) -> None: ...


class RandomAccess:
    """Reads single LogMessages of `topic`. `open_probe(group_id)` opens the throw-away consumer."""

    def __init__(self, topic: str, group_id: str, reader: BatchReader, open_probe: Callable[[str], Probe],
                 clock: Clock) -> None:
        self._topic, self._group_id, self._reader = topic, group_id, reader
        self._open_probe, self._clock = open_probe, clock

    def read(self, partition: int, offset: int, index: int, timeout: float) -> ConsumerRecord:
        rec = self.notification_at(partition, offset, timeout)
        n = rec.notification
        ptr = batch_pointer(self._topic, rec)
        if not 0 <= index < n.logmessage_count:
            raise InvalidInputError(f"index {index} is outside {ptr.describe()} ({n.logmessage_count} LogMessages)")
        header, log_message = self._reader.read_one(ptr, n.header_size, index, timeout)
        return record_at(ptr, rec.partition, rec.offset, index, header, log_message)

    def notification_at(self, partition: int, offset: int, timeout: float) -> NotificationRecord:
        """The notification at (partition, offset), within `timeout` seconds."""
        probe = self._open_probe(f"{self._group_id}.read.{uuid.uuid4().hex[:8]}")
        try:
            probe.assign({partition: offset})
            deadline = self._clock.monotonic() + timeout
            while self._clock.monotonic() < deadline:
                for r in probe.poll(min(0.5, max(0.0, deadline - self._clock.monotonic())), max_records=1):
                    if r.partition == partition and r.offset == offset:
                        return r
                    raise InvalidInputError(f"no notification at topic {self._topic} read partition "
                                            f"{partition} offset {offset} (next is {r.offset})")
        finally:
            probe.close()
        raise ConsumerError(f"no notification at topic {self._topic} read partition {partition} "
                            f"offset {offset} within {timeout}s")
