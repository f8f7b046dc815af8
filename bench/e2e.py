"""End-to-end latency: producer send -> consumer receipt, at a steady 10 MB/s with ack=all.

One dev cluster (moto S3, tansu), one broker process, one topic with `batch_ms=250`. The
producer paces 1 KiB values at 10 MB/s (MB = 2^20 bytes, as in the other benches) for 30 s
(15 s with `--quick`); every value starts with its send time (wall clock, taken just before
the `send_many` call, so time spent waiting for admission counts) and its sequence number.
A consumer in its own process reads the topic concurrently and records, for every message,
receipt time minus send time; the run fails unless every acked message is received.

Why a process and not a thread: the Consumer decodes a whole batch (~2.5 MB here) at once,
holding the GIL. In a thread that would stall the producer's event loop, so sends would be
stamped late (hiding latency) and the pacing would slip; on 2 cores a separate process lets
the kernel run both, as two applications would. Both sides use the same host clock.

Ratios: target p99 0.50 s and WarpStream's published ~0.9 s p99 (S3 Standard) over memq's p99.
The broker's per-stage histograms (queue wait, batch fill, upload, notify, ack) are read at the
end, and the producer's send -> ack latency is measured too, so a miss shows where time goes.

`--s3-tail`: three runs, each on a fresh cluster whose S3 clients (broker and consumer) go
through memq.chaos.s3faults' proxy on 127.0.0.1: clean, then with 2% of S3 requests held 500 ms
(the chaos `tail` fault) with hedged requests on, then the same tail with hedging off
(`s3.hedge_max_share = 0`, as the dev cluster has it). Ratios: clean p99 over each tail run's p99.
Each run first sends for 20 s at the same rate, not measured: a client hedges a kind of request
only once it knows 50 latencies of it (`memq.storage.hedge`), and a long-running broker does.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import multiprocessing
import os
import struct
import time
import uuid
from array import array
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path

from prometheus_client.samples import Sample

from bench._cluster import bench_cluster, broker_samples
from memq.chaos.nemesis import HTTP_FAULTS
from memq.chaos.s3faults import S3Faults, local_fault_proxy
from memq.client.consumer import Consumer
from memq.client.producer import Delivery, Producer
from memq.config import MemqConfig, ProducerConfig, S3Config, TopicConfig

MiB = 1024 ** 2
RATE_BYTES_S = 10 * MiB
VALUE_BYTES = 1024
BATCH_MS = 250
TICK_S = 0.01                  # pacing granularity: one send_many per 10 ms
TARGET_P99_S = 0.50
WARPSTREAM_P99_S = 0.9
JOIN_TIMEOUT_S = 60.0          # consumer group assignment, warm-up round trip
DRAIN_TIMEOUT_S = 30.0         # after the last ack, for the consumer to receive the rest
_HEAD = struct.Struct("<dq")   # send time (s since epoch), sequence (-1: warm-up)
TAIL = HTTP_FAULTS["tail"]     # 2% of S3 requests held 500 ms
HEDGED = S3Config().hedge_max_share
TAIL_WARM_UP_S = 20.0          # hedging starts once HEDGE_MIN_SAMPLES latencies of a kind are known
TAIL_CASES = (("clean", S3Faults(), HEDGED), ("tail_hedged", TAIL, HEDGED), ("tail_unhedged", TAIL, 0.0))
"""(name, faults, s3.hedge_max_share) of each `--s3-tail` run, in the order they run."""


def quantile(sorted_values: list[float] | array, q: float) -> float:
    """Nearest-rank quantile of already sorted values."""
    if not sorted_values:
        return math.nan
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


# --- consumer process -------------------------------------------------------------------------

def _consume(config: MemqConfig, topic: str, assigned: Event, warm: Event, conn: Connection) -> None:
    """Read `topic` until told how many messages to expect (then all arrived, or a timeout);
    send back (latencies as array('d') bytes, duplicates, missing sequence numbers)."""
    latencies = array("d")
    seen = bytearray()
    duplicates = 0
    window: list[float] = []
    cumulative: list[float] = []
    expected: int | None = None
    give_up = math.inf
    t_start = last_report = time.monotonic()
    with Consumer(config, topic, group_id=f"bench-e2e-{uuid.uuid4().hex[:6]}",
                  on_assign=lambda _: assigned.set()) as consumer:
        while expected is None or (len(latencies) < expected and time.monotonic() < give_up):
            for record in consumer.poll(0.05):
                now = time.time()
                sent, seq = _HEAD.unpack_from(record.value)
                if seq < 0:
                    warm.set()
                    continue
                if seq >= len(seen):
                    seen.extend(bytes(seq + 1 - len(seen) + 65536))
                if seen[seq]:
                    duplicates += 1
                    continue
                seen[seq] = 1
                latencies.append(now - sent)
                window.append(now - sent)
            mono = time.monotonic()
            if mono - last_report >= 1.0:
                window.sort()
                cumulative.extend(window)
                cumulative.sort()               # two sorted runs: a linear merge
                p99s = (f" p99 last 1 s {quantile(window, 0.99):.3f}s running p99 {quantile(cumulative, 0.99):.3f}s"
                        if window else "")
                print(f"  consumer t={mono - t_start:5.1f}s received {len(latencies):>8,} "
                      f"({len(window) * VALUE_BYTES / MiB / (mono - last_report):5.2f} MB/s){p99s}", flush=True)
                window.clear()
                last_report = mono
            if expected is None and conn.poll():
                expected = conn.recv()
                give_up = time.monotonic() + DRAIN_TIMEOUT_S
    missing = [i for i in range(expected) if i >= len(seen) or not seen[i]]
    conn.send((latencies.tobytes(), duplicates, missing))


# --- producer (this process) --------------------------------------------------------------------

async def _warm_up(producer: Producer, topic: str, seconds: float, pads: list[bytes]) -> None:
    """Send at RATE_BYTES_S for `seconds` values the consumer skips (sequence -1), all acked."""
    per_s = RATE_BYTES_S / VALUE_BYTES
    futures: list[asyncio.Future[list[Delivery]]] = []
    sent = 0
    t0 = time.monotonic()
    while (elapsed := time.monotonic() - t0) < seconds:
        due = int(elapsed * per_s) + 1 - sent
        if due > 0:
            head = _HEAD.pack(time.time(), -1)
            futures.append(await producer.send_many(topic, [head + pads[i & 255] for i in range(due)]))
            sent += due
        await asyncio.sleep(max(0.0, TICK_S - (time.monotonic() - t0 - elapsed)))
    await asyncio.gather(*futures)


async def _produce(url: str, topic: str, duration_s: float, warm: Event, warm_up_s: float = 0.0) -> dict:
    """Pace values at RATE_BYTES_S for `duration_s` (after `warm_up_s` of values not measured);
    returns counts, rate and send -> ack latencies."""
    pad_pool = [os.urandom(VALUE_BYTES // 2).hex().encode()[:VALUE_BYTES - _HEAD.size] for _ in range(256)]
    per_s = RATE_BYTES_S / VALUE_BYTES
    ack_latencies: list[float] = []
    sent = 0
    async with Producer(ProducerConfig(brokers=url, ack="all", linger_ms=5)) as producer:
        await (await producer.send(topic, _HEAD.pack(time.time(), -1) + pad_pool[0]))
        if not await asyncio.to_thread(warm.wait, JOIN_TIMEOUT_S):
            raise RuntimeError(f"the consumer did not receive the warm-up message within {JOIN_TIMEOUT_S} s")
        if warm_up_s:
            print(f"warm-up: {warm_up_s:.0f} s at the same rate, not measured", flush=True)
            await _warm_up(producer, topic, warm_up_s, pad_pool)

        def on_ack(stamp: float, future: asyncio.Future[list[Delivery]]) -> None:
            if not future.exception():
                ack_latencies.append(time.time() - stamp)

        futures: list[asyncio.Future[list[Delivery]]] = []
        t0 = last_report = time.monotonic()
        reported = 0
        while (elapsed := time.monotonic() - t0) < duration_s:
            due = int(elapsed * per_s) + 1 - sent
            if due > 0:
                stamp = time.time()
                head = _HEAD.pack
                values = [head(stamp, seq) + pad_pool[seq & 255] for seq in range(sent, sent + due)]
                future = await producer.send_many(topic, values)
                future.add_done_callback(lambda f, s=stamp: on_ack(s, f))
                futures.append(future)
                sent += due
            now = time.monotonic()
            if now - last_report >= 1.0:
                print(f"producer t={now - t0:5.1f}s sent {sent:>8,} "
                      f"({(sent - reported) * VALUE_BYTES / MiB / (now - last_report):5.2f} MB/s)", flush=True)
                last_report, reported = now, sent
            await asyncio.sleep(max(0.0, TICK_S - (time.monotonic() - t0 - elapsed)))
        send_s = time.monotonic() - t0
        await producer.flush()
        results = await asyncio.gather(*futures, return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(futures)} sends failed, first: {failures[0]!r}")
    acked = sum(d.count for r in results for d in r)
    if acked != sent:
        raise RuntimeError(f"{acked} of {sent} messages acked")
    ack_latencies.sort()
    return {"sent": sent, "send_s": send_s, "ack_p50_s": quantile(ack_latencies, 0.5),
            "ack_p99_s": quantile(ack_latencies, 0.99)}


# --- broker stage breakdown --------------------------------------------------------------------

def stage_family(topic: TopicConfig) -> tuple[str, dict[str, str]]:
    """The histogram family holding `topic`'s produce stages and the labels selecting it: its
    own (objects of its own) or its shared storage group's (`memq.broker.metrics`)."""
    if topic.storage_group:
        return "memq_broker_group_stage_seconds", {"group": topic.storage_group}
    return "memq_broker_stage_seconds", {"topic": topic.name}


def stage_breakdown(samples: Iterable[Sample], **labels: str) -> dict[str, dict[str, float]]:
    """Per stage of the series with these `labels`: count, mean, and p50/p99 as the upper bound
    of the histogram bucket holding them, from a stage family's samples (`broker_samples`)."""
    buckets: dict[str, list[tuple[float, float]]] = {}
    totals: dict[str, dict[str, float]] = {}
    for s in samples:
        if any(s.labels.get(k) != v for k, v in labels.items()):
            continue
        stage = s.labels["stage"]
        if s.name.endswith("_bucket"):
            buckets.setdefault(stage, []).append((float(s.labels["le"]), s.value))
        else:
            totals.setdefault(stage, {})[s.name.rsplit("_", 1)[1]] = s.value
    out: dict[str, dict[str, float]] = {}
    for stage, t in totals.items():
        count = t.get("count", 0.0)
        if not count:
            continue
        cum = sorted(buckets[stage])

        def upper(q: float) -> float:
            return next(le for le, c in cum if c >= q * count)

        out[stage] = {"count": int(count), "mean_s": round(t["sum"] / count, 4),
                      "p50_le_s": upper(0.5), "p99_le_s": upper(0.99)}
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--s3-tail", action="store_true",
                        help=f"run clean, with {TAIL.tail_share:.0%} of S3 requests held {TAIL.tail_delay_s} s "
                             "(hedging on), and with that tail and hedging off")


def run(quick: bool, s3_tail: bool = False) -> dict:
    if not s3_tail:
        return _measure(quick)
    cases = {}
    for name, faults, hedge_share in TAIL_CASES:
        print(f"--- {name}: tail share {faults.tail_share}, s3.hedge_max_share {hedge_share}", flush=True)
        cases[name] = _measure(quick, partial(_s3_link, faults, hedge_share), warm_up_s=TAIL_WARM_UP_S)
    clean = cases["clean"]["p99_s"]
    return {
        "ratios": {"tail_p99_vs_clean": round(clean / cases["tail_hedged"]["p99_s"], 3),
                   "unhedged_tail_p99_vs_clean": round(clean / cases["tail_unhedged"]["p99_s"], 3)},
        **{f"{name}_p99_s": c["p99_s"] for name, c in cases.items()},
        "tail_share": TAIL.tail_share, "tail_delay_s": TAIL.tail_delay_s, "hedge_max_share": HEDGED,
        "cases": cases,
    }


@contextmanager
def _s3_link(faults: S3Faults, hedge_share: float, s3: S3Config, work: Path) -> Iterator[S3Config]:
    """S3 through a fault proxy with `faults`, hedging up to `hedge_share` of requests."""
    if not s3.endpoint_url:
        raise RuntimeError("bench e2e --s3-tail needs the dev cluster's local S3")
    with local_fault_proxy(s3.endpoint_url, work, faults) as proxy:
        yield dataclasses.replace(s3, endpoint_url=proxy.url, hedge_max_share=hedge_share)


def _hedges(url: str) -> dict[str, int]:
    """The broker's hedged requests by outcome (sent, won), all ops summed."""
    out: dict[str, int] = {}
    for s in broker_samples(url, "memq_storage_hedges"):
        if s.name.endswith("_total"):
            out[s.labels["outcome"]] = out.get(s.labels["outcome"], 0) + int(s.value)
    return out


def _measure(quick: bool, s3_link: Callable[[S3Config, Path], AbstractContextManager[S3Config]] | None = None,
             warm_up_s: float = 0.0) -> dict:
    duration_s = 15.0 if quick else 30.0
    topic = TopicConfig(f"bench-e2e-{uuid.uuid4().hex[:6]}", batch_ms=BATCH_MS)
    ctx = multiprocessing.get_context("spawn")     # no fork of a process with threads and a loop
    with bench_cluster([topic], s3_link=s3_link) as bc:
        print(f"broker at {bc.broker.url}; {RATE_BYTES_S // MiB} MB/s of {VALUE_BYTES} B values for "
              f"{duration_s:.0f} s, batch_ms={BATCH_MS}, ack=all", flush=True)
        assigned, warm = ctx.Event(), ctx.Event()
        ours, theirs = ctx.Pipe()
        reader = ctx.Process(target=_consume, args=(bc.config, topic.name, assigned, warm, theirs),
                             name="e2e-consumer", daemon=True)
        reader.start()
        try:
            if not assigned.wait(JOIN_TIMEOUT_S):
                raise RuntimeError(f"the consumer got no assignment within {JOIN_TIMEOUT_S} s")
            produced = asyncio.run(_produce(bc.broker.url, topic.name, duration_s, warm, warm_up_s))
            ours.send(produced["sent"])
            if not ours.poll(DRAIN_TIMEOUT_S + 30):
                raise RuntimeError("the consumer process sent no result")
            raw, duplicates, missing = ours.recv()
            reader.join(10)
            family, labels = stage_family(topic)
            stages = stage_breakdown(broker_samples(bc.broker.url, family), **labels)
            hedges = _hedges(bc.broker.url)
        finally:
            if reader.is_alive():
                reader.terminate()
                reader.join(5)
    latencies = sorted(array("d", raw))
    sent = produced["sent"]
    if missing:
        raise RuntimeError(f"consumer received {len(latencies):,} of {sent:,} acked messages; "
                           f"{len(missing):,} missing, first sequence numbers {missing[:10]}")
    p50, p99, worst = quantile(latencies, 0.5), quantile(latencies, 0.99), latencies[-1]
    mbps = sent * VALUE_BYTES / MiB / produced["send_s"]
    print(f"received {len(latencies):,} of {sent:,} ({duplicates} duplicates); achieved {mbps:.2f} MB/s; "
          f"e2e p50 {p50:.3f}s p99 {p99:.3f}s max {worst:.3f}s; "
          f"send->ack p50 {produced['ack_p50_s']:.3f}s p99 {produced['ack_p99_s']:.3f}s", flush=True)
    for stage, s in stages.items():
        print(f"  broker {stage:<10} n={s['count']:>8,} mean {s['mean_s']:.4f}s "
              f"p50 <= {s['p50_le_s']}s p99 <= {s['p99_le_s']}s", flush=True)
    print(f"  broker hedged S3 requests: {hedges or 'none'}", flush=True)
    return {
        "ratios": {"p99_vs_target": round(TARGET_P99_S / p99, 3),
                   "p99_vs_warpstream": round(WARPSTREAM_P99_S / p99, 3)},
        "p50_s": round(p50, 4), "p99_s": round(p99, 4), "max_s": round(worst, 4),
        "messages": sent, "received": len(latencies), "duplicates": duplicates,
        "mb_per_s_target": RATE_BYTES_S / MiB, "mb_per_s_achieved": round(mbps, 2),
        "duration_s": round(produced["send_s"], 1), "value_bytes": VALUE_BYTES, "batch_ms": BATCH_MS,
        "ack": "all", "send_to_ack_p50_s": round(produced["ack_p50_s"], 4),
        "send_to_ack_p99_s": round(produced["ack_p99_s"], 4),
        "broker_stages": stages, "broker_hedges": hedges,
    }
