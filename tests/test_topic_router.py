"""TopicRouter learns every topic a metadata answer places, so a producer of many topics asks once."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from memq.client import _metadata
from memq.client._metadata import TopicRouter
from memq.errors import UnknownTopicError
from memq.format.metadata import BrokerMetadata, ClusterMetadata, StorageMetadata, TopicMetadata

URL = "http://127.0.0.1:1"


async def test_one_metadata_answer_places_every_topic_it_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    placed = {f"t{i}": TopicMetadata(f"t{i}", f"n{i}", 1, (URL,)) for i in range(1000)}
    placed["unassigned"] = TopicMetadata("unassigned", "nu", 1, ())

    async def fetch(_session: Any, url: str, _timeout_s: float, _auth: Any) -> ClusterMetadata:
        asked.append(url)
        return ClusterMetadata("c", "b1", "", StorageMetadata(), (BrokerMetadata("b1", URL),), placed)

    monkeypatch.setattr(_metadata, "fetch_metadata_async", fetch)
    async with aiohttp.ClientSession() as session:     # unused: fetch is faked
        router = TopicRouter([URL], session=session, timeout_s=1.0)
        for i in range(1000):
            assert await router.brokers_for(f"t{i}") == [URL]
        assert asked == [URL]
        with pytest.raises(UnknownTopicError):     # a topic without brokers is still asked for, and unknown
            await router.brokers_for("unassigned")
        assert asked == [URL, URL]
