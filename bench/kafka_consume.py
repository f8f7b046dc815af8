"""Kafka-protocol consume: a confluent-kafka Consumer reading from memq's Kafka listener vs from tansu.

One dev cluster (moto S3, tansu, ZooKeeper) and one governed broker process with its Kafka
listener on. The same 100-byte values are written by a confluent-kafka Producer (acks=all) to a
3-partition memq topic through the listener and to a 3-partition topic on tansu; then a
confluent-kafka Consumer with the same settings, partitions assigned from the beginning (no
group), reads every value back from each. Runs alternate, best of `--runs` each; ratio key
`vs_tansu` is memq msg/s over tansu msg/s. memq serves the parts from its read cache (filled as
the broker stored them), so `read_gets` (the broker's ranged GETs for readers, from /metrics)
is expected to stay 0; `memq_producer_msg_s` is the same read of values memq's own Producer
wrote (its records framed as Kafka batches by the broker, once per part).

Fan-out: `FANOUT_READERS` consumers (as many groups) read one topic at once from a broker
just restarted (its read cache empty): `gets_per_object_per_broker` is the broker's ranged GETs
over the parts read (goal <= 1: single flight; memq's own Consumer GETs each part per reader).

Then the end-to-end latency through Kafka's protocol on both sides: a confluent-kafka Producer
paced at 10 MB/s of 1 KiB values (acks=all, as `bench kafka_produce` measures it) into the
listener, a confluent-kafka Consumer (assigned, at the end) reading from the listener as an
application's poll() does (what has arrived, else the next record: `consume(1000, 0.1)` alone
holds records back until 1000 came or 100 ms passed), each value stamped with its send time:
`e2e_p99_s` with the topic's batch_ms 250, `e2e_p99_s_25ms` with 25 (the issue's goals: 0.35 s
and 0.06 s). `--e2e-only` runs just this part.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
import urllib.request
from array import array
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench._cluster import kafka_produce_s
from bench.e2e import _HEAD, DRAIN_TIMEOUT_S, quantile
from bench.kafka_produce import E2E_VALUE_BYTES, PARTITIONS, VALUE_BYTES, _kafka_address, _paced, _values
from memq.client.producer import Producer
from memq.config import BrokerConfig, ProducerConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster

MiB = 1024 ** 2
TOPIC = "bench-kafka-consume"
MEMQ_TOPIC = "bench-kafka-consume-memq"
READ_TIMEOUT_S = 300
FANOUT_TOPIC = "bench-kafka-fanout"
FANOUT_READERS = 10
E2E_GOAL_S = {250: 0.35, 25: 0.06}   # the p99 goals per batch_ms
E2E_TOPICS = {"bench-kafka-consume-e2e": 250, "bench-kafka-consume-e2e-25": 25}   # topic: batch_ms


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=None, help="values written and read per target")
    parser.add_argument("--runs", type=int, default=None, help="reads per target (best counts)")
    parser.add_argument("--e2e-only", action="store_true", help="only the end-to-end latency part")
    parser.add_argument("--e2e-s", type=float, default=None, help="seconds of paced sending per batch_ms")


def consume_s(bootstrap: str, topic: str, n: int) -> float:
    """Seconds for a fresh assigned Consumer to read `n` values of `topic` from the beginning."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-unused", "enable.auto.commit": False,
                  "enable.partition.eof": False})
    try:
        t0 = time.perf_counter()
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        got = 0
        while got < n:
            if time.perf_counter() - t0 > READ_TIMEOUT_S:
                raise RuntimeError(f"{bootstrap}: read {got} of {n} within {READ_TIMEOUT_S} s")
            for m in c.consume(10_000, 0.5):
                err = m.error()
                if err is not None and err.code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(f"{bootstrap}: {err}")
                got += err is None
        return time.perf_counter() - t0
    finally:
        c.close()


def memq_produce(url: str, topic: str, values: list[bytes]) -> None:
    async def send() -> None:
        async with Producer(ProducerConfig(brokers=url, linger_ms=5, ack="all")) as p:
            futures = [await p.send_many(topic, values[i:i + 10_000]) for i in range(0, len(values), 10_000)]
            await p.flush()
            for f in futures:
                await f
    asyncio.run(send())


def e2e(address: str, topic: str, duration_s: float) -> dict:
    """p50/p99 send -> receipt of paced values, Kafka producer -> memq -> Kafka consumer."""
    warm, stop = threading.Event(), threading.Event()
    latencies = array("d")
    seen: set[int] = set()

    def consume() -> None:
        c = Consumer({"bootstrap.servers": address, "group.id": "bench-unused", "enable.auto.commit": False,
                      "fetch.wait.max.ms": 100})
        c.assign([TopicPartition(topic, p, OFFSET_END) for p in range(PARTITIONS)])
        try:
            while not stop.is_set():
                # consume(n, t) alone waits for n records or all of t: what is there, else the first one
                for m in c.consume(1000, 0) or c.consume(1, 0.1):
                    if m.error() is not None:
                        continue
                    stamp, seq = _HEAD.unpack_from(m.value() or b"")
                    if seq < 0:
                        warm.set()
                    elif seq not in seen:
                        seen.add(seq)
                        latencies.append(time.time() - stamp)
        finally:
            c.close()

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    time.sleep(1.0)   # assigned at the end before the warm-up value goes
    sent, send_s = _paced(address, topic, duration_s, E2E_VALUE_BYTES, warm)
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while len(seen) < sent and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    reader.join(10)
    if len(seen) < sent:
        raise RuntimeError(f"the Kafka consumer got {len(seen):,} of {sent:,} acked values")
    ordered = sorted(latencies)
    return {"p50_s": round(quantile(ordered, 0.5), 4), "p99_s": round(quantile(ordered, 0.99), 4), "messages": sent,
            "mb_per_s": round(sent * E2E_VALUE_BYTES / MiB / send_s, 2)}


def fanout(gc: GovernedCluster, tansu_at: str, topic: str, n: int) -> dict:
    """Restart the broker (cold cache), then FANOUT_READERS readers at once: GETs per part."""
    gc.stop_broker("b1")
    gc.restart_broker("b1")
    url = gc.broker("b1").url
    address = _kafka_address(url)
    errors: list[BaseException] = []

    def one() -> None:
        try:
            consume_s(address, topic, n)
        except BaseException as e:   # reported below, from the main thread
            errors.append(e)

    readers = [threading.Thread(target=one) for _ in range(FANOUT_READERS)]
    t0 = time.perf_counter()
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    if errors:
        raise errors[0]
    seconds = time.perf_counter() - t0
    c = Consumer({"bootstrap.servers": tansu_at, "group.id": "bench-unused"})
    try:
        ntopic = f"memq.bench.{topic}"
        parts = sum(hi - lo for lo, hi in (c.get_watermark_offsets(TopicPartition(ntopic, p), timeout=20)
                                         for p in range(PARTITIONS)))
    finally:
        c.close()
    gets = read_gets(url)
    return {"gets_per_object_per_broker": round(gets / max(parts, 1), 3), "fanout_parts": parts,
            "fanout_gets": gets, "fanout_readers": FANOUT_READERS,
            "fanout_msg_s": round(FANOUT_READERS * n / seconds)}


def read_gets(broker_url: str) -> float:
    text = urllib.request.urlopen(f"{broker_url}/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("memq_broker_read_gets_total"))


def run(quick: bool, messages: int | None = None, runs: int | None = None, e2e_only: bool = False,
        e2e_s: float | None = None) -> dict:
    if e2e_only:
        return run_e2e(e2e_s or (5.0 if quick else 20.0))
    n = messages or (200_000 if quick else 1_000_000)
    runs = runs or (2 if quick else 3)
    with tempfile.TemporaryDirectory(prefix="memq-bench-") as tmp, \
            DevCluster(Path(tmp) / "servers") as dc, \
            GovernedCluster(tmp, brokers=1, servers=dc, cluster="bench", broker=BrokerConfig(kafka_port=0)) as gc:
        for name in (TOPIC, MEMQ_TOPIC):
            gc.create_topic(TopicConfig(name, read_partitions=PARTITIONS, batch_bytes=8 * MiB, batch_ms=100))
        for name, batch_ms in E2E_TOPICS.items():
            gc.create_topic(TopicConfig(name, read_partitions=PARTITIONS, batch_ms=batch_ms))
        gc.create_topic(TopicConfig(FANOUT_TOPIC, read_partitions=PARTITIONS, batch_ms=20))
        url = gc.broker("b1").url
        memq_at = _kafka_address(url)
        tansu_at = dc.kafka_bootstrap or ""
        admin = AdminClient({"bootstrap.servers": tansu_at})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(30)
        print(f"memq Kafka listener {memq_at}; tansu {tansu_at}", flush=True)
        values = _values(n)
        kafka_produce_s(memq_at, TOPIC, values)
        kafka_produce_s(tansu_at, TOPIC, values)
        memq_produce(url, MEMQ_TOPIC, values)
        fan_n = n // 10
        kafka_produce_s(memq_at, FANOUT_TOPIC, values[:fan_n])
        del values
        memq_rates, tansu_rates, own_rates = [], [], []
        for _ in range(runs):   # interleaved, so drift on a shared machine hits both alike
            memq_rates.append(n / consume_s(memq_at, TOPIC, n))
            tansu_rates.append(n / consume_s(tansu_at, TOPIC, n))
            own_rates.append(n / consume_s(memq_at, MEMQ_TOPIC, n))
            print(f"read {n:,} x {VALUE_BYTES} B: memq {memq_rates[-1]:,.0f} msg/s, tansu {tansu_rates[-1]:,.0f} "
                  f"msg/s; written by memq's Producer: {own_rates[-1]:,.0f} msg/s", flush=True)
        gets = read_gets(url)
        fan = fanout(gc, tansu_at, FANOUT_TOPIC, fan_n)
        print(f"fan-out: {fan}", flush=True)
        latency = e2e_cases(_kafka_address(gc.broker("b1").url), e2e_s or (5.0 if quick else 20.0))
    best_memq, best_tansu = max(memq_rates), max(tansu_rates)
    return {"ratios": {"vs_tansu": round(best_memq / best_tansu, 3),
                       "e2e_p99_vs_goal": round(E2E_GOAL_S[250] / latency[250]["p99_s"], 3),
                       "e2e_p99_25ms_vs_goal": round(E2E_GOAL_S[25] / latency[25]["p99_s"], 3)},
            "memq_msg_s": round(best_memq), "tansu_msg_s": round(best_tansu),
            "memq_producer_msg_s": round(max(own_rates)), "read_gets": gets, **fan,
            **_e2e_figures(latency), "messages": n, "value_bytes": VALUE_BYTES, "runs": runs}


def e2e_cases(memq_at: str, duration_s: float) -> dict[int, dict]:
    """The end-to-end latency of each `E2E_TOPICS` case, by batch_ms."""
    latency = {}
    for name, batch_ms in E2E_TOPICS.items():
        latency[batch_ms] = e2e(memq_at, name, duration_s)
        print(f"e2e Kafka producer -> memq -> Kafka consumer, batch_ms {batch_ms}: {latency[batch_ms]}", flush=True)
    return latency


def run_e2e(duration_s: float) -> dict:
    """`--e2e-only`: a cluster with the latency topics alone, then `e2e_cases`."""
    with tempfile.TemporaryDirectory(prefix="memq-bench-") as tmp, \
            DevCluster(Path(tmp) / "servers") as dc, \
            GovernedCluster(tmp, brokers=1, servers=dc, cluster="bench", broker=BrokerConfig(kafka_port=0)) as gc:
        for name, batch_ms in E2E_TOPICS.items():
            gc.create_topic(TopicConfig(name, read_partitions=PARTITIONS, batch_ms=batch_ms))
        latency = e2e_cases(_kafka_address(gc.broker("b1").url), duration_s)
    return {"ratios": {"e2e_p99_vs_goal": round(E2E_GOAL_S[250] / latency[250]["p99_s"], 3),
                       "e2e_p99_25ms_vs_goal": round(E2E_GOAL_S[25] / latency[25]["p99_s"], 3)},
            **_e2e_figures(latency)}


def _e2e_figures(latency: dict[int, dict]) -> dict:
    return {"e2e_p99_s": latency[250]["p99_s"], "e2e_p99_s_25ms": latency[25]["p99_s"],
            "e2e_p50_s": latency[250]["p50_s"], "e2e_p50_s_25ms": latency[25]["p50_s"],
            "e2e_mb_per_s": latency[250]["mb_per_s"]}
