"""Kafka-protocol produce: a confluent-kafka Producer writing to memq's Kafka listener vs to tansu.

One dev cluster (moto S3, tansu, ZooKeeper) and one governed broker process with its Kafka
listener on; the same Producer settings (100-byte values, acks=all, linger.ms=5) write to a
3-partition memq topic through the listener (stored in S3 and notified before each ack) and to
a 3-partition topic on tansu. Runs alternate, best of `--runs` each; ratio key `vs_tansu` is
memq msg/s over tansu msg/s. Each run also takes the CPU seconds of the servers: the memq broker,
the S3 server it stores to (moto: its PUT handling and ETag MD5 run on the same cores; on AWS they
do not) and tansu; `broker_cpu_vs_tansu` is tansu's CPU per value over the broker's (best runs). Then the end-to-end latency through the Kafka path: the same
Producer paced at 10 MB/s of 1 KiB values (acks=all) into the listener, memq's Consumer in its
own process, exactly as `bench e2e` measures memq's own producer (its consumer and quantiles);
ratio key `e2e_p99_vs_target` is that bench's 0.5 s target over the p99. Kafka's protocol has no "flush" a broker could see, so the last
batch of each run seals by age: `--batch-ms` (default the topic default) is part of every
run's time, which a short (`--quick`) run feels most.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.synchronize import Event
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench._cluster import kafka_produce_s
from bench.produce import cpu_s
from bench.e2e import (_HEAD, DRAIN_TIMEOUT_S, JOIN_TIMEOUT_S, RATE_BYTES_S, TARGET_P99_S, TICK_S, _consume,
                       quantile)
from memq.client.cluster import fetch_metadata
from memq.config import BrokerConfig, MemqConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster

MiB = 1024 ** 2
VALUE_BYTES = 100
PARTITIONS = 3
TOPIC = "bench-kafka-api"
E2E_TOPIC = "bench-kafka-e2e"
E2E_VALUE_BYTES = 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=None, help="values per run")
    parser.add_argument("--runs", type=int, default=None, help="runs per target (best counts)")
    parser.add_argument("--batch-ms", type=int, default=TopicConfig.batch_ms,
                        help="the memq topic's batch_ms (a Kafka producer cannot ask for an early seal, "
                             "so each run's last batch waits this long)")


def _values(n: int) -> list[bytes]:
    """`n` values of VALUE_BYTES: hex of random bytes (compressible like text), 1024 distinct."""
    pool = [os.urandom(VALUE_BYTES // 2).hex().encode()[:VALUE_BYTES] for _ in range(1024)]
    return [pool[i % 1024] for i in range(n)]


def _paced(address: str, topic: str, duration_s: float, value_bytes: int, warm: Event) -> tuple[int, float]:
    """Send stamped values at RATE_BYTES_S for `duration_s` (acks=all); (sent, seconds sending)."""
    pads = [os.urandom(value_bytes // 2).hex().encode()[:value_bytes - _HEAD.size] for _ in range(256)]
    p = Producer({"bootstrap.servers": address, "acks": "all", "linger.ms": 5})
    failed: list[object] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    p.produce(topic, _HEAD.pack(time.time(), -1) + pads[0])
    p.flush(30)
    if not warm.wait(JOIN_TIMEOUT_S):
        raise RuntimeError(f"the consumer did not receive the warm-up message within {JOIN_TIMEOUT_S} s")
    per_s = RATE_BYTES_S / value_bytes
    sent = 0
    t0 = time.monotonic()
    while (elapsed := time.monotonic() - t0) < duration_s:
        stamp = time.time()
        for seq in range(sent, int(elapsed * per_s) + 1):
            p.produce(topic, _HEAD.pack(stamp, seq) + pads[seq & 255], on_delivery=on_delivery)
        sent = max(sent, int(elapsed * per_s) + 1)
        p.poll(0)
        time.sleep(max(0.0, TICK_S - (time.monotonic() - t0 - elapsed)))
    send_s = time.monotonic() - t0
    if p.flush(60) or failed:
        raise RuntimeError(f"{len(failed)} of {sent} Kafka sends failed, first: {failed[:1]}")
    return sent, send_s


def _e2e(config: MemqConfig, address: str, topic: str, duration_s: float) -> dict:
    """p50/p99 send -> receipt through the Kafka listener, read by memq's Consumer in a process."""
    ctx = multiprocessing.get_context("spawn")
    assigned, warm = ctx.Event(), ctx.Event()
    ours, theirs = ctx.Pipe()
    reader = ctx.Process(target=_consume, args=(config, topic, assigned, warm, theirs), name="e2e-consumer",
                         daemon=True)
    reader.start()
    try:
        if not assigned.wait(JOIN_TIMEOUT_S):
            raise RuntimeError(f"the consumer got no assignment within {JOIN_TIMEOUT_S} s")
        sent, send_s = _paced(address, topic, duration_s, E2E_VALUE_BYTES, warm)
        ours.send(sent)
        if not ours.poll(DRAIN_TIMEOUT_S + 30):
            raise RuntimeError("the consumer process sent no result")
        raw, duplicates, missing = ours.recv()
        reader.join(10)
    finally:
        if reader.is_alive():
            reader.terminate()
            reader.join(5)
    if missing:
        raise RuntimeError(f"consumer missed {len(missing):,} of {sent:,} acked messages, first {missing[:10]}")
    latencies = sorted(array("d", raw))
    p50, p99 = quantile(latencies, 0.5), quantile(latencies, 0.99)
    mbps = sent * E2E_VALUE_BYTES / MiB / send_s
    print(f"e2e via Kafka listener: {sent:,} messages at {mbps:.2f} MB/s, p50 {p50:.3f}s p99 {p99:.3f}s "
          f"({duplicates} duplicates)", flush=True)
    return {"e2e_p50_s": round(p50, 4), "e2e_p99_s": round(p99, 4), "e2e_mb_per_s": round(mbps, 2),
            "e2e_messages": sent}


def _kafka_address(broker_url: str) -> str:
    """The broker's Kafka listener, as its metadata advertises it."""
    (address,) = [b.kafka_address for b in fetch_metadata(broker_url, 10.0).brokers if b.url == broker_url]
    return address


@contextmanager
def listener_and_tansu(topic: str, batch_ms: int) -> Iterator[tuple[DevCluster, GovernedCluster, str, str]]:
    """A dev cluster with one governed broker whose Kafka listener is on, `topic` on both memq and
    tansu (the peer): (the servers, the cluster, memq's listener, tansu's bootstrap)."""
    with tempfile.TemporaryDirectory(prefix="memq-bench-") as tmp, \
            DevCluster(Path(tmp) / "servers") as dc, \
            GovernedCluster(tmp, brokers=1, servers=dc, cluster="bench", broker=BrokerConfig(kafka_port=0)) as gc:
        gc.create_topic(TopicConfig(topic, read_partitions=PARTITIONS, batch_bytes=8 * MiB, ring_slots=4,
                                    batch_ms=batch_ms))
        memq_at = _kafka_address(gc.broker("b1").url)
        tansu_at = dc.kafka_bootstrap or ""
        admin = AdminClient({"bootstrap.servers": tansu_at})   # kept alive until the topic exists
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
        print(f"memq Kafka listener {memq_at}; tansu {tansu_at}", flush=True)
        yield dc, gc, memq_at, tansu_at


def run(quick: bool, messages: int | None = None, runs: int | None = None,
        batch_ms: int = TopicConfig.batch_ms) -> dict:
    n = messages or (200_000 if quick else 1_000_000)
    runs = runs or (2 if quick else 3)
    with listener_and_tansu(TOPIC, batch_ms) as (dc, gc, memq_at, tansu_at):
        values = _values(n)
        kafka_produce_s(memq_at, TOPIC, values[:20_000])    # warm up both: connections, metadata
        kafka_produce_s(tansu_at, TOPIC, values[:20_000])
        servers = {"broker": gc.broker("b1").pid, "s3": dc.pids["s3"], "tansu": dc.pids["kafka"]}
        memq_rates, tansu_rates = [], []
        cpu: dict[str, list[float]] = {name: [] for name in servers}
        for _ in range(runs):   # interleaved, so drift on a shared machine hits both alike
            before = {name: cpu_s(pid) for name, pid in servers.items()}
            memq_rates.append(n / kafka_produce_s(memq_at, TOPIC, values))
            middle = {name: cpu_s(pid) for name, pid in servers.items()}
            tansu_rates.append(n / kafka_produce_s(tansu_at, TOPIC, values))
            after = {name: cpu_s(pid) for name, pid in servers.items()}
            for name in ("broker", "s3"):
                cpu[name].append(middle[name] - before[name])
            cpu["tansu"].append(after["tansu"] - middle["tansu"])
            print(f"acks=all {VALUE_BYTES} B: memq {memq_rates[-1]:,.0f} msg/s (broker CPU {cpu['broker'][-1]:.2f} s, "
                  f"S3 server {cpu['s3'][-1]:.2f} s), tansu {tansu_rates[-1]:,.0f} msg/s (CPU {cpu['tansu'][-1]:.2f} s)",
                  flush=True)
        del values
        gc.create_topic(TopicConfig(E2E_TOPIC, read_partitions=PARTITIONS))
        e2e = _e2e(gc.config(), memq_at, E2E_TOPIC, 10.0 if quick else 30.0)
    best_memq, best_tansu = max(memq_rates), max(tansu_rates)
    per_m = {name: min(seconds) * 1e6 / n for name, seconds in cpu.items()}   # CPU s per million values
    return {"ratios": {"vs_tansu": round(best_memq / best_tansu, 3),
                       "broker_cpu_vs_tansu": round(per_m["tansu"] / per_m["broker"], 3),
                       "e2e_p99_vs_target": round(TARGET_P99_S / e2e["e2e_p99_s"], 3)},
            **e2e,
            "memq_kafka_msg_s": round(best_memq), "tansu_msg_s": round(best_tansu),
            "broker_cpu_s_per_m": round(per_m["broker"], 3), "s3_server_cpu_s_per_m": round(per_m["s3"], 3),
            "tansu_cpu_s_per_m": round(per_m["tansu"], 3),
            "messages": n, "value_bytes": VALUE_BYTES, "runs": runs, "batch_ms": batch_ms}
