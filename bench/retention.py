"""Requests spent on retention: LIST + DELETE requests per GiB expired by memq's janitor, next to
raw boto3 (`list_objects_v2` over the bucket + `delete_objects`, 1,000 keys a request) deleting
the same number of objects of the same size, on one moto S3 server in one run.

The janitor lists a topic through its 256 key prefixes (the spread that keeps S3's per-prefix
request limit away from writes), so one pass costs at least 256 LISTs however little expires;
raw boto3 lists one flat bucket holding nothing else. The janitor runs as it does in a cluster:
it has made a pass before (its orphan sweep, another 256 LISTs, comes at most once per
`governor.orphan_grace_s`; that first pass's requests are reported as `warmup`). Ratio `requests_vs_raw` = raw requests /
memq requests (higher is better; 1.0 would mean no overhead). Requests are counted by each side:
the janitor's storage handler counts every LIST page and DeleteObjects request it sends.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from memq.config import MemqConfig, S3Config, TopicConfig
from memq.devcluster import DevCluster
from memq.governor.janitor import Janitor
from memq.notify import TopicAdmin
from memq.storage import make_storage

GiB = 1 << 30
DAY_MS = 86_400_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--objects", type=int, default=None, help="objects to expire (default 1024, quick 256)")
    parser.add_argument("--object-bytes", type=int, default=1 << 20, help="size of each object (default 1 MiB)")


async def _write(config: MemqConfig, topic: str, n: int, size: int, timestamp_ms: int) -> None:
    storage = make_storage(config)
    body = b"x" * size
    slots = asyncio.Semaphore(16)

    async def put(i: int) -> None:
        async with slots:
            await storage.put_batch(topic, body, first_request_id=i, timestamp_ms=timestamp_ms + i, broker_id="b1")

    try:
        await asyncio.gather(*(put(i) for i in range(n)))
    finally:
        await storage.close()


def _requests(registry: CollectorRegistry) -> tuple[int, int]:
    """(LIST, DELETE) requests the janitor's storage handler sent so far."""
    def count(op: str) -> int:
        return int(registry.get_sample_value("memq_storage_attempts_total", {"backend": "s3", "op": op}) or 0)
    return count("list"), count("delete_many")


async def _expire_memq(config: MemqConfig, topic: TopicConfig, write: Any) -> tuple[int, int, int, float, int]:
    """(objects deleted, LIST requests, DELETE requests, seconds) of one janitor pass after
    `write()`, and the LIST requests of the pass the janitor made before."""
    registry = CollectorRegistry()
    janitor = Janitor(config, registry)
    try:
        await janitor.run_once({topic.name: topic})
        warmup_lists, _ = _requests(registry)
        await write()
        t0 = time.perf_counter()
        [report] = await janitor.run_once({topic.name: topic})
        took = time.perf_counter() - t0
    finally:
        await janitor.close()
    lists, deletes = _requests(registry)
    return len(report.expired), lists - warmup_lists, deletes, took, warmup_lists


def _expire_raw(s3: S3Config) -> tuple[int, int, int, float]:
    """The same with plain boto3: list the bucket page by page, delete 1,000 keys a request."""
    import boto3

    client = boto3.session.Session(aws_access_key_id=s3.access_key_id, aws_secret_access_key=s3.secret_access_key,
                                   region_name=s3.region).client("s3", endpoint_url=s3.endpoint_url)
    t0 = time.perf_counter()
    lists = deletes = deleted = 0
    kwargs: dict[str, Any] = {"Bucket": s3.bucket}
    keys: list[str] = []
    while True:
        resp = client.list_objects_v2(**kwargs)
        lists += 1
        keys += [item["Key"] for item in resp.get("Contents", ())]
        if not resp.get("IsTruncated"):
            break
        kwargs["ContinuationToken"] = resp["NextContinuationToken"]
    for i in range(0, len(keys), 1000):
        resp = client.delete_objects(Bucket=s3.bucket, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]],
                                                                "Quiet": True})
        deletes += 1
        if resp.get("Errors"):
            raise RuntimeError(f"raw delete_objects failed: {resp['Errors'][:3]}")
        deleted += min(1000, len(keys) - i)
    return deleted, lists, deletes, time.perf_counter() - t0


def run(quick: bool = False, objects: int | None = None, object_bytes: int = 1 << 20) -> dict[str, Any]:
    n = objects or (256 if quick else 1024)
    with tempfile.TemporaryDirectory(prefix="memq-bench-") as tmp, \
            DevCluster(Path(tmp) / "servers", zookeeper=False) as dc:
        old = time.time_ns() // 1_000_000 - 2 * DAY_MS        # written two days ago, kept one day
        memq_config = dc.config(cluster="bench", bucket="memq-retention")
        topic = TopicConfig("expiring", read_partitions=1, retention_ms=DAY_MS, storage_group="")
        TopicAdmin(memq_config.kafka).create_topic(topic.notification_topic_for("bench"), 1,
                                                   retention_ms=topic.retention_ms)
        m_deleted, m_lists, m_deletes, m_s, warmup = asyncio.run(_expire_memq(
            memq_config, topic, lambda: _write(memq_config, topic.name, n, object_bytes, old)))
        print(f"memq janitor: {m_deleted} objects expired with {m_lists} LIST + {m_deletes} DELETE in {m_s:.2f} s "
              f"(its pass before, with the orphan sweep: {warmup} LIST)", flush=True)

        raw_config = dc.config(cluster="bench", bucket="raw-retention")
        asyncio.run(_write(raw_config, topic.name, n, object_bytes, old))
        r_deleted, r_lists, r_deletes, r_s = _expire_raw(raw_config.s3)
        print(f"raw boto3: {r_deleted} objects deleted with {r_lists} LIST + {r_deletes} DELETE in {r_s:.2f} s",
              flush=True)
    if m_deleted != n or r_deleted != n:
        raise RuntimeError(f"expected {n} objects deleted by each, got memq {m_deleted}, raw {r_deleted}")
    gib = n * object_bytes / GiB
    memq_per_gib = (m_lists + m_deletes) / gib
    raw_per_gib = (r_lists + r_deletes) / gib
    return {
        "ratios": {"requests_vs_raw": round(raw_per_gib / memq_per_gib, 4)},
        "objects": n, "object_bytes": object_bytes, "gib_expired": round(gib, 4),
        "memq": {"list": m_lists, "delete": m_deletes, "requests_per_gib": round(memq_per_gib, 2),
                 "seconds": round(m_s, 3), "warmup_list": warmup},
        "raw_boto3": {"list": r_lists, "delete": r_deletes, "requests_per_gib": round(raw_per_gib, 2),
                      "seconds": round(r_s, 3)},
    }
