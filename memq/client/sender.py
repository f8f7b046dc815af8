"""The Producer's sending half: sealed Messages to brokers, with retries, until acked or failed.

Each Message is attempted on a broker hosting its topic (round-robin, `Router`), over one
persistent connection per broker (`Connection`, opened by a `Connector`); many attempts
are in flight at once and acks come back in any order, matched by request id. Every
attempt has a deadline of `request_timeout_ms`, and each Message one of `delivery_timeout_ms`
from its seal, retries included (Kafka's `delivery.timeout.ms`): past it the Message fails
with ProducerTimeoutError whatever is under way. A retriable failure is retried after a
jittered exponential backoff, a broker's failure at once on another broker (never twice in
a row), a timeout on a live connection to the same broker (it still holds the Message, and
answers the resend with its outcome); a retry resends the very same bytes, so consumers can drop duplicates by
(producer id, epoch, sequence). An unknown topic is retriable, as in Kafka (a topic being
created, or a broker still starting, is unknown for a moment): its Messages retry with fresh
metadata until their delivery deadline, whatever `retries` says, and then fail with
UnknownTopicError naming it. A topic the brokers refuse to show this principal is no unknown
topic: its Messages fail at once with AuthorizationError. The outcome of each Message goes to
`on_done`, once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import aiohttp

from memq.config import ProducerConfig
from memq.errors import AuthenticationError, AuthorizationError, BrokerUnavailableError, ConfigError, InvalidRecordError, \
    MemqError, MessageTooLargeError, ProduceError, \
    ProducerClosedError, ProducerFencedError, ProducerTimeoutError, TransactionError, UnknownTopicError
from memq.format.wire import RETRIABLE_CODES, REQUEST_HEADER_SIZE, Ack, AckCode, AckLevel, RequestFlag, \
    pack_request_header_into

from ._auth import BrokerAuth
from ._connection import BrokerConnection
from ._metadata import TopicRouter
from ._singleflight import SingleFlight
from .accumulator import Sealed, Waiting
from .cluster import broker_urls
from .metrics import ProducerMetrics

log = logging.getLogger("memq.client.producer")

_MAX_BACKOFF_S = 5.0

W = TypeVar("W", bound=Waiting)


class Connection(Protocol):
    """A produce connection to one broker (memq.client._connection.BrokerConnection fits)."""

    url: str
    closed: bool
    too_large: bool   # the broker closed it for a frame over its max_frame_bytes (WebSocket 1009)

    async def send(self, frame: bytes | bytearray) -> None: ...
    async def close(self) -> None: ...


Connector = Callable[[str, Callable[[Ack], None], Callable[[Any, str], None]], Awaitable[Connection]]
"""Opens a connection to a broker URL that hands acks to `on_ack` and calls `on_lost(conn, why)`."""


class Router(Protocol):
    """Which brokers host a topic (memq.client._metadata.TopicRouter fits)."""

    async def brokers_for(self, topic: str) -> list[str]: ...
    async def next_broker(self, topic: str) -> str: ...
    def broker_failed(self, url: str) -> None: ...
    def broker_ok(self, url: str) -> None: ...
    def can_fail_over(self, topic: str) -> bool: ...
    def redirect(self, topic: str, brokers: tuple[str, ...]) -> None: ...
    def forget(self, topic: str) -> None: ...
    def frame_limit(self, url: str) -> int: ...
    def partitions(self, topic: str) -> int: ...
    def keys_required(self, topic: str) -> bool: ...


@dataclass(slots=True, eq=False)   # identity semantics: kept in sets
class InFlight(Generic[W]):
    """A sealed Message on its way: its attempts so far and the one under way."""

    sealed: Sealed[W]
    done: asyncio.Future[None]
    attempt: int = 0
    failed_over: bool = False            # the last retry skipped its backoff (only one in a row may)
    request_id: int = 0
    conn: Connection | None = None
    timer: asyncio.TimerHandle | None = None       # the attempt's ack deadline
    expiry: asyncio.TimerHandle | None = None      # the Message's delivery deadline
    flags: RequestFlag = RequestFlag.NONE   # SEAL once a flush() wants it sent now
    unknown: str = ""                        # why the last attempt found the topic unknown
    pin: str = ""                            # the next attempt goes to this broker (it holds the Message)
    stale: list[int] = field(default_factory=list)   # earlier attempts timed out on a live connection


class Sender(Generic[W]):
    """Attempts sealed Messages until each is acked or has failed; `on_done(sealed, error, ack)`."""

    def __init__(self, config: ProducerConfig, on_done: Callable[[Sealed[W], BaseException | None, Ack | None], None],
                 *, router: Router | None = None, connector: Connector | None = None,
                 transactional_id: str = "") -> None:
        """`transactional_id`: every Message goes in a transaction of that id (a version 4 request,
        acked once stored and recorded as pending: ack=all whatever `config.ack` says)."""
        self.config = config
        self.transactional_id = transactional_id
        self.ack = AckLevel.ALL if transactional_id else AckLevel.parse(config.ack)
        self._on_done = on_done
        if config.delivery_timeout_ms < config.request_timeout_ms:
            raise ConfigError(f"producer.delivery_timeout_ms={config.delivery_timeout_ms} must be >= "
                              f"producer.request_timeout_ms={config.request_timeout_ms}")
        self._timeout_s = config.request_timeout_ms / 1000
        self._auth = BrokerAuth.of(config)
        self._router = router
        self._connector = connector
        self._session: aiohttp.ClientSession | None = None
        self._in_flight: dict[int, InFlight[W]] = {}      # request id -> Message being attempted
        self._stale: dict[int, InFlight[W]] = {}         # timed-out attempts whose success still counts
        self._outstanding: set[InFlight[W]] = set()      # handed over, not finished
        self._conns: dict[str, Connection] = {}
        self._connecting: SingleFlight[str, Connection] = SingleFlight()
        self._tasks: set[asyncio.Task[None]] = set()
        self._next_request_id = 1
        self.closed = False
        self.metrics = ProducerMetrics()

    # --- what the Producer calls ---------------------------------------------------------------

    def send(self, sealed: Sealed[W]) -> None:
        """Start sending `sealed` (from the event loop)."""
        loop = asyncio.get_running_loop()
        msg = InFlight(sealed, loop.create_future())
        msg.expiry = loop.call_later(self.config.delivery_timeout_ms / 1000, self._expired, msg)
        self._outstanding.add(msg)
        self._spawn(self._attempt(msg))

    async def brokers_for(self, topic: str) -> list[str]:
        """The brokers hosting `topic` (UnknownTopicError if none does)."""
        return await self._router_for().brokers_for(topic)

    def partitions(self, topic: str) -> int:
        """`topic`'s read partitions, which its keyed records are placed over, as the cluster last said."""
        return self._router_for().partitions(topic)

    def keys_required(self, topic: str) -> bool:
        """Whether records to `topic` need a key (it is compacted), as the cluster last said."""
        return self._router_for().keys_required(topic)

    async def await_topic(self, topic: str, timeout_s: float) -> None:
        """Return once a broker hosts `topic`, asking the cluster again after each backoff;
        UnknownTopicError naming it if none does within `timeout_s` (Kafka's max.block.ms), and
        AuthorizationError at once if the brokers refuse to show it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        attempt = 0
        while True:
            try:
                await self.brokers_for(topic)
                return
            except UnknownTopicError as e:
                left = deadline - loop.time()
                if left <= 0:
                    raise UnknownTopicError(f"{e}; still unknown after {timeout_s:g} s "
                                            f"(producer.max_block_ms)") from None
                attempt += 1
                await asyncio.sleep(min(self._backoff_s(attempt), left))

    async def flush(self, timeout_s: float | None = None) -> None:
        """Ask brokers to seal now, then wait until every Message handed over is finished
        (ProducerTimeoutError if some are not within `timeout_s`; they go on).

        The last not-yet-sent Message of each topic per broker carries RequestFlag.SEAL: Messages
        go round-robin, so with k brokers those are the topic's last k unsent ones. Messages
        sent before cannot be flagged any more.
        """
        by_topic: dict[str, list[InFlight[W]]] = {}
        for m in self._outstanding:
            if m.conn is None:   # its first frame is not built yet (conn is set just before)
                by_topic.setdefault(m.sealed.topic, []).append(m)
        for topic, msgs in by_topic.items():
            try:
                k = len(await self.brokers_for(topic))
            except MemqError:
                k = 1
            msgs.sort(key=lambda m: m.sealed.sequence)
            for m in msgs[-k:]:
                m.flags = RequestFlag.SEAL
        try:
            async with asyncio.timeout(timeout_s):
                while self._outstanding:
                    await asyncio.gather(*(asyncio.shield(m.done) for m in list(self._outstanding)),
                                         return_exceptions=True)
        except TimeoutError:
            raise ProducerTimeoutError(f"flush: {len(self._outstanding)} Messages not acked within "
                                       f"{timeout_s:g}s") from None

    async def close(self) -> None:
        """Close connections and stop retries; Messages not finished fail (ProducerClosedError)."""
        self.closed = True
        for m in list(self._outstanding):
            self._in_flight.pop(m.request_id, None)
            self._finish(m, ProducerClosedError(f"topic {m.sealed.topic} sequence {m.sealed.sequence}: "
                                                "producer closed before it was acked"))
        await asyncio.gather(*(c.close() for c in list(self._conns.values())), return_exceptions=True)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    # --- attempts and acks -----------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _attempt(self, msg: InFlight[W]) -> None:
        """Send `msg` once to a broker hosting its topic; the ack (or its absence) decides next."""
        if msg.done.done():   # expired (or closed) while this attempt waited
            return
        msg.attempt += 1
        request_id = self._next_request_id
        self._next_request_id += 1
        msg.request_id = request_id
        topic = msg.sealed.topic
        router = self._router_for()
        try:
            url = msg.pin or await router.next_broker(topic)
            msg.pin = ""
        except UnknownTopicError as e:
            self._retry_or_fail(msg, str(e), UnknownTopicError)
            return
        except (AuthenticationError, AuthorizationError) as e:   # a setting or a rule to fix, not a wait
            self._finish(msg, e)
            return
        except BrokerUnavailableError as e:
            self._retry_or_fail(msg, str(e), ProduceError)
            return
        try:
            conn = await self._connection(url)
        except AuthenticationError as e:   # a setting to fix: another attempt would fail the same way
            self._finish(msg, e)
            return
        except BrokerUnavailableError as e:
            router.broker_failed(url)
            self._retry_or_fail(msg, str(e), ProduceError, failover=True)
            return
        limit = router.frame_limit(url)
        if limit and len(msg.sealed.frame) > limit:   # the broker would close the connection (1009)
            self._finish(msg, MessageTooLargeError(
                f"topic {topic} sequence {msg.sealed.sequence}: a Message of {len(msg.sealed.frame)} bytes is over "
                f"broker {url}'s broker.max_frame_bytes={limit}; lower producer.max_message_bytes (now "
                f"{self.config.max_message_bytes}) below it, or raise the broker's limit"))
            return
        msg.conn = conn
        self._in_flight[request_id] = msg
        if self.ack is not AckLevel.NONE:
            msg.timer = asyncio.get_running_loop().call_later(self._timeout_s, self._timed_out, msg, request_id)
        pack_request_header_into(msg.sealed.frame, request_id, self.ack, topic, msg.flags, self.transactional_id,
                                 msg.sealed.partition)
        try:
            await conn.send(msg.sealed.frame)
        except BrokerUnavailableError as e:
            if self._in_flight.pop(request_id, None) is msg:
                self._cancel_timer(msg)
                router.broker_failed(conn.url)
                self._retry_or_fail(msg, str(e), ProduceError, failover=True)
            return
        if self.ack is AckLevel.NONE:
            self._in_flight.pop(request_id, None)
            self._finish(msg, None, Ack(request_id, True))

    def _on_ack(self, ack: Ack) -> None:
        self.metrics.throttled(ack.throttle_ms)
        msg = self._in_flight.pop(ack.id, None)
        if msg is None:
            late = self._stale.pop(ack.id, None)
            if late is not None and ack.ok:   # an earlier attempt landed after all: done
                if self._in_flight.get(late.request_id) is late:
                    del self._in_flight[late.request_id]
                self._finish(late, None, ack)
            elif ack.id < 0:
                log.warning("broker reported a connection-level error: %s %s", ack.code, ack.error)
            return   # an error ack of a timed-out attempt: the attempt under way decides
        self._cancel_timer(msg)
        if ack.ok:
            self._finish(msg, None, ack)
            return
        topic = msg.sealed.topic
        why = f"topic {topic} sequence {msg.sealed.sequence}: broker {msg.conn.url if msg.conn else '?'} " \
              f"answered {ack.code}: {ack.error}"
        if ack.code == AckCode.NOT_HERE:
            self._router_for().redirect(topic, ack.brokers)
        if ack.code in RETRIABLE_CODES:
            self._retry_or_fail(msg, why, ProduceError)
        elif ack.code == AckCode.UNKNOWN_TOPIC:
            self._router_for().forget(topic)
            self._retry_or_fail(msg, why, UnknownTopicError)
        elif ack.code == AckCode.TOO_LARGE:
            self._finish(msg, MessageTooLargeError(why))
        elif ack.code == AckCode.DENIED:
            self._finish(msg, AuthorizationError(why))
        elif ack.code == AckCode.INVALID_RECORD:
            self._finish(msg, InvalidRecordError(why))
        elif ack.code == AckCode.FENCED:
            self._finish(msg, ProducerFencedError(why))
        elif ack.code == AckCode.TXN_STATE:
            self._finish(msg, TransactionError(why))
        else:
            self._finish(msg, ProduceError(why))

    def _on_lost(self, conn: Connection, why: str) -> None:
        if self._conns.get(conn.url) is conn:
            del self._conns[conn.url]
        lost = [(rid, msg) for rid, msg in self._in_flight.items() if msg.conn is conn]
        if conn.too_large and lost:
            # The broker is fine; one frame was over its limit. The largest in flight surely is
            # (it is at least the one that was): fail it without retry; the rest go again.
            rid, msg = max(lost, key=lambda item: len(item[1].sealed.frame))
            lost.remove((rid, msg))
            del self._in_flight[rid]
            self._cancel_timer(msg)
            self._finish(msg, MessageTooLargeError(
                f"topic {msg.sealed.topic} sequence {msg.sealed.sequence}: broker {conn.url} refused a Message of "
                f"{len(msg.sealed.frame)} bytes as over its broker.max_frame_bytes (it did not say its limit); "
                f"lower producer.max_message_bytes (now {self.config.max_message_bytes})"))
        elif not self.closed:
            self._router_for().broker_failed(conn.url)
        for rid, msg in lost:
            del self._in_flight[rid]
            self._cancel_timer(msg)
            self._retry_or_fail(msg, f"connection to {conn.url} lost: {why}", ProduceError, failover=not conn.too_large)

    def _timed_out(self, msg: InFlight[W], request_id: int) -> None:
        """No ack in time. On a live connection the broker still holds the Message (it answers
        every one, and drops a resend of one it holds): the resend goes to that same broker and
        this attempt's late success still counts. A resend to another broker would store a
        second copy, multiplying writes exactly when storage is the bottleneck."""
        if self._in_flight.pop(request_id, None) is not msg:
            return
        if msg.conn is not None and not msg.conn.closed:
            self._stale[request_id] = msg
            msg.stale.append(request_id)
            msg.pin = msg.conn.url
        self._retry_or_fail(msg, f"topic {msg.sealed.topic} sequence {msg.sealed.sequence}: no ack within "
                                 f"request_timeout_ms={self.config.request_timeout_ms}", ProducerTimeoutError)

    def _expired(self, msg: InFlight[W]) -> None:
        """The delivery deadline passed: fail the Message; a late ack of its attempt is ignored."""
        if self._in_flight.get(msg.request_id) is msg:
            del self._in_flight[msg.request_id]
        what = f"topic {msg.sealed.topic} sequence {msg.sealed.sequence}: not acked within " \
               f"producer.delivery_timeout_ms={self.config.delivery_timeout_ms} ({msg.attempt} attempts)"
        self._finish(msg, UnknownTopicError(f"{what}: the topic stayed unknown: {msg.unknown}") if msg.unknown
                     else ProducerTimeoutError(what))

    def _retry_or_fail(self, msg: InFlight[W], why: str, error: type[MemqError], *, failover: bool = False) -> None:
        """Retry after a jittered exponential backoff; a broker's failure (`failover`) is retried at
        once on another broker when the topic has one (never twice in a row, so a cluster that
        is all down still gets backoff). An unknown topic is retried until the delivery deadline."""
        msg.unknown = why if error is UnknownTopicError else ""
        if (msg.attempt > self.config.retries and not msg.unknown) or self.closed:
            self._finish(msg, error(f"{why} (after {msg.attempt} attempts)"))
            return
        msg.failed_over = (failover and not msg.failed_over and self._router_for().can_fail_over(msg.sealed.topic))
        backoff = 0.0 if msg.failed_over else self._backoff_s(msg.attempt)
        log.info("retrying %s in %.2fs: %s", msg.sealed.topic, backoff, why)

        async def later() -> None:
            if backoff:
                await asyncio.sleep(backoff * (0.5 + random.random() / 2))
            await self._attempt(msg)
        self._spawn(later())

    def _backoff_s(self, attempt: int) -> float:
        """The backoff before retry number `attempt` (from 1), before jitter."""
        return min(self.config.retry_backoff_ms / 1000 * 2 ** (attempt - 1), _MAX_BACKOFF_S)

    def _cancel_timer(self, msg: InFlight[W]) -> None:
        if msg.timer is not None:
            msg.timer.cancel()
            msg.timer = None

    def _finish(self, msg: InFlight[W], error: BaseException | None, ack: Ack | None = None) -> None:
        if msg.done.done():
            return   # already failed by its deadline or by close(): the outcome is reported once
        msg.done.set_result(None)
        self._outstanding.discard(msg)
        for rid in msg.stale:
            self._stale.pop(rid, None)
        self._cancel_timer(msg)
        if msg.expiry is not None:
            msg.expiry.cancel()
        self._on_done(msg.sealed, error, ack)

    # --- connections -------------------------------------------------------------------------

    def _router_for(self) -> Router:
        if self._router is None:
            self._router = TopicRouter(broker_urls(self.config.brokers), self._session_for(),
                                       timeout_s=self._timeout_s, auth=self._auth)
        return self._router

    def _session_for(self) -> aiohttp.ClientSession:
        """Created on first use, inside the event loop (aiohttp binds a session to it)."""
        if self._session is None:
            self._session = self._auth.session(aiohttp.ClientTimeout(total=None, connect=self._timeout_s))
        return self._session

    async def _connection(self, url: str) -> Connection:
        conn = self._conns.get(url)
        if conn is not None and not conn.closed:
            return conn
        return await self._connecting.run(url, lambda: self._connect(url))

    async def open(self, url: str, on_ack: Callable[[Ack], None], on_lost: Callable[[Any, str], None]) -> Connection:
        """A connection of its own to broker `url` (a transaction's calls), with this producer's
        settings and credentials; its acks go to `on_ack`, not to the Messages'."""
        if self._connector is not None:
            return await self._connector(url, on_ack, on_lost)
        ws = BrokerConnection(url, self._session_for(), on_ack=on_ack, on_lost=on_lost, timeout_s=self._timeout_s,
                              max_frame_bytes=self.config.max_message_bytes + REQUEST_HEADER_SIZE,
                              auth=self._auth, broker_frame_limit=self._router_for().frame_limit(url))
        await ws.connect()
        return ws

    async def _connect(self, url: str) -> Connection:
        conn = await self.open(url, self._on_ack, self._on_lost)
        self._router_for().broker_ok(url)
        self._conns[url] = conn
        return conn
