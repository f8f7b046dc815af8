"""Many topics, few objects: a broker's objects, CPU, E2E latency and S3 request cost by topic count.

One governed broker (moto S3, tansu, ZooKeeper; production governor cycles), every topic with
batch_ms 250 in the cluster's one shared storage group, producers at ack=1, values that start
with their send time and go on with random bytes (incompressible). Cases, one after another:
- `trickle`: 1000 topics at 1 msg/s of 100 B each (sends spread evenly over each second);
- `hundred`: 100 topics at 100 msg/s of 1 KiB each (10,000 msg/s, ~10 MB/s in all);
- `one`: 1 topic at 10,000 msg/s of 1 KiB, the reference for `hundred`.
With `--before`, `trickle` and `hundred` run again with topics storing their own objects
(storage_group ""), memq's behaviour before storage groups.

Each case's feeder is one memq Producer (asyncio) in its own process; a consumer process reads a
few of the case's topics with memq's Consumer (a thread each; `hundred`: 3 groups each, so that
what extra groups cost is counted). Once the feeder has sent to every
topic and `warm` seconds more have passed, the steady window starts; over it (counters: from
before the warm-up to the window's end, at the same offered rate):
- `objects_per_s`: objects the broker stored (`memq_broker_group_objects`: one per PUT that
  succeeded, whatever the number of parts in it), and `puts_per_s`, the PUTs it sent;
- `broker_cpu_core_frac`: broker process CPU seconds (all threads, /proc) / wall seconds;
- `e2e_p99_s`: Consumer receipt minus send time of the sampled topics' messages sent in the window;
- `put_cost_per_gib_usd`: the broker's S3 PUTs per GiB produced at `CostConfig`'s (public S3
  Standard) prices; `put_cost_vs_kafka`: that over what 3-replica Kafka pays per GiB for
  cross-zone replication (`memq.cost.kafka_lines`: leader -> 2 followers in other zones, each GB
  charged $0.01 out and $0.01 in: $0.04/GiB). Both pay the producer's own zone crossing, so it
  is left out of both; consumers' per-part GETs are shown apart (`consumer_get_usd_month`: one GET
  per part per group, as memq's Consumer paid reading S3 directly);
- S3 GETs counted for reading (`reads`): the consumers' own GETs (each part they read from S3 is one
  ranged GET: `ConsumerMetrics.parts_via_s3`) and the broker's (`memq_broker_read_gets_total`: its read
  cache's misses), per part read by the sampled consumers, and per part per broker; priced for every
  topic read by the case's groups (`consumer_get_vs_put`: that GET cost over the broker's PUT cost;
  the issue's goal <= 0.5);
- `s3_usd_per_broker_month`: the PUTs per month (the floor of a trickle: per broker, not per GiB).
The offered rate is checked: a case whose feeder sent, or whose broker took (its LogMessages
counter), less than 95% of it, or with sends that failed (unacked 30 s after the window
counts), is flagged (`offered_reached` false, and a warning): its figures describe a saturated
broker or load generator. Short (`--quick`) windows make the broker's count noisy. Each case
also prints the broker's produce stages of one of its topics (`broker_stages`), so a slow E2E
shows where it goes; before the cases, `idle_cpu_core_frac` is the broker's CPU with every
topic hosted and no traffic. `--seconds N` sets the window (default 60 s, `--quick` 4 s);
`--cases hundred,one` runs only those (the ratios that need a case left out are not printed).
The peer of the notify stage (not in `--quick`): a confluent-kafka producer set like memq's
notification publisher sends one message to each of as many new topics as a trickle object has
parts, on the same Kafka; `kafka_fanout_s` is how long until all are delivered (ratio key
`kafka_fanout_vs_trickle_notify`: that over the trickle's mean notify stage).

Ratios (goal over measured, higher is better; >= 1 meets the issue's goal): objects/s of the
trickle against 1/batch_ms per group, broker CPU of the trickle against 10% of a core, `hundred`
CPU against 2x `one`'s, `hundred`'s E2E p99 against `one`'s, `put_cost_vs_kafka` against 0.1,
`hundred`'s counted GETs per part per broker against 1 and its consumers' GET cost against 0.5x the PUTs;
with `--before` also own over shared objects/s and CPU of `trickle` and `hundred`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import multiprocessing
import os
import struct
import threading
import time
import urllib.request
import uuid
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event

from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from bench._cluster import bench_cluster
from bench.e2e import quantile, stage_breakdown, stage_family
from bench.produce import cpu_s
from memq.client.consumer import Consumer, ConsumerMetrics
from memq.client.producer import Producer
from memq.config import DEFAULT_STORAGE_GROUP, CostConfig, GovernorConfig, MemqConfig, ProducerConfig, TopicConfig
from memq.cost import TopicCounters, Usage, estimate, kafka_lines
from memq.cost.model import GB, MONTH_S

BATCH_MS = 250
OFFERED_MIN = 0.95             # of the offered msg/s the broker must take, else the case is flagged
TICK_S = 0.02                  # feeder pacing: one round of sends per 20 ms
NOISE_BYTES = 16 * 1024 ** 2   # values are slices of this random buffer: unique within any batch
JOIN_TIMEOUT_S = 90.0          # the consumers' group assignments (tansu admits members late)
FEEDER_WAIT_S = 900.0          # a spawned feeder waits this long for its turn, then exits
FEEDER_BLOCK_S = 90.0          # longer than a send may wait for room (producer max_block_ms)
TAIL_S = 30.0                  # after its window, how long a feeder waits for its acks
DRAIN_TIMEOUT_S = 30.0         # after a case's last ack, for the consumers to receive the rest
_HEAD = struct.Struct("<d")    # send time, seconds since the epoch
_READ_FIELDS = ("batches", "parts_via_broker", "parts_via_s3", "broker_bytes", "broker_fallbacks", "broker_corrupt")
_READ_GETS = "memq_broker_read_gets_total "   # the broker's GETs for readers (no labels)
# The /metrics counters `_Scrape` sums into its fields (attempts: the PUTs only).
_COUNTERS = {"memq_broker_group_objects_total{": "objects", "memq_storage_attempts_total{": "puts",
             "memq_broker_batch_bytes_count{": "parts", "memq_broker_logmessages_total{": "records",
             "memq_broker_message_bytes_total{": "bytes_in"}


@dataclass(frozen=True)
class Case:
    name: str
    topics: int
    msg_s_per_topic: float
    value_bytes: int
    sampled: int               # topics the consumer process reads, for E2E latency
    groups: int = 1            # consumer groups reading each sampled topic (the first one's latencies count)
    own_objects: bool = False  # storage_group "": one object per topic (before storage groups)

    @property
    def topic_names(self) -> list[str]:
        return [f"{self.name}-{i:04d}" for i in range(self.topics)]

    @property
    def offered_msg_s(self) -> float:
        return self.topics * self.msg_s_per_topic

    def topic_configs(self) -> list[TopicConfig]:
        return [TopicConfig(n, read_partitions=1, batch_ms=BATCH_MS, storage_group=self.storage_group)
                for n in self.topic_names]

    @property
    def storage_group(self) -> str:
        return "" if self.own_objects else DEFAULT_STORAGE_GROUP


def all_cases(before: bool) -> list[Case]:
    # the trickle last: its ~1000 notifications/s are near what the dev Kafka (tansu) takes (one
    # request per partition from librdkafka), and the backlog it can leave there would slow the
    # notifications of whatever case came next; the trickle with its own objects after it (it
    # saturates the broker, ~1 PUT per message)
    shared = [Case("hundred", 100, 100.0, 1024, sampled=4, groups=3), Case("one", 1, 10_000.0, 1024, sampled=1),
              Case("trickle", 1000, 1.0, 100, sampled=20)]
    own = [Case(f"{c.name}-own", c.topics, c.msg_s_per_topic, c.value_bytes, c.sampled, c.groups, own_objects=True)
           for c in (shared[0], shared[2])]
    return shared + own if before else shared


def sent_to_first(sent: int, topics: int, first: int) -> int:
    """Messages among the first `sent` (sent round-robin over `topics`) that went to topics 0..first-1."""
    whole, rest = divmod(sent, topics)
    return whole * first + min(rest, first)


@dataclass(frozen=True)
class Prices:
    """A case's S3 request cost at `CostConfig` prices, from its measured rates."""

    put_usd_month: float            # the broker's PUTs
    put_usd_per_gib: float          # the same per GiB produced
    kafka_replication_usd_per_gib: float
    consumer_get_usd_month: float   # one (ranged) GET per part per consumer group, modelled (consumers reading S3)

    @property
    def put_vs_kafka(self) -> float:
        return self.put_usd_per_gib / self.kafka_replication_usd_per_gib


def prices(u: Usage, p: CostConfig) -> Prices:
    """Price the rates `u` (all topics of a case together) with `memq cost`'s model, consumers
    modelled as reading S3 themselves (what the counted reads are compared with)."""
    memq = estimate(u, 0.0, dataclasses.replace(p, consumer_read_path="s3")).memq
    put = memq.s3_put.usd
    gib_month = u.rates.bytes_in * MONTH_S / GB
    replication = kafka_lines(GB / MONTH_S, 0.0, p).replication.usd      # 1 GiB in per month
    return Prices(put, put / gib_month if gib_month else float("nan"), replication, memq.s3_get_consumers.usd)


# --- feeder process -------------------------------------------------------------------------

@dataclass(frozen=True)
class _Signals:
    """Between the bench and a feeder: its case's turn (`start`: feeders are spawned ahead, as
    starting a process takes seconds); every topic sent to once (`learned`); the bench has read
    the counters (`go`), so `warm` seconds later the window starts (`steady`) and ends (`done`)."""

    start: Event
    learned: Event
    go: Event
    steady: Event
    done: Event


async def _feed_async(url: str, topics: Sequence[str], msg_s_per_topic: float, value_bytes: int,
                      warm_s: float, measure_s: float, signals: _Signals) -> dict[str, float]:
    """Send round-robin over `topics` at the offered rate, through `signals`' phases, until the
    window has lasted `measure_s`. Returns sends, acks, send -> ack quantiles and failures."""
    noise = os.urandom(NOISE_BYTES)
    pad = value_bytes - _HEAD.size
    rate = msg_s_per_topic * len(topics)
    n = len(topics)
    counts = {"acked": 0, "failed": 0}
    first_error: list[BaseException] = []
    ack_s = array("d")          # send -> ack of the window's sends
    pending: set[asyncio.Future[list]] = set()

    def on_ack(stamp: float | None, fut: asyncio.Future[list]) -> None:
        pending.discard(fut)
        if fut.cancelled() or fut.exception() is not None:
            counts["failed"] += 1
            first_error[:] = first_error or [fut.exception() or RuntimeError("cancelled")]
            return
        counts["acked"] += sum(d.count for d in fut.result())
        if stamp is not None:
            ack_s.append(time.time() - stamp)

    sent = window_sent = 0
    window_s = lag_s = 0.0
    producer = Producer(ProducerConfig(brokers=url, ack="1", linger_ms=5))
    try:
        t0 = time.monotonic()
        window_t0 = float("inf")
        in_window = False
        while (now := time.monotonic()) < window_t0 + measure_s or not in_window:
            if sent >= n and not signals.learned.is_set():
                signals.learned.set()
            if window_t0 == float("inf") and signals.go.is_set():
                window_t0 = now + warm_s
            if not in_window and now >= window_t0:
                in_window, window_sent, window_t0 = True, sent, now
                signals.steady.set()
            due = int((now - t0) * rate) + 1 - sent
            if due > 0:
                wall = time.time()
                stamp = _HEAD.pack(wall)
                by_topic: dict[int, list[bytes]] = {}
                for i in range(sent, sent + due):
                    off = (i * pad) % (NOISE_BYTES - pad)
                    by_topic.setdefault(i % n, []).append(stamp + noise[off:off + pad])
                for k, values in by_topic.items():
                    fut = await producer.send_many(topics[k], values)
                    pending.add(fut)
                    fut.add_done_callback(functools.partial(on_ack, wall if in_window else None))
                sent += due
            lag_s = max(lag_s, time.monotonic() - now - TICK_S)
            await asyncio.sleep(max(0.0, TICK_S - (time.monotonic() - now)))
        window_s = time.monotonic() - window_t0
        window_sent = sent - window_sent
        signals.done.set()
        # acks before close: close flushes, and a flush asks brokers to seal the last Message's
        # batch of every topic, which in a shared group is one object per topic
        if pending:
            await asyncio.wait(list(pending), timeout=TAIL_S)
    finally:
        await producer.close(1.0)      # a saturated broker may not ack it all: what is left fails
        await asyncio.sleep(0)         # let the last futures' callbacks count them
    if first_error:
        print(f"  feeder: {counts['failed']} sends failed, first: {first_error[0]!r}", flush=True)
    acks = sorted(ack_s)
    return {"sent": sent, "window_sent": window_sent, "window_s": window_s, "max_round_lag_s": lag_s,
            "ack_p50_s": quantile(acks, 0.5), "ack_p99_s": quantile(acks, 0.99), **counts}


def _feed(url: str, topics: list[str], msg_s_per_topic: float, value_bytes: int, warm_s: float, measure_s: float,
          signals: _Signals, conn: Connection) -> None:
    if signals.start.wait(FEEDER_WAIT_S):
        conn.send(asyncio.run(_feed_async(url, topics, msg_s_per_topic, value_bytes, warm_s, measure_s, signals)))


@dataclass(frozen=True)
class _Feeder:
    process: BaseProcess
    signals: _Signals
    results: Connection


def _spawn_feeder(case: Case, url: str, warm_s: float, measure_s: float) -> _Feeder:
    ctx = multiprocessing.get_context("spawn")     # no fork of a process with threads and a loop
    signals = _Signals(ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event())
    ours, theirs = ctx.Pipe()
    process = ctx.Process(target=_feed, args=(url, case.topic_names, case.msg_s_per_topic, case.value_bytes, warm_s,
                                              measure_s, signals, theirs), name=f"feed-{case.name}", daemon=True)
    process.start()
    return _Feeder(process, signals, ours)


# --- consumer process -----------------------------------------------------------------------

def _consume(config: MemqConfig, topics: Mapping[str, int], ready: Event, conn: Connection) -> None:
    """Per topic, one Consumer (own group, own thread) for each of its groups; the first group's
    record (send time, latency) per record. Asked `(topics, expected)`, answers once that many
    records of those topics arrived (or after DRAIN_TIMEOUT_S) with their samples as array('d')
    bytes and the read counters of all their consumers so far (`ConsumerMetrics`: which way parts
    came), and forgets the samples; None stops it."""
    samples = {t: array("d") for t in topics}
    metrics: dict[str, list[ConsumerMetrics]] = {t: [] for t in topics}
    assigned: set[tuple[str, int]] = set()
    stop = threading.Event()

    def read(topic: str, group: int) -> None:
        out = samples[topic] if group == 0 else None
        with Consumer(config, topic, group_id=f"bench-mt-{uuid.uuid4().hex[:6]}",
                      on_assign=lambda _: assigned.add((topic, group))) as consumer:
            metrics[topic].append(consumer.metrics)
            while not stop.is_set():
                for record in consumer.poll(0.2):
                    if out is not None:
                        now = time.time()
                        sent = _HEAD.unpack_from(record.value)[0]
                        out.append(sent)
                        out.append(now - sent)

    threads = [threading.Thread(target=read, args=(t, g), name=f"consume-{t}-{g}", daemon=True)
               for t, groups in topics.items() for g in range(groups)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while len(assigned) < len(threads) and time.monotonic() < deadline:
        time.sleep(0.1)
    if len(assigned) == len(threads):
        ready.set()
    while (ask := conn.recv()) is not None:
        wanted, expected = ask
        give_up = time.monotonic() + DRAIN_TIMEOUT_S
        while sum(len(samples[t]) // 2 for t in wanted) < expected and time.monotonic() < give_up:
            time.sleep(0.05)
        time.sleep(1.0)   # the other groups read the same records by now (their counters below)
        read_by = [m for t in wanted for m in metrics[t]]
        conn.send((b"".join(samples[t].tobytes() for t in wanted),
                   {f: sum(getattr(m, f) for m in read_by) for f in _READ_FIELDS}))
        for t in wanted:
            samples[t] = array("d")
    stop.set()
    for th in threads:
        th.join(5)


# --- the bench (this process) ---------------------------------------------------------------

@dataclass(frozen=True)
class _Scrape:
    """The broker's cumulative counters at `taken_s`, summed over topics and groups."""

    taken_s: float
    objects: float          # objects stored (PUTs that succeeded)
    puts: float             # PUT requests sent, each try
    parts: float            # topics' batches stored (parts of those objects)
    records: float          # LogMessages taken into batches
    bytes_in: float
    stage_samples: tuple[Sample, ...]   # cumulative, of the stage series asked for (`stage_family`)
    page_bytes: int                     # of the whole /metrics page (every hosted topic's series)

    def stages_since(self, before: _Scrape) -> dict[str, dict[str, float]]:
        """`stage_breakdown` of what was observed between `before` and this scrape: a shared
        group's stages are the group's, and the cases before this one used the same group."""
        was = {(b.name, tuple(sorted(b.labels.items()))): b.value for b in before.stage_samples}
        return stage_breakdown(s._replace(value=s.value - was.get((s.name, tuple(sorted(s.labels.items()))), 0.0))
                               for s in self.stage_samples)

    def since(self, before: _Scrape, window: float) -> Usage:
        """What the broker did between `before` and this scrape, as `memq cost` counts it, over
        `window` seconds of traffic."""
        counts = TopicCounters(bytes_in=self.bytes_in - before.bytes_in, objects=self.parts - before.parts,
                               requests={"put": self.puts - before.puts, "get": 0.0, "list": 0.0, "delete": 0.0})
        return Usage("case", window, counts, counts.scaled(1 / window))


def _scrape(url: str, case: Case) -> _Scrape:
    """Read the counters, and the produce stages of `case`'s topics (its group's, or its first
    topic's when topics have objects of their own). Only these lines are parsed: a thousand
    topics' counters make /metrics ~2 MB."""
    asked = time.time()
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    taken = (asked + time.time()) / 2   # the counters are read somewhere in a rendering of ~1-2 s
    totals = dict.fromkeys(_COUNTERS.values(), 0.0)
    family, labels = stage_family(case.topic_configs()[0])
    wanted = "".join(f'{k}="{v}"' for k, v in labels.items())
    stage_lines = [f"# TYPE {family} histogram"]
    for line in text.splitlines():
        field = _COUNTERS.get(line[:line.find("{") + 1])
        if field is not None and (field != "puts" or 'op="put"' in line):
            totals[field] += float(line.rsplit(" ", 1)[1])
        elif line.startswith(family + "_") and wanted in line:
            stage_lines.append(line)
    samples = tuple(s for f in text_string_to_metric_families("\n".join(stage_lines) + "\n") for s in f.samples)
    return _Scrape(taken, totals["objects"], totals["puts"], totals["parts"], totals["records"], totals["bytes_in"],
                   samples, len(text))


def _read_gets(url: str) -> float:
    """The broker's S3 GETs for readers so far."""
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    return sum(float(line[len(_READ_GETS):]) for line in text.splitlines() if line.startswith(_READ_GETS))


def read_costs(read: Mapping[str, float], broker_gets: float, groups: int, parts_per_s: float,
               put_usd_month: float, p: CostConfig) -> dict[str, float]:
    """The S3 GETs the sampled consumers and the broker counted while they read, per part; and
    their cost for every topic read by `groups` groups (`parts_per_s` of all topics), over the PUTs'."""
    part_reads = max(read["batches"], 1.0)
    per_read = (read["parts_via_s3"] + broker_gets) / part_reads
    get_usd = per_read * groups * parts_per_s * MONTH_S * p.s3_get_per_1000 / 1000
    return {"part_reads": read["batches"], "via_broker": read["parts_via_broker"], "via_s3": read["parts_via_s3"],
            "fallbacks": read["broker_fallbacks"], "broker_gets": broker_gets,
            "gets_per_part_per_broker": round(broker_gets / (part_reads / groups), 4),
            "s3_gets_per_part_read": round(per_read, 4), "groups": groups,
            "consumer_get_usd_month": round(get_usd, 2),
            "consumer_get_vs_put": round(get_usd / put_usd_month, 4) if put_usd_month else float("nan")}


def _run_case(case: Case, feeder: _Feeder, url: str, pid: int, consumer: Connection, consumers_ready: Event,
              warm_s: float, measure_s: float, p: CostConfig) -> dict:
    names, signals = case.topic_names, feeder.signals
    gets0 = _read_gets(url)
    signals.start.set()
    # Rendering /metrics blocks the broker about a second with a thousand topics, so the counters
    # are read before the warm-up ends (s0) and after the consumers got the window's records (s1):
    # neither scrape delays a measured record, and the window's CPU excludes both.
    try:
        if not signals.learned.wait(60):
            raise RuntimeError(f"case {case.name}: the feeder did not send to every topic within 60 s")
        if not consumers_ready.wait(JOIN_TIMEOUT_S):
            raise RuntimeError(f"the consumers were not all assigned within {JOIN_TIMEOUT_S:.0f} s")
        s0 = _scrape(url, case)
        signals.go.set()
        if not signals.steady.wait(warm_s + 60):
            raise RuntimeError(f"case {case.name}: the feeder's window did not start")
        cpu0, t0, wall0 = cpu_s(pid), time.monotonic(), time.time()
        if not signals.done.wait(measure_s + FEEDER_BLOCK_S):
            raise RuntimeError(f"case {case.name}: the feeder did not finish its window")
        cpu1, t1, wall1 = cpu_s(pid), time.monotonic(), time.time()
        if not feeder.results.poll(120):
            raise RuntimeError(f"case {case.name}: the feeder sent no result")
        fed = feeder.results.recv()
        feeder.process.join(10)
    finally:
        if feeder.process.is_alive():
            feeder.process.terminate()
            feeder.process.join(5)
    consumer.send((names[:case.sampled], sent_to_first(fed["sent"], case.topics, case.sampled)))
    got, read = consumer.recv()
    raw = array("d", got)
    latencies = sorted(lat for sent, lat in zip(raw[::2], raw[1::2]) if wall0 <= sent <= wall1)
    s1 = _scrape(url, case)
    broker_gets = _read_gets(url) - gets0
    stages = s1.stages_since(s0)
    window = wall1 - s0.taken_s      # the counters' traffic: every record sent by then is counted (acked)
    taken_msg_s = (s1.records - s0.records) / window
    feeder_msg_s = fed["window_sent"] / fed["window_s"]
    reached = min(taken_msg_s, feeder_msg_s) >= OFFERED_MIN * case.offered_msg_s and not fed["failed"]
    cost = prices(s1.since(s0, window), p)
    reads = read_costs(read, broker_gets, case.groups, (s1.parts - s0.parts) / window, cost.put_usd_month, p)
    out = {"topics": case.topics, "value_bytes": case.value_bytes, "storage_group": case.storage_group,
           "offered_msg_s": case.offered_msg_s, "achieved_msg_s": round(taken_msg_s, 1),
           "feeder_msg_s": round(feeder_msg_s, 1), "offered_reached": reached,
           "objects_per_s": round((s1.objects - s0.objects) / window, 2),
           "puts_per_s": round((s1.puts - s0.puts) / window, 2),
           "broker_cpu_core_frac": round((cpu1 - cpu0) / (t1 - t0), 3),
           "e2e_p50_s": round(quantile(latencies, 0.5), 3), "e2e_p99_s": round(quantile(latencies, 0.99), 3),
           "e2e_samples": len(latencies), "send_to_ack_p50_s": round(fed["ack_p50_s"], 3),
           "send_to_ack_p99_s": round(fed["ack_p99_s"], 3),
           "put_cost_per_gib_usd": round(cost.put_usd_per_gib, 5), "put_cost_vs_kafka": round(cost.put_vs_kafka, 3),
           "s3_usd_per_broker_month": round(cost.put_usd_month, 2),
           "consumer_get_usd_month": round(cost.consumer_get_usd_month, 2), "reads": reads,
           "broker_stages": stages, "metrics_page_bytes": s1.page_bytes, "window_s": round(window, 1), "sends_failed": fed["failed"], "feeder_max_round_lag_s": round(fed["max_round_lag_s"], 3)}
    print(f"{case.name}: {case.topics} topics, {case.offered_msg_s:,.0f} msg/s offered, {feeder_msg_s:,.0f} sent, "
          f"{taken_msg_s:,.0f} taken by the broker, {fed['failed']} failed"
          f"{'' if reached else ' (FLAGGED: under 95% or failures, a saturated broker or feeder)'}; "
          f"{out['objects_per_s']} objects/s "
          f"({out['puts_per_s']} PUTs/s); broker CPU {out['broker_cpu_core_frac']:.0%} of a core; "
          f"e2e p50 {out['e2e_p50_s']}s p99 {out['e2e_p99_s']}s ({len(latencies)} samples; send->ack p99 "
          f"{out['send_to_ack_p99_s']}s); "
          f"PUTs ${out['put_cost_per_gib_usd']}/GiB = {out['put_cost_vs_kafka']}x Kafka's replication, "
          f"${out['s3_usd_per_broker_month']}/broker-month (consumers' GETs ${out['consumer_get_usd_month']}/month); "
          f"/metrics {s1.page_bytes / 1e6:.1f} MB", flush=True)
    print(f"  reads ({case.groups} group(s) of {case.sampled} topics): {reads['part_reads']:.0f} parts read, "
          f"{reads['via_broker']:.0f} through the broker, {reads['via_s3']:.0f} from S3 ({reads['fallbacks']:.0f} "
          f"fallen back); S3 GETs counted: {reads['s3_gets_per_part_read']} per part read, "
          f"{reads['gets_per_part_per_broker']} per part per broker; all topics read so: "
          f"${reads['consumer_get_usd_month']}/month = {reads['consumer_get_vs_put']}x the PUTs", flush=True)
    family, labels = stage_family(case.topic_configs()[0])
    whose = f"storage group {labels['group']}" if "group" in labels else names[0]
    print(f"  {whose} at the broker, this case's window: " + "; ".join(
        f"{stage} mean {st['mean_s']:.3f}s p99 <= {st['p99_le_s']}s" for stage, st in stages.items()), flush=True)
    return out


def kafka_fanout_s(bootstrap: str, topics: int) -> float:
    """The peer of the notify stage: seconds until one message to each of `topics` new topics
    (3 partitions, keyed) is delivered, from a producer set like memq's notification publisher
    (acks=all, idempotent, linger 2 ms), after a warm-up round."""
    names = [f"bench-fanout-{uuid.uuid4().hex[:6]}-{i}" for i in range(topics)]
    admin = AdminClient({"bootstrap.servers": bootstrap})   # kept: its futures fail once it is collected
    for future in admin.create_topics([NewTopic(n, num_partitions=3, replication_factor=1) for n in names]).values():
        future.result(60)
    p = KafkaProducer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 2})
    best = float("inf")
    for _ in range(3):            # the first is the warm-up (metadata, connections)
        t0 = time.perf_counter()
        for n in names:
            p.produce(n, os.urandom(300), key=os.urandom(8))
        if p.flush(60):
            raise RuntimeError(f"Kafka did not take {topics} messages within 60 s")
        best = min(best, time.perf_counter() - t0)
    return best


def case_ratios(out: Mapping[str, Mapping[str, Any]], fanout_s: float | None) -> dict[str, float]:
    """The goals' ratios (higher is better) for the cases that ran: each needs its cases."""
    ratios: dict[str, float] = {}
    trickle, hundred, one = out.get("trickle"), out.get("hundred"), out.get("one")
    if trickle is not None:
        ratios["trickle_objects_per_s_vs_goal"] = round(1000 / BATCH_MS / max(trickle["objects_per_s"], 1e-9), 3)
        ratios["trickle_cpu_vs_goal"] = round(0.10 / trickle["broker_cpu_core_frac"], 3)
        if fanout_s is not None:
            ratios["kafka_fanout_vs_trickle_notify"] = round(
                fanout_s / max(trickle["broker_stages"]["notify"]["mean_s"], 1e-9), 3)
    if hundred is not None:
        ratios["hundred_put_cost_vs_kafka_vs_goal"] = round(0.1 / hundred["put_cost_vs_kafka"], 3)
        reads = hundred["reads"]   # goals: <= 1 GET per part per broker, consumers' GETs <= 0.5x the PUTs
        ratios["hundred_gets_per_part_per_broker_vs_goal"] = round(1.0 / max(reads["gets_per_part_per_broker"], 1e-3), 3)
        ratios["hundred_consumer_get_vs_put_vs_goal"] = round(0.5 / max(reads["consumer_get_vs_put"], 1e-3), 3)
        if one is not None:
            ratios["hundred_cpu_vs_2x_one"] = round(2 * one["broker_cpu_core_frac"] / hundred["broker_cpu_core_frac"], 3)
            ratios["hundred_e2e_p99_vs_one"] = round(one["e2e_p99_s"] / hundred["e2e_p99_s"], 3)
    for name in ("trickle", "hundred"):
        if f"{name}-own" in out and name in out:     # --before: what the shared group saves (own over shared)
            own, shared = out[f"{name}-own"], out[name]
            ratios[f"{name}_objects_own_vs_shared"] = round(own["objects_per_s"] / shared["objects_per_s"], 1)
            ratios[f"{name}_cpu_own_vs_shared"] = round(own["broker_cpu_core_frac"] / shared["broker_cpu_core_frac"], 2)
    return ratios


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--before", action="store_true",
                        help="also run trickle and hundred with topics storing their own objects (storage_group \"\")")
    parser.add_argument("--seconds", type=float, default=None,
                        help="each case's measured window (default 60, --quick 4)")
    parser.add_argument("--read-path", choices=("auto", "broker", "s3"), default="auto",
                        help="the consumers' consumer.read_path (default auto; s3: every part GET by each group)")
    parser.add_argument("--cases", default=None,
                        help="comma-separated cases to run (default all), e.g. hundred,one; the "
                             "ratios need trickle, hundred and one")


def run(quick: bool, before: bool = False, seconds: float | None = None, cases: str | None = None,
        read_path: Literal["auto", "broker", "s3"] = "auto") -> dict:
    warm_s, measure_s, idle_s = (2.0, 4.0, 1.0) if quick else (5.0, 60.0, 10.0)
    measure_s = seconds or measure_s
    chosen = all_cases(before)
    if cases is not None:
        wanted = [c.strip() for c in cases.split(",") if c.strip()]
        unknown = sorted(set(wanted) - {c.name for c in chosen})
        if unknown or not wanted:
            raise SystemExit(f"--cases {cases!r}: choose among {', '.join(c.name for c in chosen)}")
        chosen = [c for c in chosen if c.name in wanted]
    p = CostConfig()
    ctx = multiprocessing.get_context("spawn")     # no fork of a process with threads and a loop
    t_start = time.monotonic()
    with bench_cluster([t for c in chosen for t in c.topic_configs()], governor=GovernorConfig()) as bc:
        url, pid = bc.broker.url, bc.broker.pid
        print(f"broker at {url}: {sum(c.topics for c in chosen)} topics hosted after "
              f"{time.monotonic() - t_start:.1f} s; batch_ms {BATCH_MS}, ack=1; warm {warm_s:.0f} s, "
              f"window {measure_s:.0f} s per case", flush=True)
        ready = ctx.Event()
        ours, theirs = ctx.Pipe()
        sampled = {n: c.groups for c in chosen for n in c.topic_names[:c.sampled]}
        readers = dataclasses.replace(bc.config, consumer=dataclasses.replace(bc.config.consumer, read_path=read_path))
        reader = ctx.Process(target=_consume, args=(readers, sampled, ready, theirs), name="mt-consumers", daemon=True)
        reader.start()
        feeders = {c.name: _spawn_feeder(c, url, warm_s, measure_s) for c in chosen}
        try:
            cpu0 = cpu_s(pid)
            time.sleep(idle_s)
            idle = (cpu_s(pid) - cpu0) / idle_s
            print(f"idle: broker CPU {idle:.0%} of a core with every topic hosted (consumers joining)", flush=True)
            out = {c.name: _run_case(c, feeders[c.name], url, pid, ours, ready, warm_s, measure_s, p) for c in chosen}
            ours.send(None)
            reader.join(10)
            trickle = out.get("trickle")
            fanout_s = None
            if trickle is not None and not quick:
                parts = round(trickle["feeder_msg_s"] / max(trickle["objects_per_s"], 1e-9))   # ~ parts per object
                fanout_s = kafka_fanout_s(bc.config.kafka.bootstrap_servers, min(parts, 1000))
                notify_s = trickle["broker_stages"]["notify"]["mean_s"]
                print(f"peer: one message to each of {min(parts, 1000)} Kafka topics (a trickle object's parts, "
                      f"each a notification) delivered in {fanout_s:.3f} s on the same Kafka; the trickle's notify "
                      f"stage: mean {notify_s:.3f} s", flush=True)
        finally:
            for proc in (reader, *(f.process for f in feeders.values())):
                if proc.is_alive():
                    proc.terminate()
                    proc.join(5)
    ratios = case_ratios(out, fanout_s)
    flagged = [name for name, case in out.items() if not case["offered_reached"]]
    if flagged:
        print(f"WARNING: offered rate not reached in {', '.join(flagged)}: those figures are of a saturated run",
              flush=True)
    return {"ratios": ratios, **out, "idle_cpu_core_frac": round(idle, 3), "kafka_fanout_s": fanout_s, "batch_ms": BATCH_MS, "ack": "1",
            "warm_s": warm_s, "window_s": measure_s, "read_path": read_path, "below_offered": flagged,
            "total_s": round(time.monotonic() - t_start, 1)}
