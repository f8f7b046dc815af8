"""Which brokers host a topic, learned from any broker's `/v1/metadata` (through
`memq.client.cluster`) and from NOT_HERE acks.

A broker whose connection failed is skipped for `DOWN_S` (unless every broker of the topic
is down), and the topics it hosted are re-learned from the other brokers, so retries go to
survivors at once instead of waiting for the cluster's view (the governor's, after a
ZooKeeper session timeout) to drop it.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import aiohttp

from memq.errors import AuthenticationError, BrokerUnavailableError, UnknownTopicError
from memq.format.metadata import ClusterMetadata

from ._auth import NO_AUTH, BrokerAuth
from ._singleflight import SingleFlight
from .cluster import fetch_metadata_async, refusal


DOWN_S = 10.0   # longer than a governor needs to move a dead broker's topics (session timeout + a cycle)


class TopicRouter:
    def __init__(self, bootstrap: list[str], session: aiohttp.ClientSession, *, timeout_s: float,
                 auth: BrokerAuth = NO_AUTH) -> None:
        if not bootstrap:
            raise BrokerUnavailableError("no broker URLs given (producer.brokers is empty)")
        self._known = dict.fromkeys(u.rstrip("/") for u in bootstrap)   # ordered set of broker URLs
        self._session = session
        self._timeout_s = timeout_s
        self._auth = auth
        self._topics: dict[str, list[str]] = {}
        self._cursor: dict[str, itertools.cycle[str]] = {}
        self._down: dict[str, float] = {}                # url -> monotonic time it may be tried again
        self._frame_limits: dict[str, int] = {}          # url -> the largest frame it reads, as it said
        self._refreshing: SingleFlight[str, list[str]] = SingleFlight()
        self._partitions: dict[str, int] = {}            # topic -> its read partitions (keyed records placed over them)
        self._compacted: set[str] = set()                 # compacted topics: their records need keys

    async def brokers_for(self, topic: str) -> list[str]:
        """The brokers hosting `topic`; asks the cluster on a miss. UnknownTopicError if none does,
        AuthorizationError if brokers refuse to show it to this principal."""
        brokers = self._topics.get(topic)
        if brokers:
            return brokers
        return await self.refresh(topic)

    async def next_broker(self, topic: str) -> str:
        """Round-robin over the topic's usable brokers, to spread its Messages."""
        brokers = await self.brokers_for(topic)
        cursor = self._cursor.get(topic)
        if cursor is None:
            cursor = self._cursor[topic] = itertools.cycle(brokers)
        for _ in brokers:
            url = next(cursor)
            if not self._is_down(url):
                return url
        return next(cursor)   # all down: try anyway (a restarted broker comes back on its URL)

    def broker_failed(self, url: str) -> None:
        """A connection to `url` failed: skip it for DOWN_S and re-learn the topics it hosted."""
        self._down[url] = time.monotonic() + DOWN_S
        for topic, brokers in list(self._topics.items()):
            if url in brokers:
                self.forget(topic)

    def can_fail_over(self, topic: str) -> bool:
        """Whether a retry may find a usable broker for `topic` now: one is known, or the
        topic is about to be re-learned."""
        brokers = self._topics.get(topic)
        return not brokers or any(not self._is_down(b) for b in brokers)

    def frame_limit(self, url: str) -> int:
        """The largest produce frame broker `url` said it reads (0: not known)."""
        return self._frame_limits.get(url, 0)

    def partitions(self, topic: str) -> int:
        """`topic`'s read partitions, which its keyed records are placed over, as the last
        metadata said (1 for a topic it did not name)."""
        return self._partitions.get(topic, 1)

    def keys_required(self, topic: str) -> bool:
        """Whether `topic`'s records need a key (it is compacted), as the last metadata said."""
        return topic in self._compacted

    def broker_ok(self, url: str) -> None:
        self._down.pop(url, None)

    def _is_down(self, url: str) -> bool:
        until = self._down.get(url)
        if until is None:
            return False
        if until <= time.monotonic():
            del self._down[url]
            return False
        return True

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
        """Ask every known usable broker for metadata (concurrently) and merge what they host;
        concurrent callers for one topic share one round."""
        return await self._refreshing.run(topic, lambda: self._refresh(topic))

    async def _refresh(self, topic: str) -> list[str]:
        asked = [u for u in self._known if not self._is_down(u)] or list(self._known)
        results = await asyncio.gather(*(fetch_metadata_async(self._session, u, self._timeout_s, self._auth, (topic,))
                                         for u in asked),
                                       return_exceptions=True)
        answered = [r for r in results if isinstance(r, ClusterMetadata)]
        if not answered:
            rejected = next((r for r in results if isinstance(r, AuthenticationError)), None)
            if rejected is not None:
                raise rejected
            raise BrokerUnavailableError(f"no broker answered /v1/metadata (tried {', '.join(asked)}): "
                                         f"{results[0]}")
        hosting: dict[str, dict[str, None]] = {}
        for md in answered:
            for b in md.brokers:
                self._known.setdefault(b.url.rstrip("/"))
                if b.max_frame_bytes:
                    self._frame_limits[b.url.rstrip("/")] = b.max_frame_bytes
            for name, info in md.topics.items():
                self._partitions[name] = info.read_partitions
                if "compact" in info.cleanup_policy:
                    self._compacted.add(name)
                else:
                    self._compacted.discard(name)
                if info.brokers:
                    hosting.setdefault(name, {}).update(dict.fromkeys(info.brokers))
        if topic not in hosting:
            refused = next((r for md in answered if (r := refusal(md, topic)) is not None), None)
            if refused is not None:   # not retriable: the principal needs a rule, not time
                raise refused
            raise UnknownTopicError(f"topic {topic!r} is not hosted by any broker ({', '.join(self._known)})")
        # Keep every topic the answers place, as Kafka clients do: a producer of a thousand topics
        # learns them in one round, not one round each. Known topics keep theirs (and their cursor).
        for name, urls in hosting.items():
            self._topics.setdefault(name, list(urls))
        self.forget(topic)
        self._topics[topic] = list(hosting[topic])
        return self._topics[topic]
