"""Fakes of what memq.broker.share.service.Shares reads and appends through (`ShareBroker`):
a partition's notifications and framed parts in memory, and an admission that keeps dead letters."""

from __future__ import annotations

from collections.abc import Callable

from memq.broker.admission import Refusal
from memq.broker.bases import Bases, MemoryCheckpoints
from memq.broker.logs import Logs
from memq.format import LogMessage, MessageHeader, Notification, decode_message
from memq.format.metadata import ClusterMetadata, StorageMetadata, TopicMetadata
from memq.format.wire import Ack, AckCode, AckLevel
from memq.kafka_api.records import FramedPart
from memq.notify.consumer import NotificationRecord


def notification(topic: str, key: str, count: int) -> Notification:
    return Notification(v=2, topic=topic, bucket="b", key=key, size=1, header_size=1, message_count=1,
                        logmessage_count=count, min_timestamp_ms=0, max_timestamp_ms=0, crc32c=0, broker_id="b1",
                        attempt=0, created_ms=0)


class FakeShareReads:
    """Notification partitions in memory: (notification topic, partition) -> offset -> framed part."""

    def __init__(self) -> None:
        self.logs: dict[tuple[str, int], dict[int, tuple[Notification, FramedPart]]] = {}
        self.low = 0

    def add(self, ntopic: str, partition: int, offset: int, part: FramedPart) -> None:
        self.logs.setdefault((ntopic, partition), {})[offset] = (
            notification(ntopic, f"{ntopic}/{partition}/{offset}", part.count), part)

    async def notes(self, notification_topic: str, partition: int, offset: int, wait_s: float
                    ) -> list[NotificationRecord]:
        log = self.logs.get((notification_topic, partition), {})
        return [NotificationRecord(partition, o, 0, log[o][0]) for o in sorted(log) if o >= offset]

    async def part(self, note: Notification) -> FramedPart:
        return next(p for log in self.logs.values() for n, p in log.values() if n.key == note.key)

    async def watermarks(self, notification_topic: str, partition: int) -> tuple[int, int]:
        log = self.logs.get((notification_topic, partition), {})
        return self.low, max(log, default=-1) + 1


class KeptAppends:
    """A topic's appends, kept decoded (every ack ok)."""

    def __init__(self) -> None:
        self.records: list[LogMessage] = []

    async def append(self, message: memoryview, header: MessageHeader, request_id: int, level: AckLevel,
                     reply: Callable[[Ack], None], *, seal: bool = False) -> None:
        self.records += decode_message(message)[1]
        reply(Ack(request_id, True))


class FakeAdmission:
    """Admits appends to the topics in `topics` only."""

    def __init__(self, *topics: str) -> None:
        self.topics = {t: KeptAppends() for t in topics}

    def admit(self, principal: str | None, topic: str, largest: int) -> KeptAppends | Refusal:
        kept = self.topics.get(topic)
        return kept if kept is not None else Refusal(AckCode.UNKNOWN_TOPIC, f"no topic {topic}")


class FakeShareBroker:
    """A broker's cluster view of `topics` (name -> read partitions), its reads and admission."""

    def __init__(self, topics: dict[str, int], admission: FakeAdmission | None = None) -> None:
        self._meta = ClusterMetadata("c", "b1", "", StorageMetadata(), topics={
            name: TopicMetadata(name, f"n.{name}", n, ("b1",)) for name, n in topics.items()})
        self.reads = FakeShareReads()
        self.admission = admission or FakeAdmission()
        self.logs = Logs(self.reads, Bases(self.reads, MemoryCheckpoints()))

    def metadata(self) -> ClusterMetadata:
        return self._meta
