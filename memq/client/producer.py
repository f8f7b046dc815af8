"""The asyncio Producer: buffers LogMessages per topic, seals Messages, sends them to brokers.

Two halves: the `Accumulator` (no I/O: buffers, seals by size or `linger_ms`, assigns
sequences) and the `Sender` (connections, in-flight attempts, retries, acks). The Producer
between them validates input, bounds buffered and unacknowledged bytes by
`max_in_flight_bytes` (`send` waits for room up to `max_block_ms`, then raises
ProducerTimeoutError; for a topic no broker hosts yet it waits as long, then raises
UnknownTopicError; for one the brokers refuse to show its principal it raises AuthorizationError
at once), runs the linger timers, and resolves each caller's future from its
Message's outcome (and tells the audit sink). Each Message is acked or failed within
`delivery_timeout_ms` of its seal, retries included; `flush(timeout)` and `close(timeout)`
are bounded too.

Each Message carries the producer id (random u64), epoch and a per-topic sequence, so
consumers can drop retried duplicates by (producer id, epoch, sequence).

On a topic of several read partitions, keyed records are placed by key, as Kafka's default
partitioner places them (`placement`): one open Message per partition, each naming its
partition, which is where readers find them ("same key, same partition, in order", and
compaction per partition sees every record of a key). Records without a key name no partition:
the broker puts them in its batch's partition (one part per batch, large requests). A bulk call's
Deliveries then hold one per run of records placed alike (still in record order).

With a `transactional_id` the Producer writes in transactions (memq.client.transaction):
`begin()` (the first one also gets the producer id and epoch from the cluster, fencing any older
Producer of the id), sends, `send_offsets()` for a Consumer group, then `commit()` (flush, then
the commit: every Message of the transaction becomes visible to readers at once) or `abort()`
(none ever does). Sends outside a transaction raise TransactionError. Audit reports of a
transaction's Messages wait for its commit (an aborted Message was never produced). The bulk calls
(`send_many`, `send_batch`) do no per-record Python work beyond building tuples (with the
GC paused: they hold no cycles), and return one future for all their records.
"""

from __future__ import annotations

import asyncio
import random
import time
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import add, itemgetter, sub
from typing import Mapping, Protocol, Sequence

from memq.config import ProducerConfig
from memq.errors import (InvalidInputError, KeyRequiredError, MessageTooLargeError, ProducerClosedError,
                         ProducerTimeoutError, TransactionError)
from memq.format.codec import Codec
from memq.format.message import decode_message_header
from memq.format.records import LogMessage, check_records, gc_paused, timestamp_range
from memq.format.wire import MAX_TOPIC_BYTES, Ack, AckLevel

from .accumulator import RECORD_OVERHEAD, Accumulator, Lane, Sealed, now_ms, record_size
from .cluster import broker_urls
from .placement import key_partition, runs
from .sender import Connector, Router, Sender
from .transaction import Transaction

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

    def __init__(self, future: asyncio.Future[list[Delivery]]) -> None:
        self.future = future
        self.parts: list[Delivery | None] = []
        self.remaining = 0

    def add_part(self) -> int:
        self.parts.append(None)
        self.remaining += 1
        return len(self.parts) - 1

    def done_part(self, i: int, d: Delivery) -> None:
        self.parts[i] = d
        self.remaining -= 1
        if self.remaining == 0 and not self.future.done():
            self.future.set_result(self.parts)   # type: ignore[arg-type]  # every part is set now

    def fail(self, e: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(e)


@dataclass(slots=True)
class RecordWaiter:
    """One `send` call: its record is at `position` in the Message."""

    future: asyncio.Future[Delivery]
    position: int = 0

    def deliver(self, m: Sealed[Waiter], producer_id: int, epoch: int, ack: Ack) -> None:
        if not self.future.done():
            self.future.set_result(Delivery(m.topic, producer_id, epoch, m.sequence, 1, self.position,
                                            ack.bucket, ack.key, ack.index, ack.partition, ack.offset))

    def fail(self, e: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(e)


@dataclass(slots=True)
class RunWaiter:
    """A run of `count` records of a bulk call (part `part` of `many`), from `position` on."""

    many: _Many
    part: int
    count: int
    position: int = 0

    def deliver(self, m: Sealed[Waiter], producer_id: int, epoch: int, ack: Ack) -> None:
        self.many.done_part(self.part, Delivery(m.topic, producer_id, epoch, m.sequence, self.count, self.position,
                                                ack.bucket, ack.key, ack.index, ack.partition, ack.offset))

    def fail(self, e: BaseException) -> None:
        self.many.fail(e)


Waiter = RecordWaiter | RunWaiter


class Producer:
    """`send*` buffer records and return futures of their Deliveries; `flush` sends now and
    waits; `close` flushes and closes. `router` and `connector` replace how brokers are found
    and connected (tests; default: `/v1/metadata` and WebSockets from `config.brokers`).
    `transactional_id`: write in transactions (`begin`, `commit`, `abort`, `send_offsets`);
    the coordinator aborts one open longer than `transaction_timeout_ms`."""

    def __init__(self, config: ProducerConfig, *, producer_id: int | None = None, epoch: int = 0,
                 audit: AuditSink | None = None, router: Router | None = None,
                 connector: Connector | None = None, transactional_id: str | None = None,
                 transaction_timeout_ms: int = 60_000) -> None:
        if config.codec not in ("none", "zstd", "gzip", "arrow"):
            raise InvalidInputError(f"producer.codec {config.codec!r}: use none, zstd, gzip or arrow")
        self.config = config
        self.producer_id = random.getrandbits(64) if producer_id is None else producer_id
        self.epoch = epoch
        self._audit = audit
        self._seal_bytes = config.max_message_bytes - 1024   # room for header and msgpack framing
        if config.codec == "arrow":   # Arrow's offsets (4 B per field and header) and 8 B timestamp
            self._seal_bytes //= 2    # outgrow the estimate's 16 B of framing (~1.5x for empty values)
        self._acc: Accumulator[Waiter] = Accumulator(
            seal_bytes=self._seal_bytes, producer_id=self.producer_id,
            epoch=epoch, codec=Codec[config.codec.upper()], transactional_id=transactional_id or "")
        self._sender: Sender[Waiter] = Sender(config, self._done, router=router, connector=connector,
                                              transactional_id=transactional_id or "")
        self._txn = None if transactional_id is None else Transaction(
            transactional_id, timeout_ms=transaction_timeout_ms, brokers=broker_urls(config.brokers),
            open_conn=self._sender.open, timeout_s=config.request_timeout_ms / 1000,
            deadline_s=config.delivery_timeout_ms / 1000, backoff_s=config.retry_backoff_ms / 1000)
        self._txn_audit: list[Sealed[Waiter]] = []   # the open transaction's Messages, reported at commit
        self.metrics = self._sender.metrics   # throttle time reported by brokers (quotas)
        self._linger: dict[Lane, asyncio.TimerHandle] = {}
        self._buffered = 0
        self._room = asyncio.Event()
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
        ts = timestamp or now_ms()
        record = (bytes(value), key, tuple(headers) if headers else (), ts, None)
        size = record_size(record)
        self._check_size(size)
        if key is None:
            await self._check_keys(topic, 1)
        await self._admit(topic, size)
        fut: asyncio.Future[Delivery] = asyncio.get_running_loop().create_future()
        partitions = self._sender.partitions(topic)
        lane = (topic, key_partition(key, partitions) if partitions > 1 and key is not None else -1)
        self._add(lane, [record], size, ts, ts, RecordWaiter(fut))
        return fut

    async def delete(self, topic: str, key: bytes, headers: Sequence[tuple[str, bytes]] | None = None,
                     timestamp: int | None = None) -> asyncio.Future[Delivery]:
        """Queue a tombstone of `key` (its record with no value) on compacted `topic`: readers see
        the key deleted, and compaction drops it once `delete_retention_ms` passed, as Kafka does
        with a null value. Only on a compacted topic (InvalidInputError elsewhere: a plain topic's
        readers expect a value), and not in Arrow bodies, which hold no null value."""
        if not isinstance(key, bytes):
            raise InvalidInputError(f"delete: the key must be bytes, not {type(key).__name__}")
        if self.config.codec == "arrow":
            raise InvalidInputError("delete: producer.codec 'arrow' holds no null value; use zstd, gzip or none "
                                    "for a producer that deletes keys")
        await self._learn(topic)
        if not self._sender.keys_required(topic):
            raise InvalidInputError(f"delete: topic {topic} is not compacted (cleanup.policy): a tombstone deletes "
                                    "a key only where compaction keeps the latest record per key")
        if headers and not all(isinstance(k, str) and isinstance(v, bytes) for k, v in headers):
            raise InvalidInputError("headers must be (str, bytes) pairs")
        ts = timestamp or now_ms()
        record = (None, key, tuple(headers) if headers else (), ts, None)
        size = record_size((b"", *record[1:]))   # record_size, the hot path's, takes bytes values only
        self._check_size(size)
        await self._admit(topic, size)
        fut: asyncio.Future[Delivery] = asyncio.get_running_loop().create_future()
        partitions = self._sender.partitions(topic)
        self._add((topic, key_partition(key, partitions) if partitions > 1 else -1), [record], size, ts, ts,
                  RecordWaiter(fut))
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
        overhead = RECORD_OVERHEAD + sum(len(k) + len(v) for k, v in hdrs)
        ts = timestamp or now_ms()
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
        keyless = len(values) if keys is None else keys.count(None)
        if keyless:
            await self._check_keys(topic, keyless)
        return await self._enqueue(topic, records, cum, overhead, ts, keyless < len(values))

    async def send_batch(self, topic: str, records: Sequence[LogMessage]) -> asyncio.Future[list[Delivery]]:
        """Queue LogMessages; one future for all, resolving with the Deliveries in record order.
        LogMessages with timestamp_ms == 0 are stamped with the current time."""
        records = list(records)
        if not records:
            raise InvalidInputError("send_batch: no records")
        check_records(records)   # here, naming the bad input now rather than at seal time
        if 0 in map(_timestamp_of, records):
            now = now_ms()
            records = [r if r[3] else r._replace(timestamp_ms=now) for r in records]
        cum = list(accumulate(map(record_size, records)))
        self._check_size(_largest_step(cum))
        keyless = sum(1 for r in records if r[1] is None)
        if keyless:
            await self._check_keys(topic, keyless)
        return await self._enqueue(topic, list[tuple](records), cum, 0, None, keyless < len(records))

    async def _enqueue(self, topic: str, records: list[tuple], cum: list[int], per_record: int,
                       stamp: int | None, keyed: bool) -> asyncio.Future[list[Delivery]]:
        """Add 5-tuple records to the topic's Messages. The first j records are estimated at
        `cum[j - 1] + j * per_record` bytes (each record already checked against the Message
        size by the caller); `stamp` is their common timestamp, None if they differ; `keyed`:
        some record has a key (placed by it)."""
        many = _Many(asyncio.get_running_loop().create_future())

        def upto(j: int) -> int:   # estimated bytes of records[:j]
            return cum[j - 1] + j * per_record if j else 0

        await self._learn(topic)
        n = len(records)
        partitions = self._sender.partitions(topic)
        # a topic of several partitions: each run of records placed in one partition goes to that
        # partition's Messages (Deliveries stay in record order, one per run); records without a
        # key are one run of lane -1 (no per-record work)
        placed = runs([r[1] for r in records], partitions) if partitions > 1 and keyed else ((0, n, -1),)
        limit = self.config.max_in_flight_bytes
        for i, end, partition in placed:
            lane = (topic, partition)
            # cut the records into runs that fill the lane's open Message, then new ones
            while i < end:
                base = upto(i)
                room = self._acc.room(lane)
                # a short run (placed by key: 1.5 records on average over 3 partitions) fits whole
                j = end if upto(end) - base <= room else min(
                    bisect_left(range(n + 1), base + room, lo=i + 1, key=upto), end)
                run_bytes = upto(j) - base
                if self._txn is None and self._buffered + run_bytes <= limit:
                    self._buffered += run_bytes   # `_admit` without a wait: no coroutine per run
                else:
                    await self._admit(topic, run_bytes)   # may wait while the open Message sealed: room is re-read
                run = records[i:j]
                lo, hi = (stamp, stamp) if stamp is not None else timestamp_range(run)   # type: ignore[arg-type]
                self._add(lane, run, run_bytes, lo, hi, RunWaiter(many, many.add_part(), j - i))
                i = j
        return many.future

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait until every Message is acked or failed, at most
        `timeout` seconds (then ProducerTimeoutError; the Messages go on, each bounded by
        `delivery_timeout_ms`).

        As in Kafka, flush means "send now": besides sealing the buffered records, the last
        not-yet-sent Message of each topic per broker asks its broker to seal its batch at
        once (RequestFlag.SEAL) instead of waiting up to the topic's batch_ms. Messages sent
        before the flush cannot be flagged any more; a broker holding only those still waits
        batch_ms. The cost is a smaller stored object (one more PUT) per flush and broker.
        """
        for lane in self._acc.lanes():
            self._seal(lane)
        await self._sender.flush(timeout)

    async def close(self, timeout: float | None = None) -> None:
        """Flush (at most `timeout` seconds), then close connections; Messages still unacked
        then fail with ProducerClosedError. Later sends raise ProducerClosedError. A transaction
        left open is neither committed nor aborted here: the coordinator aborts it after its
        timeout, or the next Producer of the id at its first begin."""
        if self._closed:
            return
        try:
            await self.flush(timeout)
        except ProducerTimeoutError:
            pass   # bounded close: what is left fails below
        finally:
            self._closed = True
            if self._txn is not None:
                await self._txn.close()
            await self._sender.close()

    # --- transactions ------------------------------------------------------------------------

    def _transaction(self) -> Transaction:
        if self._txn is None:
            raise TransactionError("this Producer has no transactional_id")
        if self._closed:
            raise ProducerClosedError("producer is closed")
        return self._txn

    async def init_transactions(self) -> None:
        """Get the producer id and a new epoch for the transactional id: any older Producer of
        the id is fenced, and its open transaction aborted. `begin` calls it the first time."""
        txn = self._transaction()
        if self._buffered:
            raise TransactionError("init_transactions with records buffered or in flight")
        self.producer_id, self.epoch = await txn.init()
        self._acc.restamp(self.producer_id, self.epoch)

    async def begin(self) -> None:
        """Open a transaction: sends from now on belong to it until `commit` or `abort`."""
        txn = self._transaction()
        if txn.producer_id < 0:
            await self.init_transactions()
        txn.begin()
        self._txn_audit.clear()

    async def send_offsets(self, group: str, offsets: Mapping[str, Mapping[int, int]]) -> None:
        """Commit memq Consumer group `group`'s positions with the open transaction: per topic,
        {read partition: next offset} (a Consumer's `position()` after handling
        everything its polls returned). They become the group's committed offsets if, and when,
        the transaction commits."""
        await self._transaction().offsets(group, offsets)

    async def commit(self) -> None:
        """Send everything buffered, wait for every Message of the transaction, then commit it:
        readers see all its records, and offsets given to `send_offsets` are committed.
        TransactionError if a Message failed (abort then); ProducerFencedError if a newer
        Producer of the id took over."""
        txn = self._transaction()
        txn.ending(commit=True)
        await self.flush()
        await txn.end(commit=True)
        if self._audit is not None:
            for m in self._txn_audit:
                self._report(m)
        self._txn_audit.clear()

    async def abort(self) -> None:
        """Drop the open transaction: what is buffered or in flight is sent and waited for first
        (so nothing of it lands after the abort), then none of it is ever seen by readers."""
        txn = self._transaction()
        txn.ending(commit=False)
        try:
            await self.flush()
        finally:
            self._txn_audit.clear()
        await txn.end(commit=False)

    # --- buffering -------------------------------------------------------------------------

    async def _learn(self, topic: str) -> None:
        """Know `topic` (its brokers and settings) before buffering for it."""
        if self._closed:
            raise ProducerClosedError("producer is closed")
        if not topic or len(topic.encode()) > MAX_TOPIC_BYTES:
            raise InvalidInputError(f"topic {topic!r}: must be 1..{MAX_TOPIC_BYTES} bytes")
        if not self._acc.knows(topic):
            # a topic no broker hosts yet (being created, its broker starting) is waited for, as
            # Kafka's send() does, up to max_block_ms; then UnknownTopicError, not at ack time
            await self._sender.await_topic(topic, self.config.max_block_ms / 1000)
            self._acc.register(topic)

    async def _check_keys(self, topic: str, keyless: int) -> None:
        """KeyRequiredError, before anything is buffered, when `keyless` records without a key
        go to a compacted topic (the broker never decodes records: the producer checks)."""
        await self._learn(topic)
        if self._sender.keys_required(topic):
            raise KeyRequiredError(f"topic {topic} is compacted (cleanup.policy with compact): {keyless} "
                                   "record(s) without a key refused; give every record a key")

    async def _admit(self, topic: str, size: int) -> None:
        """Wait for room in the in-flight budget (bounded by max_block_ms)."""
        await self._learn(topic)
        if self._txn is not None:
            await self._txn.enter(topic)
        limit = self.config.max_in_flight_bytes
        if self._buffered + size > limit and self._buffered > 0:
            deadline = time.monotonic() + self.config.max_block_ms / 1000
            for lane in self._acc.lanes():   # what waits in buffers must move to make room
                self._seal(lane)
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

    def _add(self, lane: Lane, records: list[tuple], nbytes: int, lo: int, hi: int,
             waiter: Waiter) -> None:
        opened, full = self._acc.add(lane, records, nbytes, lo, hi, waiter)
        if full:
            self._seal(lane)
        elif opened:
            self._linger[lane] = asyncio.get_running_loop().call_later(self.config.linger_ms / 1000,
                                                                       self._seal, lane)

    def _seal(self, lane: Lane) -> None:
        timer = self._linger.pop(lane, None)
        if timer is not None:
            timer.cancel()
        sealed = self._acc.seal(lane)
        if sealed is None:
            return
        if sealed.error is not None:
            self._done(sealed, sealed.error, None)
        else:
            self._sender.send(sealed)

    def _done(self, m: Sealed[Waiter], error: BaseException | None, ack: Ack | None) -> None:
        """A Message's outcome: release its budget, tell the audit sink, resolve its waiters."""
        self._buffered -= m.nbytes
        self._room.set()
        if error is not None:
            if self._txn is not None:
                self._txn.failed(error)
            for w in m.waiters:
                w.fail(error)
            return
        assert ack is not None
        if self._txn is not None:
            self._txn_audit.append(m)
        elif self._audit is not None and self._sender.ack is not AckLevel.NONE:
            self._report(m)
        for w in m.waiters:
            w.deliver(m, self.producer_id, self.epoch, ack)


    def _report(self, m: Sealed[Waiter]) -> None:
        """Tell the audit sink that Message `m` was produced."""
        assert self._audit is not None
        self._audit.produced(topic=m.topic, producer_id=self.producer_id, epoch=self.epoch,
                             sequence=m.sequence, count=m.count,
                             digest=decode_message_header(memoryview(m.frame)[m.message_at:]).body_crc32c,
                             created_ms=m.created_ms)


def _largest_step(cum: list[int]) -> int:
    """The largest record size, from cumulative sizes."""
    return max(map(sub, cum, [0, *cum[:-1]]))


__all__ = ["Producer", "Delivery", "AuditSink", "RecordWaiter", "RunWaiter"]
