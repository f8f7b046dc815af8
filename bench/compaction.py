"""Compaction of a compacted topic: K keys x U updates of 100 B values (5% of the last updates
tombstones) written as plain parts of one partition, then one compaction run (memq.compaction).

- `compact_mb_per_core_s`: record bytes (key + value) compacted per CPU second of this process,
  against the same process's producer-side encoding of the same records (`encode_message`, zstd,
  per CPU second): the goal is at least a tenth of ingest, so the ratio is compact / (ingest / 10);
- `stored_bytes_after_vs_latest`: bytes of the compacted parts (with their key index) over the
  bytes of the latest live values (key + value); goal <= 1.5, ratio = 1.5 / it;
- `read_state_vs_plain`: seconds to read every part of the uncompacted topic over seconds to read
  the current state from the compacted parts (goal >= 10), the second read in the process (the
  first also loads the compiled record walk: `read_state_first_s`);
- `get_key_p99_s`: p99 of one key's lookup through the parts' key indexes (a fresh part reader
  per lookup: its header and index GETs count), goal <= 0.1 s, ratio = 0.1 / it.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from memq.compaction.manifest import ManifestCache, ManifestPointers
from memq.compaction.parts import plain_survivors
from memq.compaction.read import PartReader
from memq.compaction.run import Compactor
from memq.config import GovernorConfig, MemqConfig, TopicConfig
from memq.devcluster import DevCluster
from memq.format import (NOTIFICATION_VERSION, Codec, LogMessage, Notification, decode_message_header, encode_batch,
                         encode_message, object_crc32c)
from memq.governor.registry import Registry
from memq.kafka_api.offsets import first_offset
from memq.notify import NotificationPublisher, TopicAdmin
from memq.storage import make_storage
from memq.storage.base import ObjectLocation

VALUE = 100
PER_OBJECT = 50_000


def _updates(keys: int, updates: int) -> list[list[LogMessage]]:
    """The records, update round by round, cut into objects; the last round deletes 5% of the keys."""
    now = int(time.time() * 1000)
    recs = []
    for u in range(updates):
        for k in range(keys):
            tomb = u == updates - 1 and k % 20 == 0
            recs.append(LogMessage(None if tomb else random.randbytes(VALUE), b"key-%08d" % k, (), now))  # type: ignore[arg-type]
    return [recs[i:i + PER_OBJECT] for i in range(0, len(recs), PER_OBJECT)]


async def _write(config: MemqConfig, topic: TopicConfig, objects: list[list[LogMessage]]) -> tuple[list[tuple[int, Notification]], float]:
    """Store and announce each object; (offset, notification) of each, and the CPU s of encoding."""
    storage = make_storage(config)
    publisher = NotificationPublisher(config.kafka, client_id="bench-compaction")
    out = []
    encode_cpu = 0.0
    try:
        for seq, recs in enumerate(objects):
            t0 = time.process_time()
            msg = encode_message(recs, producer_id=1, epoch=0, sequence=seq, codec=Codec.ZSTD)
            encode_cpu += time.process_time() - t0
            h = decode_message_header(msg)
            now = int(time.time() * 1000)
            chunks = encode_batch([msg], [h], broker_id="bench", created_ms=now)
            loc = await storage.put_batch(topic.name, chunks, first_request_id=seq + 1, timestamp_ms=now, broker_id="b")
            note = Notification(v=NOTIFICATION_VERSION, topic=topic.name, bucket=loc.bucket, key=loc.key,
                                size=sum(len(c) for c in chunks), header_size=len(chunks[0]), message_count=1,
                                logmessage_count=h.count, min_timestamp_ms=h.min_timestamp_ms,
                                max_timestamp_ms=h.max_timestamp_ms, crc32c=object_crc32c(chunks), broker_id="b",
                                attempt=0, created_ms=now)
            _, offset = await publisher.publish(topic.notification_topic_for(config.cluster.name), note)
            out.append((offset, note))
    finally:
        publisher.close()
        await storage.close()
    return out, encode_cpu


async def _read_plain(config: MemqConfig, notes: list[tuple[int, Notification]]) -> float:
    storage = make_storage(config)
    try:
        t0 = time.perf_counter()
        for offset, n in notes:
            plain_survivors(first_offset(offset), await storage.get_range(ObjectLocation(n.bucket, n.key), n.offset, n.size))
        return time.perf_counter() - t0
    finally:
        await storage.close()


async def _read_state(config: MemqConfig, registry: Registry, topic: str, keys: int, lookups: int
                      ) -> tuple[float, float, int, int, list[float]]:
    """(seconds to read the state the first time in this process and again, survivors read,
    bytes stored, lookup latencies). The first read also loads the compiled record walk
    (numba's import and its cached compile: once per process); each read has a fresh reader."""
    storage = make_storage(config)
    try:
        ptr = ManifestPointers(registry).read(topic, 0)
        assert ptr is not None
        m = await ManifestCache(storage).load(ptr)
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            n = 0
            reader = PartReader(storage)
            for part in m.parts:
                async for chunk in reader.survivors_from(part, 0):
                    n += len(chunk)
            times.append(time.perf_counter() - t0)
        lat = []
        for _ in range(lookups):
            key = b"key-%08d" % random.randrange(keys)
            t0 = time.perf_counter()
            await PartReader(storage).get(m, key)
            lat.append(time.perf_counter() - t0)
        return times[0], times[1], n, m.size, lat
    finally:
        await storage.close()


def run(quick: bool = False) -> dict[str, Any]:
    keys, updates = (10_000, 10) if quick else (100_000, 20)
    random.seed(40)
    objects = _updates(keys, updates)
    latest: dict[bytes, bytes | None] = {}
    for recs in objects:
        for r in recs:
            latest[r.key] = r.value  # type: ignore[index]
    latest_bytes = sum(len(k) + len(v) for k, v in latest.items() if v is not None)
    record_bytes = sum(len(r.key or b"") + len(r.value or b"") for recs in objects for r in recs)
    with tempfile.TemporaryDirectory(prefix="memq-bench-") as tmp, DevCluster(Path(tmp) / "servers") as dc:
        config = dc.config(cluster="bench", bucket="memq-compaction")
        config = MemqConfig(**{**config.__dict__, "governor": GovernorConfig(compaction_mbps=10_000.0)})
        topic = TopicConfig("compacted", read_partitions=1, storage_group="", cleanup_policy="compact",
                            min_cleanable_dirty_ratio=0.0)
        TopicAdmin(config.kafka).create_topic(topic.notification_topic_for("bench"), 1)
        notes, encode_cpu = asyncio.run(_write(config, topic, objects))
        print(f"wrote {keys} keys x {updates} updates: {len(notes)} objects, "
              f"{sum(n.size for _, n in notes):,} B stored", flush=True)
        with Registry(config.zookeeper, config.cluster.name) as registry:
            compactor = Compactor(config, ManifestPointers(registry), CollectorRegistry())
            t0, c0 = time.perf_counter(), time.process_time()
            out = asyncio.run(compactor.partition(topic, 0, force=True))
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            assert out.result == "swapped" and out.manifest is not None
            plain_s = asyncio.run(_read_plain(config, notes))
            cold_s, state_s, survivors, stored, lat = asyncio.run(_read_state(config, registry, topic.name, keys,
                                                                              50 if quick else 200))
    live = sum(1 for v in latest.values() if v is not None)
    compact_mb = record_bytes / 1e6 / cpu
    ingest_mb = record_bytes / 1e6 / encode_cpu
    stored_ratio = stored / latest_bytes
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(f"compaction: {wall:.2f} s wall, {cpu:.2f} s CPU, {compact_mb:.1f} MB/core-s (producer encode "
          f"{ingest_mb:.1f} MB/core-s); {survivors} survivors ({live} live); stored {stored:,} B vs latest "
          f"{latest_bytes:,} B; read state {state_s:.3f} s (first in the process {cold_s:.3f} s) vs plain {plain_s:.3f} s; get p99 {p99 * 1000:.1f} ms",
          flush=True)
    return {
        "ratios": {"compact_vs_tenth_of_ingest": round(compact_mb / (ingest_mb / 10), 3),
                   "stored_goal_vs_after": round(1.5 / stored_ratio, 3),
                   "read_state_vs_plain": round(plain_s / state_s, 2),
                   "get_key_goal_vs_p99": round(0.1 / p99, 2)},
        "compact_mb_per_core_s": round(compact_mb, 2), "ingest_encode_mb_per_core_s": round(ingest_mb, 2),
        "stored_bytes_after_vs_latest": round(stored_ratio, 3), "stored_bytes": stored, "latest_bytes": latest_bytes,
        "read_state_s": round(state_s, 3), "read_state_first_s": round(cold_s, 3), "read_plain_s": round(plain_s, 3), "get_key_p99_s": round(p99, 4),
        "keys": keys, "updates": updates, "survivors": survivors, "compaction_wall_s": round(wall, 2),
    }
