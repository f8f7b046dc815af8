"""S3 storage handler: boto3 in a bounded thread pool, with memq's own retries.

botocore's retries are off (total_max_attempts=1) so that memq decides what is retried,
how long it waits (full-jitter exponential backoff) and, for a PUT, that every attempt goes
under its own key: a slow earlier attempt that lands late can never overwrite the object a
notification points to. Why boto3 and not aiobotocore: see docs/DECISIONS.md.
"""

from __future__ import annotations

import asyncio
import base64
import random
import secrets
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import boto3
import botocore.config
import botocore.exceptions as bce
from crc32c import crc32c
from prometheus_client import CollectorRegistry

from memq.config import S3Config
from memq.errors import (ConfigError, InvalidInputError, ObjectNotFoundError, RetryBudgetExhaustedError,
                         StorageError)
from memq.storage.base import Chunks, DeleteFailure, ObjectInfo, ObjectLocation, delete_chunks
from memq.storage.metrics import StorageMetrics
from memq.storage.listing import list_all_prefixes
from memq.storage.naming import check_name, group_home, home_dir, make_key, parse_key, start_after, topic_home
from memq.storage.payload import check_range, join_chunks
from memq.storage.retry import RetryPolicy

T = TypeVar("T")

# Error codes S3 (and S3-compatible stores) use to ask a client to slow down.
_THROTTLE_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                             "TooManyRequestsException", "RequestThrottled", "ServiceUnavailable"})
_TRANSIENT_CODES = frozenset({"RequestTimeout", "InternalError", "OperationAborted"})
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_RETRIABLE = frozenset({"throttle", "server_error", "timeout", "connection", "checksum"})


def classify(exc: BaseException) -> tuple[str, str] | None:
    """(reason, code) of a botocore failure, or None if it is not one (a bug: let it raise).

    reason is one of throttle, server_error, timeout, connection, checksum (all retried),
    not_found, client_error (never retried).
    """
    if isinstance(exc, bce.ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in _NOT_FOUND_CODES:
            return "not_found", code
        if code in _THROTTLE_CODES or status in (429, 503):
            return "throttle", code or str(status)
        if status >= 500 or code in _TRANSIENT_CODES:
            return "server_error", code or str(status)
        return "client_error", code or str(status)
    if isinstance(exc, (bce.ReadTimeoutError, bce.ConnectTimeoutError)):
        return "timeout", type(exc).__name__
    if isinstance(exc, (bce.HTTPClientError, bce.ConnectionError, bce.IncompleteReadError)):
        return "connection", type(exc).__name__
    if isinstance(exc, bce.FlexibleChecksumError):
        return "checksum", type(exc).__name__
    if isinstance(exc, bce.BotoCoreError):
        return "client_error", type(exc).__name__
    return None


def s3_session(s3: S3Config) -> boto3.session.Session:
    """The boto3 session of every S3 client memq creates: keys (and session token) from the
    config, else its named profile (which may assume a role), else the AWS default chain."""
    try:
        return boto3.session.Session(aws_access_key_id=s3.access_key_id, aws_secret_access_key=s3.secret_access_key,
                                     aws_session_token=s3.session_token, profile_name=s3.profile,
                                     region_name=s3.region)
    except bce.ProfileNotFound:
        raise ConfigError(f"s3.profile = {s3.profile!r}: no such profile in the AWS config files") from None


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
        self._client = s3_session(s3).client("s3", endpoint_url=s3.endpoint_url, config=botocore.config.Config(
            connect_timeout=s3.connect_timeout_s, read_timeout=s3.read_timeout_s,
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=s3.max_pool_connections))
        self._pool = ThreadPoolExecutor(max_workers=s3.max_pool_connections, thread_name_prefix="memq-s3")
        # Listing fans out over 256 prefixes; leave half the pool to puts and gets meanwhile.
        self._list_concurrency = max(1, s3.max_pool_connections // 2)

    # --- the retry loop ------------------------------------------------------------------------

    async def _run(self, op: str, attempt_call: Callable[[int], tuple[str, Callable[[], T]]]) -> T:
        """Run `attempt_call(n)`'s blocking function for n = 0, 1, ... until it succeeds or fails for good.

        `attempt_call` returns (the s3:// URL this attempt touches, the function), so a PUT
        can use a fresh key per attempt and errors can name the object.
        """
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        attempt = 0
        try:
            while True:
                where, fn = attempt_call(attempt)
                self._metrics.sent(self.backend, op, where)
                try:
                    return await loop.run_in_executor(self._pool, fn)
                except Exception as exc:
                    kind = classify(exc)
                    if kind is None:
                        raise
                    reason, code = kind
                    if reason not in _RETRIABLE:
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
                            f"{self._policy.budget_s:g}); last error {reason} ({code}): {exc}") from exc
                    self._metrics.retries.labels(self.backend, op, reason).inc()
                    await asyncio.sleep(delay)
        finally:
            self._metrics.latency.labels(self.backend, op).observe(time.perf_counter() - started)

    @staticmethod
    def _final_error(op: str, where: str, reason: str, code: str, exc: BaseException) -> StorageError:
        if reason == "not_found":
            return ObjectNotFoundError(f"{op} {where}: object does not exist ({code})")
        return StorageError(f"{op} {where}: {code}: {exc}")

    # --- StorageHandler ------------------------------------------------------------------------

    async def put_batch(self, topic: str, data: Chunks, *, first_request_id: int,
                        timestamp_ms: int, broker_id: str, group: str = "") -> ObjectLocation:
        body = join_chunks(data)
        # memq supplies the body's CRC32C (hardware CRC, ~1 ms per 8 MiB) for S3 to verify on
        # arrival. botocore then skips its own CRC32 of the body (pure-Python-driven chunking,
        # ~10% of the broker's CPU at 64 KiB values), and the checksum matches memq's own
        # object CRC32C, so S3 and consumers check the same thing.
        checksum = base64.b64encode(crc32c(body).to_bytes(4, "big")).decode()
        unique = secrets.token_hex(8)

        def attempt_call(attempt: int) -> tuple[str, Callable[[], str]]:
            key = str(make_key(cluster=self.cluster, topic=topic, first_request_id=first_request_id,
                               timestamp_ms=timestamp_ms, broker_id=broker_id, unique=unique,
                               attempt=attempt, group=group))
            return f"s3://{self.bucket}/{key}", lambda: self._put_blocking(key, body, checksum)

        key = await self._run("put", attempt_call)
        self._metrics.moved(self.backend, "put", key, len(body))
        return ObjectLocation(self.bucket, key)

    def _put_blocking(self, key: str, body: bytes, crc32c_b64: str) -> str:
        self._client.put_object(Bucket=self.bucket, Key=key, Body=body, ChecksumCRC32C=crc32c_b64)
        return key

    async def get(self, loc: ObjectLocation) -> bytes:
        data = await self._run("get", lambda _: (str(loc), lambda: self._get_blocking(loc, None)))
        self._metrics.moved(self.backend, "get", loc.key, len(data))
        return data

    async def get_range(self, loc: ObjectLocation, start: int, length: int) -> bytes:
        check_range(start, length)
        rng = f"bytes={start}-{start + length - 1}"
        data = await self._run("get_range", lambda _: (str(loc), lambda: self._get_blocking(loc, rng)))
        self._metrics.moved(self.backend, "get_range", loc.key, len(data))
        return data

    def _get_blocking(self, loc: ObjectLocation, byte_range: str | None) -> bytes:
        kwargs: dict[str, Any] = {"Bucket": loc.bucket, "Key": loc.key}
        if byte_range:
            kwargs["Range"] = byte_range
        resp = self._client.get_object(**kwargs)
        with resp["Body"] as body:
            return body.read()

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
        """One prefix's objects, a ListObjectsV2 request per page (each retried on its own and
        counted in `memq_storage_attempts{op="list"}`, so the count is the LIST requests paid)."""
        out: list[ObjectInfo] = []
        where = f"s3://{self.bucket}/{directory}"
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": directory,
                                  "StartAfter": start_after(directory, start_ms)}
        while True:
            resp = await self._run("list", lambda _: (where, lambda: self._client.list_objects_v2(**kwargs)))
            for item in resp.get("Contents", ()):
                try:
                    ts = parse_key(item["Key"]).timestamp_ms
                except InvalidInputError:
                    continue  # not a memq batch (a stray upload); never ours to return
                if ts >= end_ms:
                    return out  # keys sort by time inside a prefix: nothing later can match
                if ts < start_ms:
                    continue  # StartAfter cannot express a start beyond 13 digits
                out.append(ObjectInfo(ObjectLocation(self.bucket, item["Key"]), int(item["Size"]), ts))
            if not resp.get("IsTruncated"):
                return out
            kwargs = {**kwargs, "ContinuationToken": resp["NextContinuationToken"]}

    async def delete(self, loc: ObjectLocation) -> None:
        await self._run("delete", lambda _: (
            str(loc), lambda: self._client.delete_object(Bucket=loc.bucket, Key=loc.key)))

    async def delete_many(self, locs: Sequence[ObjectLocation]) -> list[DeleteFailure]:
        """DeleteObjects, `DELETE_CHUNK` keys a request (op "delete_many"), one request at a time:
        deleting is background work and must leave the connection pool to the brokers' puts."""
        other = [str(loc) for loc in locs if loc.bucket != self.bucket]
        if other:
            raise InvalidInputError(f"delete_many: {other[0]} is not in bucket {self.bucket!r}")
        failures: list[DeleteFailure] = []
        for chunk in delete_chunks(locs):
            where = f"s3://{self.bucket} ({len(chunk)} keys from {chunk[0].key})"
            body = {"Objects": [{"Key": loc.key} for loc in chunk], "Quiet": True}
            resp = await self._run("delete_many", lambda _: (
                where, lambda: self._client.delete_objects(Bucket=self.bucket, Delete=body)))
            for err in resp.get("Errors", ()):
                failures.append(DeleteFailure(ObjectLocation(self.bucket, str(err.get("Key", ""))),
                                              f"{err.get('Code', '?')}: {err.get('Message', '')}"))
        return failures

    async def close(self) -> None:
        await asyncio.to_thread(self._pool.shutdown, True)
        self._client.close()
