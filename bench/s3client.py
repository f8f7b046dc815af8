"""S3 client cost: boto3 (as memq's handler used it) against obstore, on one moto server, in one run.

For PUT and GET at 1 KiB, 64 KiB and 8 MiB, each client sends the same requests with the same
concurrency to the same S3 server (moto, in its own process, started here):
- boto3: one client, its calls in a thread pool of `CONCURRENCY` workers (the old handler's
  shape), each PUT carrying the body's CRC32C as the handler's did;
- obstore: one `S3Store` made as the handler makes it (`memq.storage.s3_store.make_store`:
  retries off, payload unsigned over HTTPS and on loopback), `CONCURRENCY` coroutines awaiting
  its async calls (no thread hop), one PUT per object (`use_multipart=False`: obstore's default
  splits a body over 5 MB into a multipart upload, 4 requests for an 8 MiB batch);
  `obstore_signed` signs each payload's SHA-256, as the handler does over plain HTTP across a
  network (raw figures only).
Per case: client CPU per request (`process_time` of this process, all threads: the boto3 pool
and obstore's Rust runtime alike; moto runs elsewhere) and MB/s. The machine is shared, so the
cases alternate clients over `ROUNDS` rounds and each client's best round counts.

Ratios (higher is better, as every bench): `cpu_<op>_<size>_vs_boto3` = boto3's CPU per request
over obstore's (as the handler); `mb_s_<op>_<size>_vs_boto3` = obstore's MB/s over boto3's.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import boto3
import botocore.config
import obstore
from crc32c import crc32c
from obstore.store import S3Store

from memq.config import S3Config
from memq.devcluster import DevCluster
from memq.storage.s3_store import make_store

KiB = 1024
MiB = 1024 * KiB
CONCURRENCY = 8
ROUNDS = 3
BUCKET = "bench-s3client"
# size label -> (bytes, requests per round in the full run, in the quick run)
SIZES = {"small": (KiB, 600, 200), "medium": (64 * KiB, 300, 100), "large": (8 * MiB, 24, 8)}


@dataclass(frozen=True)
class Figure:
    cpu_ms_per_request: float
    mb_s: float


async def _timed(requests: int, size: int, one: Callable[[int], Awaitable[object]]) -> Figure:
    """`requests` calls of `one(i)`, `CONCURRENCY` at a time; CPU and wall clock around all of them."""
    sem = asyncio.Semaphore(CONCURRENCY)

    async def slot(i: int) -> None:
        async with sem:
            await one(i)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(slot(i) for i in range(requests)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return Figure(1000 * cpu / requests, requests * size / wall / 1e6)


class Boto3Side:
    def __init__(self, endpoint: str) -> None:
        self.client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                   aws_access_key_id="testing", aws_secret_access_key="testing",
                                   config=botocore.config.Config(retries={"total_max_attempts": 1, "mode": "standard"},
                                                                 max_pool_connections=CONCURRENCY))
        self.pool = ThreadPoolExecutor(CONCURRENCY)

    async def put(self, key: str, body: bytes) -> None:
        checksum = base64.b64encode(crc32c(body).to_bytes(4, "big")).decode()
        await asyncio.get_running_loop().run_in_executor(self.pool, lambda: self.client.put_object(
            Bucket=BUCKET, Key=key, Body=body, ChecksumCRC32C=checksum))

    async def get(self, key: str) -> bytes:
        def blocking() -> bytes:
            with self.client.get_object(Bucket=BUCKET, Key=key)["Body"] as body:
                return body.read()
        return await asyncio.get_running_loop().run_in_executor(self.pool, blocking)

    def close(self) -> None:
        self.pool.shutdown()
        self.client.close()


class ObstoreSide:
    def __init__(self, endpoint: str, *, signed: bool) -> None:
        self.store = make_store(S3Config(endpoint_url=endpoint, bucket=BUCKET, access_key_id="testing",
                                         secret_access_key="testing"), request_timeout_s=60.0)
        if signed:
            self.store = S3Store(BUCKET, endpoint=endpoint, region="us-east-1", access_key_id="testing",
                                 secret_access_key="testing", virtual_hosted_style_request=False,
                                 unsigned_payload=False, client_options={"allow_http": True},
                                 retry_config={"max_retries": 0})

    async def put(self, key: str, body: bytes) -> None:
        await obstore.put_async(self.store, key, body, use_multipart=False)

    async def get(self, key: str) -> bytes:
        return bytes(await (await obstore.get_async(self.store, key)).bytes_async())

    def close(self) -> None:
        pass


async def _put_nth(side: Boto3Side | ObstoreSide, prefix: str, body: bytes, i: int) -> None:
    await side.put(f"{prefix}/{i}", body)


async def _get_nth(side: Boto3Side | ObstoreSide, prefix: str, i: int) -> None:
    await side.get(f"{prefix}/{i}")


async def _compare(endpoint: str, quick: bool) -> dict[str, dict[str, Figure]]:
    """{case: {client: best figure}} over ROUNDS rounds, the clients alternating inside each case."""
    sides: dict[str, Boto3Side | ObstoreSide] = {"boto3": Boto3Side(endpoint), "obstore": ObstoreSide(endpoint, signed=False),
             "obstore_signed": ObstoreSide(endpoint, signed=True)}
    best: dict[str, dict[str, Figure]] = {}
    try:
        for label, (size, full_n, quick_n) in SIZES.items():
            n = quick_n if quick else full_n
            body = os.urandom(size)
            for rnd in range(ROUNDS):
                order = list(sides.items()) if rnd % 2 == 0 else list(sides.items())[::-1]
                for name, side in order:
                    prefix = f"{name}/{label}/{rnd}"
                    put = await _timed(n, size, partial(_put_nth, side, prefix, body))
                    get = await _timed(n, size, partial(_get_nth, side, prefix))
                    for op, fig in (("put", put), ("get", get)):
                        case = best.setdefault(f"{op}_{label}", {})
                        old = case.get(name)
                        case[name] = fig if old is None else Figure(min(old.cpu_ms_per_request, fig.cpu_ms_per_request),
                                                                    max(old.mb_s, fig.mb_s))
            for op in ("put", "get"):
                figs = best[f"{op}_{label}"]
                print(f"{op:3} {label:6} " + " | ".join(f"{name} {fig.cpu_ms_per_request:7.3f} ms CPU/req "
                                                         f"{fig.mb_s:7.1f} MB/s" for name, fig in figs.items()),
                      flush=True)
    finally:
        for side in sides.values():
            side.close()
    return best


def run(quick: bool) -> dict:
    with DevCluster(s3=True, kafka=False, zookeeper=False) as dc:
        dc.ensure_bucket(BUCKET)
        best = asyncio.run(_compare(dc.s3_endpoint or "", quick))
    ratios: dict[str, float] = {}
    for case, figs in best.items():
        ratios[f"cpu_{case}_vs_boto3"] = round(figs["boto3"].cpu_ms_per_request / figs["obstore"].cpu_ms_per_request, 3)
        ratios[f"mb_s_{case}_vs_boto3"] = round(figs["obstore"].mb_s / figs["boto3"].mb_s, 3)
    raw = {case: {name: {"cpu_ms_per_request": round(f.cpu_ms_per_request, 4), "mb_s": round(f.mb_s, 1)}
                  for name, f in figs.items()} for case, figs in best.items()}
    return {"ratios": ratios, "concurrency": CONCURRENCY, "rounds": ROUNDS, "figures": raw}
