"""Fakes of what memq.broker.txn.service.Transactions publishes, relays and audits through (no Kafka)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from memq.broker.metrics import BrokerMetrics
from memq.broker.publish import PublishPath
from memq.broker.txn.service import GroupOffsets, Pending
from memq.clock import Clock
from memq.errors import NotifyError


class FakePublisher:
    def __init__(self) -> None:
        self.published: list[Pending] = []
        self.partitions: list[int] = []   # each published note's partition (-1: Kafka's pick)
        self.failing = False
        self.fail_next = 0   # calls to fail before `failing` is looked at
        self.calls = 0

    async def publish_many(self, notes: Sequence[Pending],
                           partitions: Sequence[int] | None = None) -> list[tuple[int, int] | NotifyError]:
        self.calls += 1
        if self.fail_next:
            self.fail_next -= 1
            return [NotifyError("kafka down") for _ in notes]
        if self.failing:
            return [NotifyError("kafka down") for _ in notes]
        self.published += notes
        self.partitions += partitions or [-1] * len(notes)
        return [(0, i) for i in range(len(notes))]

    def health(self) -> str | None:
        return None

    def close(self) -> None:
        pass


class FakeRelay:
    def __init__(self) -> None:
        self.commits: list[tuple[str, GroupOffsets]] = []
        self.refuse: dict[tuple[str, int], int] = {}
        self.closed = False

    async def commit(self, group: str, offsets: GroupOffsets) -> dict[tuple[str, int], int]:
        self.commits.append((group, offsets))
        return dict(self.refuse)

    def close(self) -> None:
        self.closed = True


class FakeAudit:
    """The coordinator's audit sink: what it was told, as tuples."""

    def __init__(self) -> None:
        self.produced_rows: list[tuple[str, int, int, int, int, int, int]] = []
        self.aborted_rows: list[tuple[str, int]] = []

    def produced(self, *, topic: str, producer_id: int, epoch: int, sequence: int, count: int, digest: int,
                 created_ms: int) -> None:
        self.produced_rows.append((topic, producer_id, epoch, sequence, count, digest, created_ms))

    def aborted(self, *, topic: str, count: int) -> None:
        self.aborted_rows.append((topic, count))


def publish_path(publisher: FakePublisher, registry: CollectorRegistry | None = None, clock: Clock | None = None,
                 republish_s: float = 0.0) -> PublishPath:
    """The broker's publish path over `publisher` (its metrics in `registry`)."""
    return PublishPath(publisher, BrokerMetrics("b1", registry or CollectorRegistry()), clock=clock,
                       republish_s=republish_s)
