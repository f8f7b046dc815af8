"""TopicRouter learns every topic a metadata answer places, so a producer of many topics asks once."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from memq.client import _metadata
from memq.client._metadata import TopicRouter
from memq.errors import AuthorizationError, UnknownTopicError
from memq.format.metadata import BrokerMetadata, ClusterMetadata, StorageMetadata, TopicMetadata, TopicRefusal

URL = "http://127.0.0.1:1"


async def test_one_metadata_answer_places_every_topic_it_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    placed = {f"t{i}": TopicMetadata(f"t{i}", f"n{i}", 1, (URL,)) for i in range(1000)}
    placed["unassigned"] = TopicMetadata("unassigned", "nu", 1, ())

    async def fetch(_session: Any, url: str, _timeout_s: float, _auth: Any, _topics: tuple[str, ...]) -> ClusterMetadata:
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


async def test_a_refused_topic_is_an_authorization_error_at_once_unless_a_broker_shows_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One round of metadata, no retry, and never 'unknown'; a broker still showing the topic
    (its ACLs not yet updated, say) wins, and the broker's produce check decides."""
    other = "http://127.0.0.1:2"
    asked: list[tuple[str, tuple[str, ...]]] = []
    shows = {URL: False, other: False}

    async def fetch(_session: Any, url: str, _timeout_s: float, _auth: Any, topics: tuple[str, ...]) -> ClusterMetadata:
        asked.append((url, topics))
        brokers = (BrokerMetadata("b1", URL), BrokerMetadata("b2", other))
        if shows[url]:
            return ClusterMetadata("c", url, "", StorageMetadata(), brokers, {"sec": TopicMetadata("sec", "n", 1, (url,))})
        return ClusterMetadata("c", url, "", StorageMetadata(), brokers, {},
                               {t: TopicRefusal("alice", "describe") for t in topics})

    monkeypatch.setattr(_metadata, "fetch_metadata_async", fetch)
    async with aiohttp.ClientSession() as session:     # unused: fetch is faked
        router = TopicRouter([URL, other], session=session, timeout_s=1.0)
        with pytest.raises(AuthorizationError, match="principal alice may not describe topic sec"):
            await router.brokers_for("sec")
        assert sorted(asked) == [(URL, ("sec",)), (other, ("sec",))]
        shows[other] = True
        assert await router.brokers_for("sec") == [other]
