"""An in-process broker with file storage and no Kafka, for tests of the produce path alone."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from memq.broker.server import Broker
from memq.config import MemqConfig
from memq.errors import NotifyError
from memq.format import Notification
from memq.notify import KafkaTopic


class OneByOne:
    """A test publisher (the broker's `Publisher`): `publish_many` from its `publish`, each note
    in turn, errors as results, a note given a partition published there (as Kafka would); always
    healthy, nothing to close."""

    async def publish(self, kafka_topic: str, n: Notification) -> tuple[int, int]:
        raise NotImplementedError

    async def publish_many(self, notes: Sequence[tuple[str, Notification]],
                           partitions: Sequence[int] | None = None) -> list[tuple[int, int] | NotifyError]:
        out: list[tuple[int, int] | NotifyError] = []
        for i, (kafka_topic, n) in enumerate(notes):
            try:
                partition, offset = await self.publish(kafka_topic, n)
                out.append((partitions[i], offset) if partitions and partitions[i] >= 0 else (partition, offset))
            except Exception as e:
                out.append(e if isinstance(e, NotifyError) else NotifyError(str(e)))
        return out

    def health(self) -> str | None:
        return None

    def close(self) -> None:
        pass


class NullPublisher(OneByOne):
    """Takes every notification (nothing reads them in these tests)."""

    async def publish(self, kafka_topic: str, n: Notification) -> tuple[int, int]:
        return 0, 0


class NullAdmin:
    def create_topics(self, topics: Sequence[KafkaTopic]) -> dict[str, str]:
        return {}


@contextmanager
def broker_in_thread(config: MemqConfig, *, notify: bool = False) -> Iterator[str]:
    """A started Broker on its own event loop thread (so blocking callers, e.g. a CLI
    subprocess.run or a Spark job, can use it); yields its URL, stops it on exit. Its
    notifications go nowhere unless `notify` (then to the config's Kafka, as in production)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="broker-loop", daemon=True)
    thread.start()
    broker = Broker(config) if notify else Broker(config, publisher=NullPublisher(), admin=NullAdmin())
    try:
        yield asyncio.run_coroutine_threadsafe(broker.start(), loop).result(30)
    finally:
        asyncio.run_coroutine_threadsafe(broker.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
