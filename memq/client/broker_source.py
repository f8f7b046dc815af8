"""Parts through brokers' read caches (`GET /v1/read`), storage when no broker serves them.

The Consumer's `BatchReader` asks `BrokerParts.part` for each part it fetches. The path rule
(`read_path.PathRule`) says whether the part is near enough the tail to go through a broker;
if so, brokers are asked in `read_path.broker_order` (the writer, which holds it hot, or the
same broker for every group), each within `timeout_s`, a broker that failed skipped for
`DOWN_S`. Whatever a broker serves is checked against the notification here (size, CRC32C,
`reader.verify`): a damaged answer is counted and the part read from storage, as is a broker
that does not answer, answers busy or dies mid-read, so a broker can slow a reader down but
never hand it wrong bytes. A refusal (401, 403) is raised: reading through a broker needs the
`consume` right, and a principal without it is told so rather than served from storage.
The brokers are the metadata's at the Consumer's start, asked again every `RELIST_S` in the
background (a broker added or replaced since then is used, one gone is dropped).
Runs on the reader's `FetchLoop` (one event loop thread): its counters need no lock.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence

import aiohttp

from memq.clock import Clock
from memq.errors import AuthenticationError, AuthorizationError, DataLossError, MemqError
from memq.format.metadata import BrokerMetadata

from ._auth import BrokerAuth
from .cluster import fetch_metadata_async
from .metrics import ConsumerMetrics
from .read_path import PathRule, broker_order
from .reader import BatchPointer, verify

log = logging.getLogger(__name__)

READ_PATH = "/v1/read"    # memq.broker.doors.read
TRIES = 2                 # brokers asked for one part before storage is
DOWN_S = 10.0             # a broker that failed is not asked again for this long
READ_BUFSIZE = 1 << 20    # a part arrives in few reads (aiohttp's 64 KiB: a loop turn each, under the GIL)
RELIST_S = 60.0           # how often the broker list is asked again of a broker


class BrokerParts:
    """`brokers` as the metadata named them (none: every part from storage)."""

    def __init__(self, brokers: Sequence[BrokerMetadata], rule: PathRule, auth: BrokerAuth, metrics: ConsumerMetrics,
                 clock: Clock, *, rack: str = "", timeout_s: float, concurrency: int) -> None:
        self._brokers = tuple(b for b in brokers if b.url)
        self._rule = rule
        self._auth = auth
        self._m = metrics
        self._clock = clock
        self._rack = rack
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._sem = asyncio.Semaphore(concurrency)             # binds to the loop that first waits on it
        self._session: aiohttp.ClientSession | None = None   # made on the fetch loop, at first use
        self._down: dict[str, float] = {}                     # url -> monotonic time to ask again
        self._listed = clock.monotonic()                      # when the broker list was last asked for
        self._relisting: asyncio.Task[None] | None = None

    async def part(self, ptr: BatchPointer, storage: Callable[[], Awaitable[bytes]]) -> bytes:
        """The part `ptr` names: through a broker when the rule says so and one serves it intact,
        else `storage()`."""
        now_ms = int(self._clock.time() * 1000)
        if self._brokers and ptr.created_ms and self._rule.way(ptr.created_ms, now_ms) == "broker":
            data = await self._through_brokers(ptr)
            if data is not None:
                self._m.parts_via_broker += 1
                self._m.broker_bytes += len(data)
                return data
            self._m.broker_fallbacks += 1
        data = await storage()
        self._m.parts_via_s3 += 1
        return data

    async def _through_brokers(self, ptr: BatchPointer) -> bytes | None:
        now = self._clock.monotonic()
        if now - self._listed >= RELIST_S and self._relisting is None:
            self._listed = now
            self._relisting = asyncio.get_running_loop().create_task(self._relist())
        ordered = broker_order(self._brokers, ptr.location.key, ptr.writer, self._rack)
        up = [b for b in ordered if self._down.get(b.url, 0.0) <= now]
        for b in up[:TRIES]:
            data = await self._ask(b.url, ptr)
            if data is None:
                continue
            try:
                verify(ptr, data)
            except DataLossError as e:
                self._m.broker_corrupt += 1
                log.warning("broker %s served a damaged part (%s): reading it from storage", b.url, e)
                return None
            return data
        return None

    async def _ask(self, url: str, ptr: BatchPointer) -> bytes | None:
        """The broker's answer, None when it has none (down, busy, not its object, timed out)."""
        if self._session is None:
            self._session = self._auth.session(self._timeout, read_bufsize=READ_BUFSIZE)
        params = {"topic": ptr.topic, "bucket": ptr.location.bucket, "key": ptr.location.key,
                  "offset": str(ptr.start), "size": str(ptr.size)}
        try:
            async with self._sem, self._session.get(url + READ_PATH, params=params) as resp:
                if resp.status == 200:
                    return await resp.read()
                why = _said(await resp.text())
                if resp.status == 401:
                    raise AuthenticationError(f"broker {url} rejected the credentials for reading: {why}")
                if resp.status == 403:
                    raise AuthorizationError(f"reading topic {ptr.topic} through broker {url}: {why}")
                log.debug("broker %s did not serve %s: %s %s", url, ptr.describe(), resp.status, why)
                if resp.status >= 500:
                    self._down[url] = self._clock.monotonic() + DOWN_S
                return None
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            log.info("broker %s did not answer for %s (%s): trying the next, then storage", url, ptr.describe(), e)
            self._down[url] = self._clock.monotonic() + DOWN_S
            return None

    async def _relist(self) -> None:
        """The brokers as a live one lists them now (kept as they were if none answers)."""
        try:
            if self._session is None:
                self._session = self._auth.session(self._timeout, read_bufsize=READ_BUFSIZE)
            now = self._clock.monotonic()
            for b in sorted(self._brokers, key=lambda b: self._down.get(b.url, 0.0) > now):
                try:
                    md = await fetch_metadata_async(self._session, b.url, self._timeout.total or 5.0, self._auth)
                except MemqError as e:
                    log.debug("broker list from %s: %s", b.url, e)
                    continue
                listed = tuple(x for x in md.brokers if x.url)
                if listed:
                    self._brokers = listed
                return
        finally:
            self._relisting = None

    async def close(self) -> None:
        if self._relisting is not None:
            self._relisting.cancel()
        if self._session is not None:
            await self._session.close()


def _said(body: str) -> str:
    """The reason in a broker's refusal (`{"type", "error"}`), else its body as it came."""
    try:
        said = json.loads(body)
    except ValueError:
        return body
    return str(said.get("error", body)) if isinstance(said, dict) else body
