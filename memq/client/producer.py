"""The asyncio Producer: buffers LogMessages per topic, seals Messages, sends them to brokers.

A Message seals when its records reach `max_message_bytes` (estimated from the raw sizes) or
after `linger_ms`. Each Message carries the producer id (random u64), epoch and a per-topic
sequence; a retry resends the very same bytes, so consumers can drop duplicates by
(producer id, epoch, sequence). Buffered and unacknowledged bytes are bounded by
`max_in_flight_bytes`: `send` waits for room up to `max_block_ms`, then raises
ProducerTimeoutError. Every attempt has a deadline of `request_timeout_ms`.

The bulk calls (`send_many`, `send_batch`) do no per-record Python work beyond building
tuples (with the GC paused: they hold no cycles), and return one future for all their
records. Each buffered Message tracks its records' timestamp range, so encoding it is one
msgpack call plus compression, with no per-record pass (`encode_message(timestamps=...,
shaped=True)`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from bisect import bisect_left
from itertools import accumulate, repeat
from operator import add, itemgetter, sub
from typing import Protocol, Sequence

import aiohttp

from memq.config import ProducerConfig
from memq.errors import (BrokerUnavailableError, InvalidInputError, MemqError, MessageTooLargeError,
                         ProduceError, ProducerClosedError, ProducerTimeoutError, UnknownTopicError)
from memq.format.codec import Codec, Compressors
from memq.format.message import decode_message_header, encode_message
from memq.format.records import LogMessage, check_records, gc_paused, timestamp_range
from memq.format.wire import (RETRIABLE_CODES, Ack, AckCode, AckLevel, RequestFlag, pack_request_header_into,
                              request_header_size, REQUEST_HEADER_SIZE, MAX_TOPIC_BYTES)

from ._connection import BrokerConnection
from ._metadata import TopicRouter
from ._singleflight import SingleFlight

log = logging.getLogger(__name__)

_RECORD_OVERHEAD = 16            # msgpack framing of one record, for size estimates
_MAX_BACKOFF_S = 5.0
_timestamp_of = itemgetter(3)


class AuditSink(Protocol):
    def produced(self, *, topic: str, producer_id: int, epoch: int, sequence: int, count: int,
                 digest: int, created_ms: int) -> None: ...


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where a run of `count` records went: a Message, and for ack=all its place in storage and
    its notification. `position` is the first record's index inside the Message."""

    topic: str
    producer_id: int
    epoch: int
    sequence: int
    count: int
    position: int = 0
    bucket: str = ""
    key: str = ""
    index: int = -1
    partition: int = -1
    offset: int = -1


class _Many:
    """The future of a bulk call whose records may span several Messages."""

    __slots__ = ("future", "parts", "remaining")

    def __init__(self, future: asyncio.Future[list[Delivery]], parts: int) -> None:
        self.future = future
        self.parts: list[Delivery | None] = [None] * parts
        self.remaining = parts

    def done_part(self, i: int, d: Delivery) -> None:
        self.parts[i] = d
        self.remaining -= 1
        if self.remaining == 0 and not self.future.done():
            self.future.set_result(self.parts)   # type: ignore[arg-type]

    def fail(self, e: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(e)


# a waiter: (single future, position) or (_Many, part index, position, count)
_Waiter = tuple


@dataclass(slots=True)
class _Pending:
    """Records of one topic not yet sealed into a Message."""

    records: list[tuple] = field(default_factory=list)
    waiters: list[_Waiter] = field(default_factory=list)
    nbytes: int = 0
    lo: int = 2 ** 63 - 1                # min / max timestamp_ms of `records`
    hi: int = -2 ** 63
    timer: asyncio.TimerHandle | None = None


@dataclass(slots=True, eq=False)   # identity semantics: kept in sets
class _Message:
    topic: str
    sequence: int
    frame: bytearray                     # request header (rewritten per attempt) + the Message
    message_at: int                      # where the Message starts in `frame`
    count: int
    nbytes: int                          # accounted in-flight bytes (raw estimate)
    created_ms: int
    waiters: list[_Waiter]
    done: asyncio.Future[None]
    attempt: int = 0
    failed_over: bool = False            # the last retry skipped its backoff (only one in a row may)
    request_id: int = 0
    conn: BrokerConnection | None = None
    timer: asyncio.TimerHandle | None = None
    flags: RequestFlag = RequestFlag.NONE   # SEAL once a flush() wants it sent now


class Producer:
    def __init__(self, config: ProducerConfig, *, producer_id: int | None = None, epoch: int = 0,
                 audit: AuditSink | None = None) -> None:
        if config.codec not in ("none", "zstd", "gzip"):
            raise InvalidInputError(f"producer.codec {config.codec!r}: use none, zstd or gzip")
        self.config = config
        self.producer_id = random.getrandbits(64) if producer_id is None else producer_id
        self.epoch = epoch
        self._ack = AckLevel.parse(config.ack)
        self._codec = Codec[config.codec.upper()]
        self._compressors = Compressors()
        self._audit = audit
        self._seal_bytes = config.max_message_bytes - 1024   # room for header and msgpack framing
        self._timeout_s = config.request_timeout_ms / 1000
        self._session: aiohttp.ClientSession | None = None
        self._router: TopicRouter | None = None
        self._pending: dict[str, _Pending] = {}
        self._sequences: dict[str, int] = {}
        self._in_flight: dict[int, _Message] = {}        # request id -> Message being attempted
        self._outstanding: set[_Message] = set()         # sealed, not finished
        self._conns: dict[str, BrokerConnection] = {}
        self._connecting: SingleFlight[str, BrokerConnection] = SingleFlight()
        self._tasks: set[asyncio.Task[None]] = set()
        self._buffered = 0
        self._room = asyncio.Event()
        self._next_request_id = 1
        self._closed = False

    # --- public API ------------------------------------------------------------------------

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def send(self, topic: str, value: bytes, key: bytes | None = None,
                   headers: Sequence[tuple[str, bytes]] | None = None,
                   timestamp: int | None = None) -> asyncio.Future[Delivery]:
        """Queue one LogMessage; the returned future resolves with its Delivery (count=1)."""
        if not isinstance(value, (bytes, bytearray)) or not isinstance(key, (bytes, type(None))):
            raise InvalidInputError(f"value and key must be bytes, not {type(value).__name__}/{type(key).__name__}")
        if headers and not all(isinstance(k, str) and isinstance(v, bytes) for k, v in headers):
            raise InvalidInputError("headers must be (str, bytes) pairs")
        ts = timestamp or _now_ms()
        record = (bytes(value), key, tuple(headers) if headers else (), ts, None)
        size = _record_size(record)
        self._check_size(size)
        await self._admit(topic, size)
        fut: asyncio.Future[Delivery] = asyncio.get_running_loop().create_future()
        p = self._pending_for(topic)
        p.waiters.append((fut, len(p.records)))
        p.records.append(record)
        p.nbytes += size
        p.lo, p.hi = min(p.lo, ts), max(p.hi, ts)
        if p.nbytes >= self._seal_bytes:
            self._seal(topic)
        return fut

    async def send_many(self, topic: str, values: Sequence[bytes], *, keys: Sequence[bytes | None] | None = None,
                        headers: Sequence[tuple[str, bytes]] | None = None,
                        timestamp: int | None = None) -> asyncio.Future[list[Delivery]]:
        """Queue many values (optionally with one key each, and headers/timestamp shared by all)."""
        if keys is not None and len(keys) != len(values):
            raise InvalidInputError(f"send_many: {len(keys)} keys for {len(values)} values")
        if not values:
            raise InvalidInputError("send_many: no values")
        hdrs = tuple(headers) if headers else ()
        overhead = _RECORD_OVERHEAD + sum(len(k) + len(v) for k, v in hdrs)
        ts = timestamp or _now_ms()
        with gc_paused():   # ~30% of this call was young collections over the fresh tuples
            if keys is None:
                self._check_size(max(map(len, values)) + overhead)   # one C pass, no per-record list
                cum = list(accumulate(map(len, values)))
            else:
                cum = list(accumulate(map(add, map(len, values), (len(k) if k else 0 for k in keys))))
                self._check_size(_largest_step(cum) + overhead)
            # plain 5-tuples in LogMessage field order: msgpack packs them alike, without a
            # NamedTuple per record (the producer's hottest line)
            records = list(zip(values, repeat(None) if keys is None else keys, repeat(hdrs),
                               repeat(ts), repeat(None)))
        return await self._enqueue(topic, records, cum, overhead, ts)

    async def send_batch(self, topic: str, records: Sequence[LogMessage]) -> asyncio.Future[list[Delivery]]:
        """Queue LogMessages; one future for all, resolving with the Deliveries in record order.
        LogMessages with timestamp_ms == 0 are stamped with the current time."""
        records = list(records)
        if not records:
            raise InvalidInputError("send_batch: no records")
        check_records(records)   # here, naming the bad input now rather than at seal time
        if 0 in map(_timestamp_of, records):
            now = _now_ms()
            records = [r if r[3] else r._replace(timestamp_ms=now) for r in records]
        cum = list(accumulate(map(_record_size, records)))
        self._check_size(_largest_step(cum))
        return await self._enqueue(topic, records, cum, 0, None)

    async def _enqueue(self, topic: str, records: list[tuple], cum: list[int], per_record: int,
                       stamp: int | None) -> asyncio.Future[list[Delivery]]:
        """Add 5-tuple records to the topic's Messages. The first j records are estimated at
        `cum[j - 1] + j * per_record` bytes (each record already checked against the Message
        size by the caller); `stamp` is their common timestamp, None if they differ."""
        loop = asyncio.get_running_loop()
        many = _Many(loop.create_future(), 0)

        def upto(j: int) -> int:   # estimated bytes of records[:j]
            return cum[j - 1] + j * per_record if j else 0

        # cut the records into runs that fill the topic's pending Message, then new ones
        i, n = 0, len(records)
        while i < n:
            p = self._pending.get(topic)
            room = max(self._seal_bytes - (p.nbytes if p else 0), 1)
            base = upto(i)
            j = min(bisect_left(range(n + 1), base + room, lo=i + 1, key=upto), n)
            run_bytes = upto(j) - base
            await self._admit(topic, run_bytes)
            p = self._pending_for(topic)   # admitting may have waited while it sealed
            many.parts.append(None)
            many.remaining += 1
            p.waiters.append((many, len(many.parts) - 1, len(p.records), j - i))
            run = records[i:j]
            p.records.extend(run)
            p.nbytes += run_bytes
            lo, hi = (stamp, stamp) if stamp is not None else timestamp_range(run)
            p.lo, p.hi = min(p.lo, lo), max(p.hi, hi)
            if p.nbytes >= self._seal_bytes:
                self._seal(topic)
            i = j
        return many.future

    async def flush(self) -> None:
        """Send everything buffered now and wait until every Message is acked or failed.

        As in Kafka, flush means "send now": besides sealing the buffered records, the last
        not-yet-sent Message of each topic per broker asks its broker to seal its batch at
        once (RequestFlag.SEAL) instead of waiting up to the topic's batch_ms. Messages sent
        before the flush cannot be flagged any more; a broker holding only those still waits
        batch_ms. The cost is a smaller stored object (one more PUT) per flush and broker.
        """
        for topic in list(self._pending):
            self._seal(topic)
        await self._flag_last_messages()
        while self._outstanding:
            await asyncio.gather(*(m.done for m in list(self._outstanding)), return_exceptions=True)

    async def _flag_last_messages(self) -> None:
        """Set SEAL on each topic's last k unsent Messages, k = its broker count: Messages go
        round-robin, so those are the last ones each broker will get."""
        by_topic: dict[str, list[_Message]] = {}
        for m in self._outstanding:
            if m.conn is None:   # its first frame is not built yet (conn is set just before)
                by_topic.setdefault(m.topic, []).append(m)
        for topic, msgs in by_topic.items():
            try:
                k = len(await self._router_for().brokers_for(topic))
            except MemqError:
                k = 1
            msgs.sort(key=lambda m: m.sequence)
            for m in msgs[-k:]:
                m.flags = RequestFlag.SEAL

    async def close(self) -> None:
        """Flush, then close connections. Later sends raise ProducerClosedError."""
        if self._closed:
            return
        try:
            await self.flush()
        finally:
            self._closed = True
            await asyncio.gather(*(c.close() for c in list(self._conns.values())), return_exceptions=True)
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if self._session is not None:
                await self._session.close()

    # --- buffering -------------------------------------------------------------------------

    async def _admit(self, topic: str, size: int) -> None:
        """Wait for room in the in-flight budget (bounded by max_block_ms)."""
        if self._closed:
            raise ProducerClosedError("producer is closed")
        if not topic or len(topic.encode()) > MAX_TOPIC_BYTES:
            raise InvalidInputError(f"topic {topic!r}: must be 1..{MAX_TOPIC_BYTES} bytes")
        if topic not in self._sequences:
            await self._router_for().brokers_for(topic)   # UnknownTopicError now, not at ack time
            self._sequences.setdefault(topic, 0)
        limit = self.config.max_in_flight_bytes
        if self._buffered + size > limit and self._buffered > 0:
            deadline = time.monotonic() + self.config.max_block_ms / 1000
            for topic_name in list(self._pending):   # what waits in buffers must move to make room
                self._seal(topic_name)
            while self._buffered + size > limit and self._buffered > 0:
                self._room.clear()
                try:
                    async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
                        await self._room.wait()
                except TimeoutError:
                    raise ProducerTimeoutError(
                        f"send to {topic}: no room in producer.max_in_flight_bytes={limit} within "
                        f"max_block_ms={self.config.max_block_ms}") from None
                if self._closed:
                    raise ProducerClosedError("producer is closed")
        self._buffered += size

    def _check_size(self, record_size: int) -> None:
        if record_size > self._seal_bytes:
            raise MessageTooLargeError(f"record of ~{record_size} bytes exceeds producer.max_message_bytes="
                                       f"{self.config.max_message_bytes} (less 1 KiB for framing)")

    def _pending_for(self, topic: str) -> _Pending:
        p = self._pending.get(topic)
        if p is None:
            p = self._pending[topic] = _Pending()
            p.timer = asyncio.get_running_loop().call_later(self.config.linger_ms / 1000, self._seal, topic)
        return p

    def _seal(self, topic: str) -> None:
        p = self._pending.pop(topic, None)
        if p is None:
            return
        if p.timer is not None:
            p.timer.cancel()
        seq = self._sequences[topic]
        self._sequences[topic] = seq + 1
        created = _now_ms()
        loop = asyncio.get_running_loop()
        headroom = request_header_size(topic)
        try:
            frame = encode_message(p.records, producer_id=self.producer_id, epoch=self.epoch, sequence=seq,
                                   codec=self._codec, created_ms=created, compressors=self._compressors,
                                   timestamps=(p.lo, p.hi), shaped=True, adaptive=True, headroom=headroom)
        except MemqError as e:
            self._buffered -= p.nbytes
            self._room.set()
            for w in p.waiters:
                _fail_waiter(w, e)
            return
        msg = _Message(topic, seq, frame, headroom, len(p.records), p.nbytes, created, p.waiters, loop.create_future())
        self._outstanding.add(msg)
        self._spawn(self._attempt(msg))

    # --- sending and acks --------------------------------------------------------------------

    def _spawn(self, coro: object) -> None:
        task = asyncio.get_running_loop().create_task(coro)   # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _attempt(self, msg: _Message) -> None:
        """Send `msg` once to a broker hosting its topic; the ack (or its absence) decides next."""
        msg.attempt += 1
        request_id = self._next_request_id
        self._next_request_id += 1
        msg.request_id = request_id
        router = self._router_for()
        try:
            url = await router.next_broker(msg.topic)
        except UnknownTopicError as e:
            self._finish(msg, e)
            return
        except BrokerUnavailableError as e:
            self._retry_or_fail(msg, str(e), ProduceError)
            return
        try:
            conn = await self._connection(url)
        except BrokerUnavailableError as e:
            router.broker_failed(url)
            self._retry_or_fail(msg, str(e), ProduceError, failover=True)
            return
        msg.conn = conn
        self._in_flight[request_id] = msg
        if self._ack is not AckLevel.NONE:
            msg.timer = asyncio.get_running_loop().call_later(self._timeout_s, self._timed_out, msg, request_id)
        pack_request_header_into(msg.frame, request_id, self._ack, msg.topic, msg.flags)
        try:
            await conn.send(msg.frame)
        except BrokerUnavailableError as e:
            if self._in_flight.pop(request_id, None) is msg:
                self._cancel_timer(msg)
                self._router_for().broker_failed(conn.url)
                self._retry_or_fail(msg, str(e), ProduceError, failover=True)
            return
        if self._ack is AckLevel.NONE:
            self._in_flight.pop(request_id, None)
            self._finish(msg, None, Ack(request_id, True))

    def _on_ack(self, ack: Ack) -> None:
        msg = self._in_flight.pop(ack.id, None)
        if msg is None:
            if ack.id < 0:
                log.warning("broker reported a connection-level error: %s %s", ack.code, ack.error)
            return   # an ack for an attempt that already timed out
        self._cancel_timer(msg)
        if ack.ok:
            self._finish(msg, None, ack)
            return
        why = f"topic {msg.topic} sequence {msg.sequence}: broker {msg.conn.url if msg.conn else '?'} " \
              f"answered {ack.code}: {ack.error}"
        if ack.code == AckCode.NOT_HERE:
            self._router_for().redirect(msg.topic, ack.brokers)
        if ack.code in RETRIABLE_CODES:
            self._retry_or_fail(msg, why, ProduceError)
        elif ack.code == AckCode.UNKNOWN_TOPIC:
            self._router_for().forget(msg.topic)
            self._retry_or_fail(msg, why, UnknownTopicError)
        elif ack.code == AckCode.TOO_LARGE:
            self._finish(msg, MessageTooLargeError(why))
        else:
            self._finish(msg, ProduceError(why))

    def _on_lost(self, conn: BrokerConnection, why: str) -> None:
        if self._conns.get(conn.url) is conn:
            del self._conns[conn.url]
        if not self._closed:
            self._router_for().broker_failed(conn.url)
        for rid, msg in list(self._in_flight.items()):
            if msg.conn is conn:
                del self._in_flight[rid]
                self._cancel_timer(msg)
                self._retry_or_fail(msg, f"connection to {conn.url} lost: {why}", ProduceError, failover=True)

    def _timed_out(self, msg: _Message, request_id: int) -> None:
        if self._in_flight.pop(request_id, None) is not msg:
            return
        self._retry_or_fail(msg, f"topic {msg.topic} sequence {msg.sequence}: no ack within "
                                 f"request_timeout_ms={self.config.request_timeout_ms}", ProducerTimeoutError)

    def _retry_or_fail(self, msg: _Message, why: str, error: type[MemqError], *, failover: bool = False) -> None:
        """Retry after a jittered exponential backoff; a broker's failure (`failover`) is retried at
        once on another broker when the topic has one (never twice in a row, so a cluster that
        is all down still gets backoff)."""
        if msg.attempt > self.config.retries or self._closed:
            self._finish(msg, error(f"{why} (after {msg.attempt} attempts)"))
            return
        msg.failed_over = (failover and not msg.failed_over and self._router_for().can_fail_over(msg.topic))
        backoff = 0.0 if msg.failed_over else min(self.config.retry_backoff_ms / 1000 * 2 ** (msg.attempt - 1),
                                                  _MAX_BACKOFF_S)
        log.info("retrying %s in %.2fs: %s", msg.topic, backoff, why)

        async def later() -> None:
            if backoff:
                await asyncio.sleep(backoff * (0.5 + random.random() / 2))
            await self._attempt(msg)
        self._spawn(later())

    def _cancel_timer(self, msg: _Message) -> None:
        if msg.timer is not None:
            msg.timer.cancel()
            msg.timer = None

    def _finish(self, msg: _Message, error: BaseException | None, ack: Ack | None = None) -> None:
        self._outstanding.discard(msg)
        self._buffered -= msg.nbytes
        self._room.set()
        if not msg.done.done():
            msg.done.set_result(None)
        if error is not None:
            for w in msg.waiters:
                _fail_waiter(w, error)
            return
        assert ack is not None
        if self._audit is not None and self._ack is not AckLevel.NONE:
            self._audit.produced(topic=msg.topic, producer_id=self.producer_id, epoch=self.epoch,
                                 sequence=msg.sequence, count=msg.count, digest=decode_message_header(memoryview(msg.frame)[msg.message_at:]).body_crc32c,
                                 created_ms=msg.created_ms)
        for w in msg.waiters:
            if len(w) == 2:
                fut, pos = w
                if not fut.done():
                    fut.set_result(Delivery(msg.topic, self.producer_id, self.epoch, msg.sequence, 1, pos,
                                            ack.bucket, ack.key, ack.index, ack.partition, ack.offset))
            else:
                many, part, pos, count = w
                many.done_part(part, Delivery(msg.topic, self.producer_id, self.epoch, msg.sequence, count, pos,
                                              ack.bucket, ack.key, ack.index, ack.partition, ack.offset))

    # --- connections -------------------------------------------------------------------------

    def _router_for(self) -> TopicRouter:
        if self._router is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None,
                                                                                connect=self._timeout_s))
            urls = [u.strip() for u in self.config.brokers.split(",") if u.strip()]
            self._router = TopicRouter(urls, self._session, timeout_s=self._timeout_s)
        return self._router

    async def _connection(self, url: str) -> BrokerConnection:
        conn = self._conns.get(url)
        if conn is not None and not conn.closed:
            return conn
        return await self._connecting.run(url, lambda: self._connect(url))

    async def _connect(self, url: str) -> BrokerConnection:
        assert self._session is not None
        conn = BrokerConnection(url, self._session, on_ack=self._on_ack, on_lost=self._on_lost,
                                timeout_s=self._timeout_s,
                                max_frame_bytes=self.config.max_message_bytes + REQUEST_HEADER_SIZE)
        await conn.connect()
        self._router_for().broker_ok(url)
        self._conns[url] = conn
        return conn


def _fail_waiter(w: _Waiter, e: BaseException) -> None:
    if len(w) == 2:
        if not w[0].done():
            w[0].set_exception(e)
    else:
        w[0].fail(e)


def _largest_step(cum: list[int]) -> int:
    """The largest record size, from cumulative sizes."""
    return max(map(sub, cum, [0, *cum[:-1]]))


def _record_size(r: tuple) -> int:
    return (len(r[0]) + (len(r[1]) if r[1] else 0) + sum(len(k) + len(v) for k, v in r[2])
            + _RECORD_OVERHEAD)


def _now_ms() -> int:
    return int(time.time() * 1000)


__all__ = ["Producer", "Delivery", "AuditSink"]
