"""Kafka transactions: a transactional confluent-kafka Producer on memq's Kafka listener, against
the same Producer without transactions on memq, and against the stand-in Kafka (tansu) with them.

One dev cluster (moto S3, tansu, ZooKeeper) and one governed broker with its Kafka listener on.
Each case writes 100-byte values (acks=all, linger.ms=5) to a 3-partition topic in chunks of 100
and of 1,000 records: a transactional chunk is begin, produce, flush, commit; a plain chunk is
produce, flush (the same sync points, so the ratio is the price of the transaction itself). Cases
alternate, best of `--runs` each. Ratios: `txn_vs_plain` (memq transactional msg/s over memq
plain, at 1,000 records per transaction; goal >= 0.8), `vs_kafka_txn` (memq transactional over
tansu transactional, same size), `commit_vs_goal` (2 x the plain chunk's ack p99 over the commit
p99: >= 1 meets the goal "a commit costs at most twice a produce ack at the topic's batch_ms").
Raw figures: per size, msg/s of each case, `commit_p99_s` (commit_transaction alone, after the
flush) and `ack_p99_s` (a plain chunk's flush: its acks at the topic's `--batch-ms`).
"""

from __future__ import annotations

import argparse
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import KafkaException, Producer

from bench.e2e import quantile
from bench.kafka_produce import VALUE_BYTES, _values, listener_and_tansu
from memq.config import TopicConfig

TOPIC = "bench-txn"
SIZES = (100, 1000)
TXN_TIMEOUT_MS = 60_000
INIT_TIMEOUT_S = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=int, default=None, help="records per case and chunk size")
    parser.add_argument("--runs", type=int, default=None, help="runs per case (best counts)")
    parser.add_argument("--batch-ms", type=int, default=TopicConfig.batch_ms, help="the memq topic's batch_ms")


@dataclass(frozen=True)
class Run:
    """One case at one chunk size: its rate and, per chunk, the commit (or flush) seconds."""

    msg_s: float
    waits_s: list[float]


def _producer(address: str, transactional: bool) -> Producer:
    conf: dict[str, object] = {"bootstrap.servers": address, "acks": "all", "linger.ms": 5,
                               "batch.num.messages": 10_000, "queue.buffering.max.messages": 2_000_000}
    if transactional:
        conf.update({"transactional.id": f"bench-{uuid.uuid4().hex[:8]}",
                     "transaction.timeout.ms": TXN_TIMEOUT_MS})
    p = Producer(conf)
    if transactional:
        p.init_transactions(INIT_TIMEOUT_S)
    return p


def _chunks(p: Producer, topic: str, values: list[bytes], size: int, transactional: bool) -> Run:
    """Write `values` in chunks of `size`; per chunk the commit seconds (transactional) or the
    flush seconds (plain)."""
    failed: list[object] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    waits: list[float] = []
    t0 = time.perf_counter()
    for at in range(0, len(values), size):
        if transactional:
            p.begin_transaction()
        for v in values[at:at + size]:
            p.produce(topic, v, on_delivery=on_delivery)
        t1 = time.perf_counter()
        if p.flush(60):
            raise RuntimeError(f"chunk at {at}: records not acked within 60 s")
        t2 = time.perf_counter()
        if transactional:
            p.commit_transaction(60)
            waits.append(time.perf_counter() - t2)
        else:
            waits.append(t2 - t1)
    elapsed = time.perf_counter() - t0
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(values)} sends failed, first: {failed[0]}")
    return Run(len(values) / elapsed, waits)


def _case(address: str, topic: str, values: list[bytes], size: int, transactional: bool) -> Run:
    p = _producer(address, transactional)
    try:
        return _chunks(p, topic, values, size, transactional)
    finally:
        p.flush(10)


def run(quick: bool, records: int | None = None, runs: int | None = None,
        batch_ms: int = TopicConfig.batch_ms) -> dict:
    n = records or (10_000 if quick else 100_000)
    runs = runs or (1 if quick else 3)
    with listener_and_tansu(TOPIC, batch_ms) as (_, _, memq_at, tansu_at):
        values = _values(n)
        _case(memq_at, TOPIC, values[:1000], 100, True)     # warm up: connections, metadata, coordinator
        tansu_error = ""
        try:
            _case(tansu_at, TOPIC, values[:1000], 100, True)
        except KafkaException as e:
            tansu_error = str(e)
            print(f"tansu refused transactions: {e}", flush=True)
        best: dict[tuple[str, int], Run] = {}
        cases = [("memq_txn", memq_at, True), ("memq_plain", memq_at, False)]
        if not tansu_error:
            cases.append(("tansu_txn", tansu_at, True))
        for _ in range(runs):   # interleaved, so drift on a shared machine hits every case alike
            for size in SIZES:
                for name, address, transactional in cases:
                    r = _case(address, TOPIC, values, size, transactional)
                    print(f"{name} {size}/txn: {r.msg_s:,.0f} msg/s, p99 {'commit' if transactional else 'flush'} "
                          f"{quantile(sorted(r.waits_s), 0.99):.3f} s", flush=True)
                    if (name, size) not in best or r.msg_s > best[name, size].msg_s:
                        best[name, size] = r
    figures: dict[str, object] = {}
    for (name, size), r in best.items():
        figures[f"{name}_{size}_msg_s"] = round(r.msg_s)
        figures[f"{name}_{size}_{'commit' if name.endswith('txn') else 'ack'}_p99_s"] = \
            round(quantile(sorted(r.waits_s), 0.99), 4)
    big = max(SIZES)
    commit_p99 = quantile(sorted(best["memq_txn", big].waits_s), 0.99)
    ack_p99 = quantile(sorted(best["memq_plain", big].waits_s), 0.99)
    ratios = {"txn_vs_plain": round(best["memq_txn", big].msg_s / best["memq_plain", big].msg_s, 3),
              "commit_vs_goal": round(2 * ack_p99 / commit_p99, 3)}
    if ("tansu_txn", big) in best:
        ratios["vs_kafka_txn"] = round(best["memq_txn", big].msg_s / best["tansu_txn", big].msg_s, 3)
    return {"ratios": ratios, "commit_p99_s": round(commit_p99, 4), "ack_p99_s": round(ack_p99, 4),
            **figures, **({"tansu_txn_error": tansu_error} if tansu_error else {}),
            "records": n, "value_bytes": VALUE_BYTES, "sizes": list(SIZES), "runs": runs, "batch_ms": batch_ms}
