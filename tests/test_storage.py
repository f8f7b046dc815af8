"""Storage handlers against real servers: the dev cluster's moto S3 and a local directory.

Fault tests put `tests/faultproxy.py` (a real HTTP proxy) between the S3 handler and moto,
so retries are exercised by real 503 SlowDown answers, stalled responses and 4xx errors.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from tests.support.faultproxy import FaultPlan, FaultProxy
from prometheus_client import CollectorRegistry

from memq.config import MemqConfig, S3Config, StorageConfig
from memq.errors import (ConfigError, InvalidInputError, ObjectNotFoundError, RetryBudgetExhaustedError,
                         StorageError)
from memq.storage import (FileStorageHandler, ObjectLocation, S3StorageHandler, StorageHandler,
                          StorageMetrics, make_storage)
from memq.storage.naming import parse_key

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MiB = 1024 * 1024
BASE_MS = 1_700_000_000_000


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """Sum of the samples of `name` carrying `labels` (and any others, e.g. every topic)."""
    return sum(s.value for f in registry.collect() for s in f.samples
               if s.name == name and labels.items() <= s.labels.items())


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture(params=["s3", "file"])
async def storage(request: pytest.FixtureRequest, memq_config: MemqConfig, tmp_path: Path,
                  registry: CollectorRegistry, unique_name: Callable[[str], str]) -> AsyncIterator[StorageHandler]:
    config = dataclasses.replace(memq_config, storage=StorageConfig(kind=request.param, root_dir=str(tmp_path)),
                                 cluster=dataclasses.replace(memq_config.cluster, name=unique_name("c")))
    handler = make_storage(config, metrics=StorageMetrics(registry))
    yield handler
    await handler.close()


def mixed_payloads(rng: random.Random) -> list[bytes]:
    """1,000 objects from 1 B to 8 MiB, mostly small so the test stays fast (~23 MiB in all)."""
    sizes = [1, 8 * MiB, 8 * MiB - 1] + [rng.randint(100_000, MiB) for _ in range(7)]
    sizes += [rng.randint(1, 8192) for _ in range(1000 - len(sizes))]
    rng.shuffle(sizes)
    return [rng.randbytes(n) for n in sizes]


async def test_round_trip_list_range_delete_1000_objects(storage: StorageHandler,
                                                         registry: CollectorRegistry) -> None:
    rng = random.Random(7)
    payloads = mixed_payloads(rng)
    stamps = [BASE_MS + 10 * i for i in range(len(payloads))]
    rng.shuffle(stamps)
    slots = asyncio.Semaphore(16)

    async def put(i: int) -> ObjectLocation:
        data = payloads[i]
        body: bytes | list[bytes | memoryview] = data
        if i % 2:  # half as chunks (header + body slices), as the broker hands them over
            a = min(3, len(data))
            b = max(a, len(data) // 2)
            body = [data[:a], memoryview(data)[a:b], data[b:]]
        async with slots:
            return await storage.put_batch("orders", body, first_request_id=rng.getrandbits(64),
                                           timestamp_ms=stamps[i], broker_id="b-1")

    locs = await asyncio.gather(*(put(i) for i in range(len(payloads))))
    assert len(set(locs)) == len(locs)
    assert len({parse_key(loc.key).prefix for loc in locs}) > 200  # spread over the 256 prefixes

    async def get(i: int) -> bytes:
        async with slots:
            return await storage.get(locs[i])

    assert await asyncio.gather(*(get(i) for i in range(len(locs)))) == payloads

    listed = await storage.list_topic("orders", 0, 10**13)
    assert [i.location for i in listed] == [locs[i] for i in sorted(range(len(locs)), key=stamps.__getitem__)]
    assert [i.timestamp_ms for i in listed] == sorted(stamps)
    assert {i.location: i.size for i in listed} == {loc: len(p) for loc, p in zip(locs, payloads)}

    window = await storage.list_topic("orders", BASE_MS + 2_500, BASE_MS + 5_000)
    assert [i.timestamp_ms for i in window] == [t for t in sorted(stamps) if BASE_MS + 2_500 <= t < BASE_MS + 5_000]
    assert len(window) == 250
    assert await storage.list_topic("orders", BASE_MS + 20_000, BASE_MS + 30_000) == []
    assert await storage.list_topic("other-topic", 0, 10**13) == []

    big = max(range(len(payloads)), key=lambda i: len(payloads[i]))
    data = payloads[big]
    assert await storage.get_range(locs[big], 0, 64) == data[:64]
    assert await storage.get_range(locs[big], 3 * MiB + 5, MiB) == data[3 * MiB + 5:4 * MiB + 5]
    assert await storage.get_range(locs[big], len(data) - 10, 1000) == data[-10:]  # cut at the end
    tiny = [len(p) for p in payloads].index(1)
    assert await storage.get_range(locs[tiny], 0, 1) == payloads[tiny]

    gone = [locs[i] for i in range(0, 1000, 100)]
    await asyncio.gather(*(storage.delete(loc) for loc in gone))
    after = {i.location for i in await storage.list_topic("orders", 0, 10**13)}
    assert after == set(locs) - set(gone)
    for loc in gone[:3]:
        with pytest.raises(ObjectNotFoundError, match=loc.key):
            await storage.get(loc)

    backend = "s3" if isinstance(storage, S3StorageHandler) else "file"
    assert metric(registry, "memq_storage_attempts_total", backend=backend, op="put") == 1000
    # requests and bytes are counted per topic, from the keys (what `memq cost` prices)
    assert metric(registry, "memq_storage_attempts_total", backend=backend, op="put", topic="orders") == 1000
    assert metric(registry, "memq_storage_attempts_total", backend=backend, op="delete", topic="orders") == 10
    assert metric(registry, "memq_storage_attempts_total", backend=backend, op="list", topic="other-topic") == 256
    assert metric(registry, "memq_storage_bytes_total", backend=backend, op="put",
                  topic="orders") == sum(map(len, payloads))
    assert metric(registry, "memq_storage_bytes_total", backend=backend, op="put") == sum(map(len, payloads))
    assert metric(registry, "memq_storage_latency_seconds_count", backend=backend, op="get") == 1003
    assert metric(registry, "memq_storage_failures_total", backend=backend, op="get", reason="not_found") == 3


async def test_a_groups_objects_live_and_list_under_the_group(storage: StorageHandler,
                                                               registry: CollectorRegistry) -> None:
    """A storage group's object: its key names the group (not the topic), `list_group` finds it,
    `list_topic` does not, ranged GETs read a part, requests are labelled `group:<g>`."""
    body = b"part-one" + b"part-two"
    loc = await storage.put_batch("orders", [b"part-one", b"part-two"], first_request_id=9, timestamp_ms=5_000,
                                  broker_id="b1", group="payments")
    assert (parse_key(loc.key).group, parse_key(loc.key).topic) == ("payments", "")
    assert "/groups/payments/" in loc.key and "orders" not in loc.key
    assert [i.location for i in await storage.list_group("payments", 0, 10_000)] == [loc]
    assert await storage.list_group("payments", 5_001, 10_000) == []
    assert await storage.list_topic("orders", 0, 10_000) == [] and await storage.list_group("other", 0, 10_000) == []
    assert await storage.get_range(loc, 8, 8) == body[8:]
    backend = "s3" if isinstance(storage, S3StorageHandler) else "file"
    assert metric(registry, "memq_storage_attempts_total", backend=backend, op="put", topic="group:payments") == 1
    with pytest.raises(InvalidInputError, match="storage group"):
        await storage.list_group("a/b", 0, 1)


async def test_missing_objects_and_bad_arguments(storage: StorageHandler) -> None:
    loc = await storage.put_batch("t", b"abc", first_request_id=1, timestamp_ms=BASE_MS, broker_id="b1")
    missing = dataclasses.replace(loc, key=loc.key.replace("-a0", "-a1"))
    with pytest.raises(ObjectNotFoundError):
        await storage.get(missing)
    with pytest.raises(ObjectNotFoundError):
        await storage.get_range(missing, 0, 10)
    await storage.delete(missing)  # deleting what is not there is fine
    with pytest.raises(StorageError) as err:
        await storage.get_range(loc, 3, 10)  # starts past the end
    assert not isinstance(err.value, ObjectNotFoundError)
    with pytest.raises(InvalidInputError):
        await storage.get_range(loc, -1, 10)
    with pytest.raises(InvalidInputError):
        await storage.get_range(loc, 0, 0)
    with pytest.raises(InvalidInputError):
        await storage.put_batch("a/b", b"x", first_request_id=1, timestamp_ms=1, broker_id="b")
    with pytest.raises(InvalidInputError):
        await storage.list_topic("../etc", 0, 1)
    with pytest.raises(InvalidInputError):
        await storage.put_batch("t", "text", first_request_id=1, timestamp_ms=1, broker_id="b")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        await storage.put_batch("t", 42, first_request_id=1, timestamp_ms=1, broker_id="b")  # type: ignore[arg-type]
    assert await storage.list_topic("t", 10, 10) == []


async def test_file_handler_writes_atomically_under_the_key_layout(tmp_path: Path) -> None:
    handler = FileStorageHandler(tmp_path / "root", cluster="c")
    try:
        loc = await handler.put_batch("t", [b"ab", b"cd"], first_request_id=9, timestamp_ms=BASE_MS,
                                      broker_id="b")
        assert loc.bucket == ""
        path = tmp_path / "root" / loc.key
        assert path.read_bytes() == b"abcd"
        assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind
        (path.parent / f".{path.name}.x1.tmp").write_bytes(b"half-written")  # a crashed writer's leftovers
        assert [i.location for i in await handler.list_topic("t", 0, 10**13)] == [loc]
        with pytest.raises(InvalidInputError):
            await handler.get(ObjectLocation("", "../../outside"))
        with pytest.raises(InvalidInputError):
            await handler.get(ObjectLocation("bucket", loc.key))
    finally:
        await handler.close()


def test_make_storage_picks_the_handler_and_checks_settings(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="root_dir"):
        make_storage(MemqConfig(storage=StorageConfig(kind="file")))
    with pytest.raises(ConfigError, match="s3.max_attempts"):
        make_storage(MemqConfig(s3=S3Config(max_attempts=0)))
    with pytest.raises(ConfigError, match="s3.read_timeout_s"):
        make_storage(MemqConfig(s3=S3Config(read_timeout_s=0)))
    assert isinstance(make_storage(MemqConfig(storage=StorageConfig(kind="file", root_dir=str(tmp_path)))),
                      FileStorageHandler)
    assert isinstance(make_storage(MemqConfig()), S3StorageHandler)


async def test_two_handlers_share_one_registry(memq_config: MemqConfig, tmp_path: Path,
                                               registry: CollectorRegistry) -> None:
    metrics = StorageMetrics(registry)
    s3 = S3StorageHandler(memq_config.s3, cluster="c", metrics=metrics)
    local = FileStorageHandler(tmp_path, cluster="c", metrics=metrics)
    try:
        await s3.put_batch("t", b"x", first_request_id=1, timestamp_ms=1, broker_id="b")
        await local.put_batch("t", b"yy", first_request_id=1, timestamp_ms=1, broker_id="b")
    finally:
        await s3.close()
        await local.close()
    assert metric(registry, "memq_storage_bytes_total", backend="s3", op="put") == 1
    assert metric(registry, "memq_storage_bytes_total", backend="file", op="put") == 2


# --- faults: a real HTTP proxy between the handler and moto --------------------------------------


@pytest.fixture
def proxy(memq_config: MemqConfig) -> Iterator[FaultProxy]:
    assert memq_config.s3.endpoint_url
    with FaultProxy(memq_config.s3.endpoint_url) as p:
        yield p


def faulty_handler(memq_config: MemqConfig, proxy_url: str, registry: CollectorRegistry, cluster: str,
                   max_attempts: int = 4) -> S3StorageHandler:
    s3 = dataclasses.replace(memq_config.s3, endpoint_url=proxy_url, connect_timeout_s=1.0, read_timeout_s=0.5,
                             max_attempts=max_attempts, base_backoff_s=0.01, max_backoff_s=0.05)
    return S3StorageHandler(s3, cluster=cluster, metrics=StorageMetrics(registry), rng=random.Random(3))


def put_keys(proxy: FaultProxy) -> list[str]:
    return [path for method, path, _ in proxy.log if method == "PUT"]


async def test_retries_through_slowdown_with_a_new_key_per_attempt(
        memq_config: MemqConfig, proxy: FaultProxy, registry: CollectorRegistry,
        unique_name: Callable[[str], str]) -> None:
    handler = faulty_handler(memq_config, proxy.url, registry, unique_name("c"))
    try:
        proxy.set_plan(FaultPlan(mode="slowdown", first_n=2, methods=frozenset({"PUT"})))
        loc = await handler.put_batch("t", b"payload", first_request_id=5, timestamp_ms=BASE_MS, broker_id="b")
        assert parse_key(loc.key).attempt == 2
        keys = put_keys(proxy)
        assert [parse_key(k.split("/", 2)[2]).attempt for k in keys] == [0, 1, 2]
        assert len({parse_key(k.split("/", 2)[2]).unique for k in keys}) == 1  # one batch, three attempts
        assert await handler.get(loc) == b"payload"
        # The 503s never reached S3: only the successful attempt exists.
        assert [i.location for i in await handler.list_topic("t", 0, 10**13)] == [loc]
        assert metric(registry, "memq_storage_retries_total", backend="s3", op="put", reason="throttle") == 2
        assert metric(registry, "memq_storage_attempts_total", backend="s3", op="put") == 3
    finally:
        await handler.close()


async def test_retries_through_stalled_responses_and_dropped_connections(memq_config: MemqConfig, proxy: FaultProxy,
                                                  registry: CollectorRegistry,
                                                  unique_name: Callable[[str], str]) -> None:
    handler = faulty_handler(memq_config, proxy.url, registry, unique_name("c"))
    try:
        proxy.set_plan(FaultPlan(mode="stall", first_n=1, stall_s=3.0, methods=frozenset({"PUT"})))
        t0 = time.monotonic()
        loc = await handler.put_batch("t", b"late", first_request_id=5, timestamp_ms=BASE_MS, broker_id="b")
        assert 0.5 <= time.monotonic() - t0 < 2.5  # one read timeout (not the whole stall), then a retry
        assert parse_key(loc.key).attempt == 1
        # The stalled attempt did land in S3 under its own key: it cannot clobber the real one,
        # and a listing shows the batch once, as the attempt that succeeded.
        orphan = ObjectLocation(loc.bucket, loc.key.replace("-a1", "-a0"))
        assert await handler.get(orphan) == b"late"
        assert [i.location for i in await handler.list_topic("t", 0, 10**13)] == [loc]
        assert metric(registry, "memq_storage_retries_total", backend="s3", op="put", reason="timeout") == 1

        proxy.set_plan(FaultPlan(mode="stall", first_n=1, stall_s=1.5, methods=frozenset({"GET"}),
                                 path_contains=loc.key))
        assert await handler.get_range(loc, 1, 2) == b"at"
        assert len(proxy.faults()) == 1

        proxy.set_plan(FaultPlan(mode="reset", first_n=2, methods=frozenset({"GET"}), path_contains=loc.key))
        assert await handler.get(loc) == b"late"
        assert len(proxy.faults()) == 2
        assert metric(registry, "memq_storage_retries_total", backend="s3", op="get", reason="connection") == 2
    finally:
        await handler.close()


async def test_survives_a_fraction_of_faults_on_every_operation(
        memq_config: MemqConfig, proxy: FaultProxy, registry: CollectorRegistry,
        unique_name: Callable[[str], str]) -> None:
    handler = faulty_handler(memq_config, proxy.url, registry, unique_name("c"), max_attempts=10)
    try:
        proxy.set_plan(FaultPlan(mode="slowdown", fraction=0.25, seed=11))
        rng = random.Random(5)
        payloads = [rng.randbytes(rng.randint(1, 200_000)) for _ in range(40)]
        locs = await asyncio.gather(*(handler.put_batch("t", p, first_request_id=i, timestamp_ms=BASE_MS + i,
                                                        broker_id="b") for i, p in enumerate(payloads)))
        assert await asyncio.gather(*(handler.get(loc) for loc in locs)) == payloads
        listed = await handler.list_topic("t", 0, 10**13)  # 256 listings, a quarter of them answered 503
        assert [i.location for i in listed] == list(locs)
        assert len(proxy.faults()) > 50
        assert metric(registry, "memq_storage_retries_total", backend="s3", op="list", reason="throttle") > 20
    finally:
        await handler.close()


async def test_gives_up_after_the_retry_budget(memq_config: MemqConfig, proxy: FaultProxy,
                                               registry: CollectorRegistry,
                                               unique_name: Callable[[str], str]) -> None:
    handler = faulty_handler(memq_config, proxy.url, registry, unique_name("c"))
    try:
        proxy.set_plan(FaultPlan(mode="slowdown", fraction=1.0, methods=frozenset({"PUT"})))
        with pytest.raises(RetryBudgetExhaustedError) as err:
            await handler.put_batch("t", b"x", first_request_id=5, timestamp_ms=BASE_MS, broker_id="b")
        keys = put_keys(proxy)
        assert [parse_key(k.split("/", 2)[2]).attempt for k in keys] == [0, 1, 2, 3]
        message = str(err.value)
        assert keys[-1].split("/", 2)[2] in message and "SlowDown" in message and "4 attempts" in message
        assert metric(registry, "memq_storage_failures_total", backend="s3", op="put", reason="exhausted") == 1

        loc = ObjectLocation(handler.bucket, keys[0].split("/", 2)[2])
        proxy.set_plan(FaultPlan(mode="stall", fraction=1.0, stall_s=3.0, methods=frozenset({"GET"})))
        t0 = time.monotonic()
        with pytest.raises(RetryBudgetExhaustedError, match="timeout"):
            await handler.get(loc)
        assert time.monotonic() - t0 < 4.5  # 4 read timeouts of 0.5 s, not 4 stalls of 3 s
        assert len(proxy.faults()) == 4
    finally:
        await handler.close()


async def test_client_errors_are_not_retried(memq_config: MemqConfig, proxy: FaultProxy,
                                             registry: CollectorRegistry,
                                             unique_name: Callable[[str], str]) -> None:
    handler = faulty_handler(memq_config, proxy.url, registry, unique_name("c"))
    try:
        proxy.set_plan(FaultPlan(mode="error", status=403, code="AccessDenied", first_n=5,
                                 methods=frozenset({"PUT"})))
        with pytest.raises(StorageError, match="AccessDenied") as err:
            await handler.put_batch("t", b"x", first_request_id=5, timestamp_ms=BASE_MS, broker_id="b")
        assert not isinstance(err.value, RetryBudgetExhaustedError)
        keys = put_keys(proxy)
        assert len(keys) == 1 and f"s3://{handler.bucket}/{keys[0].split('/', 2)[2]}" in str(err.value)

        proxy.set_plan(FaultPlan())  # a real 404 from S3: NoSuchKey, asked once
        with pytest.raises(ObjectNotFoundError):
            await handler.get(ObjectLocation(handler.bucket, keys[0].split("/", 2)[2]))
        assert [m for m, _, _ in proxy.log] == ["GET"]

        proxy.set_plan(FaultPlan(mode="error", status=500, code="InternalError", first_n=1))
        loc = await handler.put_batch("t", b"y", first_request_id=5, timestamp_ms=BASE_MS, broker_id="b")
        assert parse_key(loc.key).attempt == 1  # 5xx is retried
    finally:
        await handler.close()
    missing_bucket = dataclasses.replace(memq_config.s3, bucket=unique_name("nobucket"))
    direct = S3StorageHandler(missing_bucket, cluster="c")
    try:
        with pytest.raises(StorageError, match="NoSuchBucket") as err:
            await direct.put_batch("t", b"x", first_request_id=1, timestamp_ms=1, broker_id="b")
        assert f"s3://{missing_bucket.bucket}/" in str(err.value)
    finally:
        await direct.close()


async def test_connection_refused_is_retried_then_reported(memq_config: MemqConfig,
                                                           registry: CollectorRegistry) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens once the socket closes
    handler = faulty_handler(memq_config, dead, registry, "c", max_attempts=3)
    try:
        with pytest.raises(RetryBudgetExhaustedError, match="connection"):
            await handler.get(ObjectLocation(handler.bucket, "00/c/topics/t/0000000000001-b-0-a0"))
        assert metric(registry, "memq_storage_attempts_total", backend="s3", op="get") == 3
    finally:
        await handler.close()


def test_handlers_serve_several_event_loops_and_leave_no_threads(memq_config: MemqConfig,
                                                                   tmp_path: Path) -> None:
    """Spark tasks and CLI commands call a handler from successive `asyncio.run`s."""
    for handler in (S3StorageHandler(memq_config.s3, cluster="loops"), FileStorageHandler(tmp_path, cluster="c")):
        loc = asyncio.run(handler.put_batch("t", b"abc", first_request_id=1, timestamp_ms=1, broker_id="b"))
        assert [i.location for i in asyncio.run(handler.list_topic("t", 0, 10))] == [loc]
        assert asyncio.run(handler.get(loc)) == b"abc"
        asyncio.run(handler.close())
    assert not [t for t in threading.enumerate() if t.name.startswith(("memq-s3", "memq-file"))]
