"""An in-process broker with file storage and no Kafka, for tests of the produce path alone."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from memq.broker import Broker
from memq.config import MemqConfig
from memq.format import Notification
from memq.notify import KafkaTopic


class NullPublisher:
    """Takes every notification (nothing reads them in these tests)."""

    async def publish(self, kafka_topic: str, n: Notification) -> tuple[int, int]:
        return 0, 0


class NullAdmin:
    def create_topics(self, topics: Sequence[KafkaTopic]) -> dict[str, str]:
        return {}


@contextmanager
def broker_in_thread(config: MemqConfig) -> Iterator[str]:
    """A started Broker on its own event loop thread (so blocking callers, e.g. a CLI
    subprocess.run, can use it); yields its URL, stops it on exit."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="broker-loop", daemon=True)
    thread.start()
    broker = Broker(config, publisher=NullPublisher(), admin=NullAdmin())   # type: ignore[arg-type]
    try:
        yield asyncio.run_coroutine_threadsafe(broker.start(), loop).result(30)
    finally:
        asyncio.run_coroutine_threadsafe(broker.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
