"""`memq cost` and the latency budget on the real path: a governed 2-broker cluster on moto S3,
tansu and ZooKeeper, the `memq` console script, and the bucket listed with boto3 directly; a
compacted topic compacted by the broker whose share it is (every second here), priced on what it keeps."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest
from prometheus_client.parser import text_string_to_metric_families

from memq.client.producer import Producer
from memq.config import MemqConfig, TopicConfig
from memq.cost.model import GB
from memq.devcluster import DevCluster, GovernedCluster
from memq.devcluster.governed import FAST_GOVERNOR

MEMQ = str(Path(sys.executable).with_name("memq"))


def memq(config: Path, *args: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    run = subprocess.run([MEMQ, "--config", str(config), *args], capture_output=True, timeout=60,
                         env={**clean, "COLUMNS": "200"})
    assert run.returncode == 0, run.stderr.decode()
    return run.stdout.decode()


def objects_in_bucket(config: MemqConfig, topic: str) -> int:
    """Batch objects of `topic` as S3 itself lists them (not memq's counters)."""
    s3 = boto3.client("s3", endpoint_url=config.s3.endpoint_url, region_name=config.s3.region,
                      aws_access_key_id=config.s3.access_key_id, aws_secret_access_key=config.s3.secret_access_key)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=config.s3.bucket)
    return sum(f"/{config.cluster.name}/topics/{topic}/" in o["Key"] for page in pages for o in page.get("Contents", ()))


async def produce(config: MemqConfig, topic: str, rounds: int, per_round: int, pause_s: float = 0.0,
                  flush: bool = True) -> None:
    """`rounds` groups of values at ack=all, each group flushed (one object per broker) unless not `flush`."""
    async with Producer(config.producer) as producer:
        pending = []
        for r in range(rounds):
            pending += [await producer.send(topic, f"{topic}-{r}-{i}".encode() * 20) for i in range(per_round)]
            if flush:
                await producer.flush()
            await asyncio.sleep(pause_s)
        await asyncio.gather(*pending)


async def produce_keyed(config: MemqConfig, topic: str, rounds: int, keys: int) -> None:
    """`rounds` updates of each of `keys` keys, 200 random (incompressible) bytes each, each round
    flushed at ack=all."""
    async with Producer(config.producer) as producer:
        for _ in range(rounds):
            await asyncio.gather(*[await producer.send(topic, os.urandom(200), key=b"k%d" % k) for k in range(keys)])
            await producer.flush()


def compacted_all(config: MemqConfig, topic: str, partitions: int, timeout_s: float = 30.0) -> dict[str, str]:
    """Partition -> URL of the broker compacting it, once every partition of `topic` is reported
    compacted with no tail left, each confirmed by an idle pass of its broker after that (a swap's
    gauges describe the notifications it read at its start: some written meanwhile may be dirty)."""
    deadline = time.monotonic() + timeout_s
    idle_at: dict[tuple[str, str], float] = {}     # (broker, partition) -> its idle passes when first clean
    done: dict[str, str] = {}
    while time.monotonic() < deadline and len(done) < partitions:
        for url in config.producer.brokers.split(","):
            with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
                samples = [s for f in text_string_to_metric_families(r.read().decode()) for s in f.samples
                           if s.labels.get("topic") == topic]
            idle = next((s.value for s in samples if s.name == "memq_compaction_runs_total"
                         and s.labels.get("result") == "idle"), 0.0)
            stored = {s.labels["partition"]: s.value for s in samples if s.name == "memq_compaction_stored_bytes"}
            ratio = {s.labels["partition"]: s.value for s in samples if s.name == "memq_compaction_dirty_ratio"}
            for p, nbytes in stored.items():
                if nbytes > 0 and ratio.get(p) == 0:
                    if idle > idle_at.setdefault((url, p), idle):
                        done[p] = url
                else:
                    idle_at.pop((url, p), None)
        time.sleep(0.3)
    if len(done) < partitions:
        raise AssertionError(f"{topic}: partitions {sorted(done)} of {partitions} compacted within {timeout_s} s")
    return done


@pytest.mark.timeout(240)
def test_memq_cost_prints_the_requests_s3_served_and_a_trickle_topic_batches_by_its_budget(
        devcluster: DevCluster, tmp_path: Path, unique_name: Callable[[str], str]) -> None:
    busy, trickle, state = unique_name("busy"), unique_name("trickle"), unique_name("state")
    with GovernedCluster(tmp_path, brokers=2, servers=devcluster, cluster=unique_name("c"),
                         governor=dataclasses.replace(FAST_GOVERNOR, janitor_interval_s=1.0, compaction_interval_s=1.0)) as gc:
        # topics of their own objects (storage_group ""), counted in the bucket by topic key; the
        # split of a storage group's requests is in test_cost_model.py
        gc.create_topic(TopicConfig(busy, storage_group=""), brokers=2)
        # latency budget: 5 values 0.2 s apart, batch_ms 100: without it, one object per value;
        # with it, one per broker at most (the topic is on both)
        gc.create_topic(TopicConfig(trickle, batch_ms=100, min_batch_bytes=1 << 20, max_batch_ms=5_000,
                                    storage_group=""), brokers=2)
        # a compacted topic of two partitions: each broker compacts one and reports it
        placed = gc.create_topic(TopicConfig(state, cleanup_policy="compact", read_partitions=2,
                                             min_cleanable_dirty_ratio=0.01, storage_group=""), brokers=2)
        config = gc.config()
        client = gc.write_client_config(tmp_path / "client.toml")
        asyncio.run(produce(config, busy, rounds=6, per_round=50))
        asyncio.run(produce(config, trickle, rounds=5, per_round=1, pause_s=0.2, flush=False))
        asyncio.run(produce_keyed(config, state, rounds=8, keys=10))
        # its hosts take its partitions in turn, and each reports its own (`compaction.plan.compactor_of`)
        assert compacted_all(config, state, 2) == {"0": gc.broker(placed[0]).url, "1": gc.broker(placed[1]).url}

        one_broker = config.producer.brokers.split(",")[0]     # the other is found through its metadata
        report = json.loads(memq(client, "cost", "--json", "--brokers", one_broker))
        stored = objects_in_bucket(config, busy)
        assert len(report["brokers"]) == 2 and stored >= 6
        counts = report["topics"][busy]["counts"]
        assert counts["requests"]["put"] == stored            # every PUT S3 served, and no other
        assert counts["objects"] == counts["notifications"] == stored
        assert counts["requests"]["get"] == 0
        assert report["topics"][busy]["memq_usd_month"] > 0 and report["topics"][busy]["kafka_usd_month"] > 0
        trickled = objects_in_bucket(config, trickle)
        assert 1 <= trickled <= 2 and report["topics"][trickle]["counts"]["requests"]["put"] == trickled

        assert report["topics"][busy]["compaction"] is None

        # the compacted topic: priced on its compacted parts (the tail is compacted too), against the
        # bytes written over 7 days (the default retention) at its rate
        shown = report["topics"][state]
        kept = shown["compaction"]
        assert kept is not None and kept["tail_bytes"] == 0 and kept["kept_bytes"] == kept["parts_bytes"] > 0
        assert kept["parts_bytes"] < shown["counts"]["stored_bytes"] / 4       # 8 updates of each key -> 1 kept
        # (the topic is on both brokers: their rates add, each over its own window, at most window_s)
        assert kept["uncompacted_bytes"] >= shown["counts"]["stored_bytes"] / shown["window_s"] * 7 * 86_400 * 0.999
        s3 = next(x for x in shown["memq"] if x["name"] == "s3_storage")
        assert s3["quantity"] == pytest.approx(kept["kept_bytes"] / GB) and kept["saving_usd_month"] > 0

        # every topic against its break-even, from the settings its brokers report: the trickle
        # holds its batches to 5 s, so its break-even is lower than the busy topic's (250 ms)
        for topic in (busy, trickle, state):
            be = report["topics"][topic]["break_even"]
            assert be["break_even_mib_s"] is not None and be["settings"]["brokers"] == 2, (topic, be)
            assert be["now_mib_s"] == pytest.approx(report["topics"][topic]["counts"]["bytes_in"] / 2**20
                                                    / report["topics"][topic]["window_s"], rel=0.5)
        assert report["topics"][trickle]["break_even"]["settings"]["max_batch_ms"] == 5_000
        assert report["topics"][trickle]["break_even"]["break_even_mib_s"] < report["topics"][busy]["break_even"]["break_even_mib_s"]

        text = memq(client, "cost", "--topic", busy, "--topic", state, "--brokers", one_broker, "--retention-days", "1")
        assert "S3 Standard" in text and f"{stored:,} PUT" in text and "cross-AZ replication" in text
        assert trickle not in text and "retention 1 days" in text
        assert text.count("compacted: keeps") == 1 and "(compacted parts + plain tail)" in text
        assert text.count("break-even: ") == 2 and "objects of its own, on 2 broker(s)" in text
