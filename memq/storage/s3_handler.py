"""S3 storage handler: obstore (Rust `object_store`) awaited on the event loop, with memq's own retries.

obstore's retries are off so that memq decides what is retried, how long it waits
(full-jitter exponential backoff) and, for a PUT, that every attempt goes under its own key:
a slow earlier attempt that lands late can never overwrite the object a notification points
to. Why obstore and not boto3 (`bench s3client`), and where boto3 remains (credentials from
the AWS config files, `memq.storage.s3_store`): see docs/DECISIONS.md.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import obstore
from obstore.store import S3Store
from prometheus_client import CollectorRegistry

from memq.config import S3Config
from memq.errors import (ConfigError, InvalidInputError, ObjectNotFoundError, RetryBudgetExhaustedError,
                         StorageError)
from memq.storage.hedge import Hedger, first_of, size_class
from memq.storage.base import Chunks, DeleteFailure, ObjectInfo, ObjectLocation, delete_chunks
from memq.storage.listing import list_all_prefixes
from memq.storage.metrics import StorageMetrics
from memq.storage.naming import (check_name, group_home, home_dir, make_key, parse_key, prefix_for, start_after,
                                 topic_home)
from memq.storage.payload import body_chunks, check_range
from memq.storage.retry import RetryPolicy
from memq.storage.s3_errors import RETRIABLE, classify
from memq.storage.s3_store import make_store
from memq.storage.throttle import PrefixThrottle

T = TypeVar("T")
LIST_PAGE = 1000
"""Keys per ListObjectsV2 answer (S3's default page): a listing costs one request per page."""

Attempt = Callable[[int], tuple[str, Callable[[], Awaitable[T]]]]


class S3StorageHandler:
    """`StorageHandler` on S3 (AWS, MinIO, moto). Safe to share across tasks and event loops."""

    backend = "s3"

    def __init__(self, s3: S3Config, *, cluster: str, metrics: StorageMetrics | None = None,
                 rng: random.Random | None = None, retry_budget_s: float | None = None) -> None:
        if s3.max_pool_connections < 1:
            raise ConfigError(f"s3.max_pool_connections {s3.max_pool_connections} must be >= 1")
        if not s3.bucket:
            raise ConfigError("s3.bucket is empty")
        if s3.connect_timeout_s <= 0 or s3.read_timeout_s <= 0:
            raise ConfigError(f"s3.connect_timeout_s {s3.connect_timeout_s} / s3.read_timeout_s "
                              f"{s3.read_timeout_s} must be > 0")
        check_name("cluster.name", cluster)
        self.bucket = s3.bucket
        self.cluster = cluster
        self._policy = RetryPolicy(s3.max_attempts, s3.base_backoff_s, s3.max_backoff_s,
                                   s3.retry_budget_s if retry_budget_s is None else retry_budget_s)
        self._metrics = metrics or StorageMetrics(CollectorRegistry())
        self._rng = rng or random.Random()
        self._s3 = s3
        self._hedger = Hedger(s3.hedge_percentile, s3.hedge_max_share, s3.hedge_min_delay_s)
        self._throttle = PrefixThrottle(s3.max_pool_connections, s3.base_backoff_s, s3.max_backoff_s, rng=self._rng)
        # One store per bucket: a store is bound to its bucket, and a notification may name another.
        self._stores = {s3.bucket: make_store(s3, request_timeout_s=self._policy.budget_s)}
        # Listing fans out over 256 prefixes; leave half the connections to puts and gets meanwhile.
        self._list_concurrency = max(1, s3.max_pool_connections // 2)

    # --- the retry loop ------------------------------------------------------------------------

    async def _run(self, op: str, attempt_call: Attempt[T], *, prefix: str, kind: str = "",
                   settle: bool = False) -> T:
        """Await `attempt_call(n)`'s request for n = 0, 1, ... until it succeeds or fails for good.

        `attempt_call` returns (the s3:// URL this attempt touches, the request), so a PUT
        can use a fresh key per attempt and errors can name the object. A request of a `kind`
        (PUTs and GETs: op and size class) is hedged: a slow attempt gets a second, the next n
        (`settle`: a PUT's hedge is awaited, see `first_of`). Every attempt waits for admission on
        its key `prefix` (`PrefixThrottle`: fewer requests to a prefix that answered SlowDown).
        """
        started = time.perf_counter()
        attempt = 0
        try:
            while True:
                where, request = attempt_call(attempt)
                self._metrics.sent(self.backend, op, where)

                def hedge() -> Awaitable[T] | None:
                    nonlocal attempt, where
                    if self._throttle.throttled(prefix) or not self._hedger.admit():
                        return None
                    attempt += 1
                    where, second = attempt_call(attempt)
                    self._metrics.sent(self.backend, op, where)
                    self._metrics.hedges.labels(self.backend, op, "sent").inc()
                    return self._admitted(prefix, kind, second)

                try:
                    if not kind:
                        return await self._admitted(prefix, kind, request)
                    value, winner = await first_of(self._admitted(prefix, kind, request), self._hedger.delay(kind),
                                                   hedge, settle=settle)
                    if winner:
                        self._metrics.hedges.labels(self.backend, op, "won").inc()
                    return value
                except Exception as exc:
                    failure = classify(exc)
                    if failure is None:
                        raise
                    reason, code = failure
                    if reason not in RETRIABLE:
                        self._metrics.failures.labels(self.backend, op, reason).inc()
                        raise self._final_error(op, where, reason, code, exc) from exc
                    attempt += 1
                    elapsed = time.perf_counter() - started
                    delay = self._policy.next_delay(attempt, elapsed, self._rng)
                    if delay is None:
                        self._metrics.failures.labels(self.backend, op, "exhausted").inc()
                        raise RetryBudgetExhaustedError(
                            f"{op} {where}: gave up after {attempt} attempts in {elapsed:.1f} s "
                            f"(s3.max_attempts {self._policy.max_attempts}, s3.retry_budget_s "
                            f"{self._policy.budget_s:g}); last error {reason} ({code}): {_first_line(exc)}") from exc
                    self._metrics.retries.labels(self.backend, op, reason).inc()
                    await asyncio.sleep(delay)
        finally:
            self._metrics.latency.labels(self.backend, op).observe(time.perf_counter() - started)

    def _admitted(self, prefix: str, kind: str, request: Callable[[], Awaitable[T]]) -> Awaitable[T]:
        """`request()` once the prefix admits it; timed for hedging (from admission) if it has a kind."""
        timed: Callable[[], Awaitable[T]] = (lambda: self._hedger.timed(kind, request)) if kind else request
        return self._throttle.run(prefix, timed, _is_throttle)

    @staticmethod
    def _final_error(op: str, where: str, reason: str, code: str, exc: BaseException) -> StorageError:
        if reason == "not_found":
            return ObjectNotFoundError(f"{op} {where}: object does not exist ({code})")
        return StorageError(f"{op} {where}: {code}: {_first_line(exc)}")

    # --- StorageHandler ------------------------------------------------------------------------

    def pressure(self) -> float:
        return self._throttle.pressure()

    async def put_batch(self, topic: str, data: Chunks, *, first_request_id: int,
                        timestamp_ms: int, broker_id: str, group: str = "") -> ObjectLocation:
        body, size = body_chunks(data)
        unique = secrets.token_hex(8)

        def attempt_call(attempt: int) -> tuple[str, Callable[[], Awaitable[str]]]:
            key = str(make_key(cluster=self.cluster, topic=topic, first_request_id=first_request_id,
                               timestamp_ms=timestamp_ms, broker_id=broker_id, unique=unique,
                               attempt=attempt, group=group))
            return f"s3://{self.bucket}/{key}", lambda: self._put(key, body)

        key = await self._run("put", attempt_call, prefix=prefix_for(first_request_id), kind=f"put:{size_class(size)}", settle=True)
        self._metrics.moved(self.backend, "put", key, size)
        return ObjectLocation(self.bucket, key)

    async def _put(self, key: str, body: bytes | list[bytes | bytearray | memoryview]) -> str:
        # One PUT per object: obstore would split a body over 5 MB into a multipart upload.
        await obstore.put_async(self._stores[self.bucket], key, body, use_multipart=False)
        return key

    async def get(self, loc: ObjectLocation) -> bytes:
        data = await self._run("get", lambda _: (str(loc), lambda: self._get(loc)), prefix=_prefix_of(loc.key),
                               kind="get")
        self._metrics.moved(self.backend, "get", loc.key, len(data))
        return data

    async def _get(self, loc: ObjectLocation) -> bytes:
        return bytes(await (await obstore.get_async(self._store(loc.bucket), loc.key)).bytes_async())

    async def get_range(self, loc: ObjectLocation, start: int, length: int) -> bytes:
        check_range(start, length)
        data = await self._run("get_range", lambda _: (str(loc), lambda: self._get_range(loc, start, length)),
                               prefix=_prefix_of(loc.key), kind=f"get:{size_class(length)}")
        self._metrics.moved(self.backend, "get_range", loc.key, len(data))
        return data

    async def _get_range(self, loc: ObjectLocation, start: int, length: int) -> bytes:
        return bytes(await obstore.get_range_async(self._store(loc.bucket), loc.key, start=start, length=length))

    def _store(self, bucket: str) -> S3Store:
        store = self._stores.get(bucket)
        if store is None:
            if not bucket:
                raise InvalidInputError("an S3 object needs a bucket (this location has none)")
            store = self._stores[bucket] = make_store(self._s3, bucket=bucket,
                                                      request_timeout_s=self._policy.budget_s)
        return store

    async def list_topic(self, topic: str, start_ms: int, end_ms: int, *,
                         all_attempts: bool = False) -> list[ObjectInfo]:
        return await self._list_home(topic_home(topic), start_ms, end_ms, all_attempts)

    async def list_group(self, group: str, start_ms: int, end_ms: int, *,
                         all_attempts: bool = False) -> list[ObjectInfo]:
        return await self._list_home(group_home(group), start_ms, end_ms, all_attempts)

    async def _list_home(self, home: str, start_ms: int, end_ms: int, all_attempts: bool) -> list[ObjectInfo]:
        if end_ms <= start_ms:
            return []
        return await list_all_prefixes(lambda prefix: self._list_prefix(home_dir(prefix, self.cluster, home),
                                                                        start_ms, end_ms),
                                       self._list_concurrency, all_attempts=all_attempts)

    async def _list_prefix(self, directory: str, start_ms: int, end_ms: int) -> list[ObjectInfo]:
        """One prefix's objects. A failed listing is retried from the last key it returned, and
        each page (ListObjectsV2 request) counts in `memq_storage_attempts{op="list"}`."""
        out: list[ObjectInfo] = []
        where = f"s3://{self.bucket}/{directory}"
        after = [start_after(directory, start_ms)]
        done = [False]

        async def pages() -> None:
            stream = obstore.list(self._stores[self.bucket], directory, offset=after[0], chunk_size=LIST_PAGE)
            first = True
            async for page in stream:
                if not first:
                    self._metrics.sent(self.backend, "list", where)
                first = False
                for item in page:
                    key = str(item["path"])
                    after[0] = key
                    try:
                        ts = parse_key(key).timestamp_ms
                    except InvalidInputError:
                        continue  # not a memq batch (a stray upload); never ours to return
                    if ts >= end_ms:
                        done[0] = True  # keys sort by time inside a prefix: nothing later can match
                        return
                    if ts < start_ms:
                        continue  # StartAfter cannot express a start beyond 13 digits
                    out.append(ObjectInfo(ObjectLocation(self.bucket, key), int(item["size"]), ts))

        await self._run("list", lambda _: (where, pages), prefix=_prefix_of(directory))
        return out

    async def delete(self, loc: ObjectLocation) -> None:
        await self._run("delete", lambda _: (str(loc), lambda: obstore.delete_async(self._store(loc.bucket), loc.key)),
                        prefix=_prefix_of(loc.key))

    async def delete_many(self, locs: Sequence[ObjectLocation]) -> list[DeleteFailure]:
        """DeleteObjects, `DELETE_CHUNK` keys a request (op "delete_many"), one request at a time:
        deleting is background work and must leave the connections to the brokers' puts.

        obstore reports only the first key a DeleteObjects answer refused, so a chunk with a refused
        key is deleted again key by key (op "delete"), to name every key that failed and why."""
        other = [str(loc) for loc in locs if loc.bucket != self.bucket]
        if other:
            raise InvalidInputError(f"delete_many: {other[0]} is not in bucket {self.bucket!r}")
        failures: list[DeleteFailure] = []
        for chunk in delete_chunks(locs):
            where = f"s3://{self.bucket} ({len(chunk)} keys from {chunk[0].key})"
            keys = [loc.key for loc in chunk]
            try:
                await self._run("delete_many", lambda _: (where, lambda: self._delete_keys(keys)), prefix="")
            except StorageError as e:
                if isinstance(e, RetryBudgetExhaustedError) or not _refused_keys(e):
                    raise
                failures += await self._delete_each(chunk)
        return failures

    async def _delete_keys(self, keys: list[str]) -> None:
        await obstore.delete_async(self._stores[self.bucket], keys)

    async def _delete_each(self, chunk: Sequence[ObjectLocation]) -> list[DeleteFailure]:
        failures = []
        for loc in chunk:
            try:
                await self.delete(loc)
            except StorageError as e:
                failures.append(DeleteFailure(loc, str(e)))
        return failures

    async def close(self) -> None:
        """Nothing to release: obstore's connections close with the store."""


def _refused_keys(e: StorageError) -> bool:
    """Whether a failed DeleteObjects answered 200 and refused some keys (no HTTP status in the
    cause), rather than failing as a whole (a status: raise, as `delete` would)."""
    cause = e.__cause__
    return cause is not None and "non-2xx status code" not in str(cause)


def _prefix_of(key: str) -> str:
    """The S3 partition a key falls in: memq's first key component (`naming.PREFIXES`)."""
    return key.split("/", 1)[0]


def _is_throttle(exc: BaseException) -> bool:
    failure = classify(exc)
    return failure is not None and failure[0] == "throttle"


def _first_line(exc: BaseException) -> str:
    """obstore's message up to its debug dump (the S3 error body is on the first line)."""
    return str(exc).split("\n\nDebug source:", 1)[0]
