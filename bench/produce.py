"""Produce throughput: memq Producer -> broker -> S3 (ack=all) against its peers, in one run.

Cases, all on one dev cluster started here (moto S3 server, tansu Kafka) and one broker process:
- small_vs_kafka: 100-byte values, memq at ack=all vs confluent-kafka -> tansu at acks=all;
  msg/s of each, ratio memq/kafka.
- large_vs_raw_put: 64 KiB values, memq MB/s at ack=all vs raw PUTs of objects the size of
  memq's batches by the faster S3 client (obstore, as memq's handler; see `bench s3client`), with
  as many in flight as the broker's ring uploads, to the same S3 server.
- audit_on_vs_off: the small case again with an AuditEmitter on the producer (msg/s on / off,
  same run): the cost of end-to-end auditing on the produce path.
- puts_per_gib: batch objects stored per GiB in the large case, against the ideal
  GiB / batch_bytes (target <= 1.05x of it).
Also `broker_cpu_s_per_gib`: the broker process's CPU seconds (user + system, all threads,
from /proc) per GiB ingested in the large case: what a GiB costs in broker compute.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path

import obstore
from confluent_kafka.admin import AdminClient, NewTopic

from bench._cluster import bench_cluster, broker_samples, kafka_produce_s
from memq.audit.emitter import AuditEmitter
from memq.client.producer import Producer
from memq.config import ProducerConfig, S3Config, TopicConfig
from memq.storage.s3_store import make_store

GiB = 1024 ** 3
MiB = 1024 ** 2
SMALL = 100
LARGE = 64 * 1024
BATCH_BYTES = 8 * MiB
RING_SLOTS = 4
CHUNK = 20_000        # values per send_many call
LARGE_BATCH_MS = 2_000


def _values(size: int, n: int) -> list[bytes]:
    """`n` distinct-ish values of `size` bytes: hex of random bytes (compressible like text)."""
    pool = [os.urandom(size // 2).hex().encode()[:size] for _ in range(1024)]
    return [pool[i % 1024] for i in range(n)]


async def memq_send_s(pc: ProducerConfig, topic: str, values: list[bytes],
                      audit: AuditEmitter | None = None) -> float:
    """Seconds to send every value and get every ack=all, with `pc`'s brokers and credentials."""
    cfg = dataclasses.replace(pc, ack="all", linger_ms=5, max_in_flight_bytes=128 * MiB)
    async with Producer(cfg, audit=audit) as producer:
        t0 = time.perf_counter()
        futures = [await producer.send_many(topic, values[i:i + CHUNK]) for i in range(0, len(values), CHUNK)]
        await producer.flush()
        results = await asyncio.gather(*futures)
        elapsed = time.perf_counter() - t0
    acked = sum(d.count for r in results for d in r)
    assert acked == len(values), f"{acked} of {len(values)} acked"
    return elapsed


def _kafka(bootstrap: str, topic: str, values: list[bytes]) -> float:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    return kafka_produce_s(bootstrap, topic, values)


async def _raw_put_mbps(s3: S3Config, total_bytes: int) -> float:
    """MB/s of raw obstore PUTs of BATCH_BYTES objects, RING_SLOTS - 1 in flight (the broker's
    uploads), on a store configured as memq's S3 handler's (one request per object)."""
    store = make_store(s3, request_timeout_s=60.0)
    body = os.urandom(BATCH_BYTES)
    n = max(total_bytes // BATCH_BYTES, RING_SLOTS)
    slots = asyncio.Semaphore(RING_SLOTS - 1)

    async def put(i: int) -> None:
        async with slots:
            await obstore.put_async(store, f"raw/{i:06d}", body, use_multipart=False)

    t0 = time.perf_counter()
    await asyncio.gather(*(put(i) for i in range(n)))
    return n * BATCH_BYTES / MiB / (time.perf_counter() - t0)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far, all threads (Linux /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime, stime


def _broker_batches(url: str, topic: str) -> tuple[int, float]:
    """(batch objects, bytes stored) for `topic`, from the broker's Prometheus metrics."""
    mine = {s.name: s.value for s in broker_samples(url, "memq_broker_batch_bytes") if s.labels.get("topic") == topic}
    return int(mine["memq_broker_batch_bytes_count"]), mine["memq_broker_batch_bytes_sum"]


def run(quick: bool) -> dict:
    n_small = 400_000 if quick else 2_000_000
    large_bytes = 256 * MiB if quick else 1 * GiB
    # The large topic's batch_ms is long enough that its batches seal by size (8 MiB arrive in
    # well under a second at the rates measured here): puts_per_gib checks size sealing, and at
    # the default 250 ms a producer at ~35 MB/s made time-sealed objects just short of 8 MiB.
    topics = (TopicConfig("bench-small", batch_bytes=BATCH_BYTES, ring_slots=RING_SLOTS),
              TopicConfig("bench-large", batch_bytes=BATCH_BYTES, ring_slots=RING_SLOTS, batch_ms=LARGE_BATCH_MS))
    with bench_cluster(topics) as bc:
        dc, config, broker = bc.dc, bc.config, bc.broker
        print(f"broker at {broker.url}; S3 {dc.s3_endpoint}; Kafka {dc.kafka_bootstrap}", flush=True)
        pc = ProducerConfig(brokers=broker.url)
        small = _values(SMALL, n_small)
        asyncio.run(memq_send_s(pc, "bench-small", small[:20_000]))       # warm up connections
        memq_rate = n_small / asyncio.run(memq_send_s(pc, "bench-small", small))
        print(f"memq  ack=all {SMALL} B: {memq_rate:,.0f} msg/s", flush=True)
        # Audit on vs off: interleaved pairs, best of each, so drift on a shared machine cancels.
        sink = AuditEmitter(config.kafka, config.audit, config.cluster.name, client_id="bench")
        try:
            audited_rate, off_rate = 0.0, memq_rate
            for _ in range(2):
                audited_rate = max(audited_rate, n_small / asyncio.run(
                    memq_send_s(pc, "bench-small", small, audit=sink)))
                off_rate = max(off_rate, n_small / asyncio.run(memq_send_s(pc, "bench-small", small)))
        finally:
            sink.close()
        print(f"memq  ack=all {SMALL} B, audit on: {audited_rate:,.0f} msg/s vs off {off_rate:,.0f} "
              f"({sink.stats().sent} audit records sent)", flush=True)
        # both sides best of 3 runs (memq: the unaudited runs above)
        best_memq = off_rate
        kafka_rates = [n_small / _kafka(dc.kafka_bootstrap or "", f"bench-kafka-small-{i}", small) for i in range(3)]
        kafka_rate = max(kafka_rates)
        print(f"kafka acks=all {SMALL} B: {', '.join(f'{r:,.0f}' for r in kafka_rates)} msg/s; "
              f"best memq {best_memq:,.0f} vs kafka {kafka_rate:,.0f}", flush=True)
        del small

        large = [os.urandom(LARGE) for _ in range(large_bytes // LARGE)]
        cpu0 = cpu_s(broker.pid)
        memq_large_s = asyncio.run(memq_send_s(pc, "bench-large", large))
        cpu_per_gib = (cpu_s(broker.pid) - cpu0) / (large_bytes / GiB)
        memq_mbps = large_bytes / MiB / memq_large_s
        print(f"memq  ack=all 64 KiB: {memq_mbps:,.1f} MB/s; broker {cpu_per_gib:.2f} CPU-s per GiB", flush=True)
        batches, stored = _broker_batches(broker.url, "bench-large")
        del large
        raw_mbps = asyncio.run(_raw_put_mbps(config.s3, large_bytes))
        print(f"raw obstore PUT {BATCH_BYTES // MiB} MiB x{RING_SLOTS - 1}: {raw_mbps:,.1f} MB/s", flush=True)
    puts_per_gib = batches / (stored / GiB)
    ideal = GiB / BATCH_BYTES
    print(f"puts per GiB: {puts_per_gib:.1f} (ideal {ideal:.0f}, target <= {1.05 * ideal:.1f})", flush=True)
    return {
        "ratios": {"small_vs_kafka": round(best_memq / kafka_rate, 3),
                   "large_vs_raw_put": round(memq_mbps / raw_mbps, 3),
                   "audit_on_vs_off": round(audited_rate / off_rate, 3)},
        "memq_small_msg_s": round(best_memq), "kafka_small_msg_s": round(kafka_rate),
        "memq_small_audited_msg_s": round(audited_rate), "memq_small_unaudited_msg_s": round(off_rate),
        "memq_large_mb_s": round(memq_mbps, 1), "raw_put_mb_s": round(raw_mbps, 1),
        "broker_cpu_s_per_gib": round(cpu_per_gib, 2), "puts_per_gib": round(puts_per_gib, 1), "puts_per_gib_target": round(1.05 * ideal, 1),
        "batch_bytes": BATCH_BYTES, "small_messages": n_small, "large_bytes": large_bytes,
    }
