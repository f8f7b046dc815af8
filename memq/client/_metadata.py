"""Which brokers host a topic, learned from any broker's `/v1/metadata` and from NOT_HERE acks."""

from __future__ import annotations

import asyncio
import itertools

import aiohttp

from memq.errors import BrokerUnavailableError, UnknownTopicError


class TopicRouter:
    def __init__(self, bootstrap: list[str], session: aiohttp.ClientSession, *, timeout_s: float) -> None:
        if not bootstrap:
            raise BrokerUnavailableError("no broker URLs given (producer.brokers is empty)")
        self._known = dict.fromkeys(u.rstrip("/") for u in bootstrap)   # ordered set of broker URLs
        self._session = session
        self._timeout_s = timeout_s
        self._topics: dict[str, list[str]] = {}
        self._cursor: dict[str, itertools.cycle[str]] = {}

    async def brokers_for(self, topic: str) -> list[str]:
        """The brokers hosting `topic`; asks the cluster on a miss. UnknownTopicError if none does."""
        brokers = self._topics.get(topic)
        if brokers:
            return brokers
        return await self.refresh(topic)

    async def next_broker(self, topic: str) -> str:
        """Round-robin over the topic's brokers, to spread its Messages."""
        brokers = await self.brokers_for(topic)
        cursor = self._cursor.get(topic)
        if cursor is None:
            cursor = self._cursor[topic] = itertools.cycle(brokers)
        return next(cursor)

    def redirect(self, topic: str, brokers: tuple[str, ...]) -> None:
        """A NOT_HERE ack named where the topic lives now (or nothing: forget and ask again)."""
        self.forget(topic)
        if brokers:
            urls = [b.rstrip("/") for b in brokers]
            self._known.update(dict.fromkeys(urls))
            self._topics[topic] = urls

    def forget(self, topic: str) -> None:
        self._topics.pop(topic, None)
        self._cursor.pop(topic, None)

    async def refresh(self, topic: str) -> list[str]:
        """Ask every known broker for metadata (concurrently) and merge what they host."""
        results = await asyncio.gather(*(self._fetch(u) for u in list(self._known)), return_exceptions=True)
        answered = [r for r in results if isinstance(r, dict)]
        if not answered:
            raise BrokerUnavailableError(f"no broker answered /v1/metadata (tried {', '.join(self._known)}): "
                                         f"{results[0]!r}")
        hosting: dict[str, None] = {}
        for md in answered:
            for b in md.get("brokers", ()):
                self._known.setdefault(str(b["url"]).rstrip("/"))
            info = md.get("topics", {}).get(topic)
            if info:
                hosting.update(dict.fromkeys(str(u).rstrip("/") for u in info["brokers"]))
        if not hosting:
            raise UnknownTopicError(f"topic {topic!r} is not hosted by any broker ({', '.join(self._known)})")
        self.forget(topic)
        self._topics[topic] = list(hosting)
        return self._topics[topic]

    async def _fetch(self, url: str) -> dict:
        try:
            async with asyncio.timeout(self._timeout_s):
                async with self._session.get(url + "/v1/metadata") as resp:
                    resp.raise_for_status()
                    return await resp.json()
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
            raise BrokerUnavailableError(f"metadata from {url}: {e!r}") from None
