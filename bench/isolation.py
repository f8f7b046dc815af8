"""Tenant isolation by produce quotas: a noisy tenant offered 10x its quota, and a well-behaved one.

One dev cluster (moto S3, tansu, ZooKeeper) and one broker process with security on (tenants
`quiet`, `noisy` and `unlimited`, each with its own token and topic) and a produce quota of
QUOTA bytes/s for every principal (`[quota] principal_byte_rate`). The quiet tenant, in this
process, sends 1 KiB values paced at half its quota (ack=all, one `send_many` per 20 ms) and
records each call's send -> ack latency. The noisy tenant, in its own process (as another
application would be, and so its client work does not stall the quiet one's event loop),
tries to send 8 KiB values (uncompressed) at 10x its quota; its producer's buffer fills and waits.

Rounds of three phases of equal length, in this order: the quiet tenant alone (`solo`), beside
the noisy tenant, and beside the control `unlimited`, the same noisy client exempt from the
quota (`[quota] principals = ["unlimited=0"]`). After each shared phase the noisy producer
drains its backlog before the next phase starts, so every phase sees only its own traffic.
Figures:
- `noisy_rate_vs_quota`: the noisy topic's Message bytes accepted by the broker during its
  phases (its counter, scraped at the phase edges) over QUOTA x their length; goal 0.9-1.1.
- `quiet_p99_vs_solo`: the quiet tenant's p99 send -> ack latency beside the noisy tenant over its
  p99 alone, same run; goal <= 1.2 (lower is better, as the issue names it).
- the control's rate and `quiet_p99_vs_solo_without_quota`: what the quota protects against.
Throttle time as the noisy producer saw it in its acks and as the broker counted it is reported
too; the quiet tenant, under its quota, should have none.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
import time
import uuid
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from bench._cluster import bench_cluster, broker_samples
from bench.e2e import quantile
from memq.client.producer import Delivery, Producer
from memq.config import ProducerConfig, QuotaConfig, SecurityConfig, TopicConfig
from memq.security.tokens import new_token

MiB = 1024 ** 2
QUOTA = 2 * MiB                   # bytes/s, every principal
BURST_S = 0.2
OFFER = 10                        # the noisy tenant tries to send this many times its quota
QUIET_RATE = QUOTA // 2
QUIET_VALUE, NOISY_VALUE = 1024, 8 * 1024
QUIET_TICK_S, NOISY_TICK_S = 0.02, 0.01
BATCH_MS = 100
REPLY_TIMEOUT_S = 60.0


def _pool(size: int) -> list[bytes]:
    return [os.urandom(size // 2).hex().encode()[:size] for _ in range(64)]


# --- the noisy tenant (its own process) ---------------------------------------------------------

def _noisy(url: str, token: str, topic: str, conn: Connection) -> None:
    """Serve `("run", seconds)` requests until `("stop",)`: offer OFFER x QUOTA for that long, drain,
    answer with the producer's throttle metrics so far."""
    asyncio.run(_noisy_main(url, token, topic, conn))


async def _noisy_main(url: str, token: str, topic: str, conn: Connection) -> None:
    pool = _pool(NOISY_VALUE)
    per_tick = max(1, round(OFFER * QUOTA * NOISY_TICK_S / NOISY_VALUE))
    # in flight at most 2 s of quota, far below request_timeout_ms: throttled Messages are acked in time
    config = ProducerConfig(brokers=url, token=token, ack="all", linger_ms=5, codec="none", max_in_flight_bytes=2 * QUOTA)
    async with Producer(config) as p:
        await (await p.send(topic, b"warm-up"))
        conn.send(("ready",))
        while (order := await asyncio.to_thread(conn.recv))[0] == "run":
            offered, t0 = 0, time.monotonic()
            while time.monotonic() - t0 < order[1]:
                await p.send_many(topic, [pool[(offered + i) % 64] for i in range(per_tick)])
                offered += per_tick
                await asyncio.sleep(NOISY_TICK_S)
            await p.flush(REPLY_TIMEOUT_S)
            m = p.metrics
            conn.send(("done", offered * NOISY_VALUE, m.throttled_acks, m.throttle_ms_total, m.throttle_ms_max))


# --- the quiet tenant (this process) --------------------------------------------------------------

async def _quiet_phase(p: Producer, topic: str, seconds: float, pool: list[bytes]) -> list[float]:
    """Pace QUIET_RATE for `seconds`; the send -> ack seconds of every send_many call."""
    latencies: list[float] = []
    futures: list[asyncio.Future[list[Delivery]]] = []

    def acked(stamp: float, _: asyncio.Future[list[Delivery]]) -> None:
        latencies.append(time.monotonic() - stamp)

    per_s = QUIET_RATE / QUIET_VALUE
    sent, t0 = 0, time.monotonic()
    while (elapsed := time.monotonic() - t0) < seconds:
        due = int(elapsed * per_s) + 1 - sent
        if due > 0:
            stamp = time.monotonic()
            future = await p.send_many(topic, [pool[(sent + i) % 64] for i in range(due)])
            future.add_done_callback(functools.partial(acked, stamp))
            futures.append(future)
            sent += due
        await asyncio.sleep(max(0.0, QUIET_TICK_S - (time.monotonic() - t0 - elapsed)))
    await p.flush(REPLY_TIMEOUT_S)
    await asyncio.gather(*futures)   # a failure is the bench's failure
    return latencies


def _accepted(url: str, topic: str) -> float:
    return sum(s.value for s in broker_samples(url, "memq_broker_message_bytes")
               if s.name == "memq_broker_message_bytes_total" and s.labels.get("topic") == topic)


def _throttle_s(url: str, principal: str) -> float:
    return sum(s.value for s in broker_samples(url, "memq_broker_throttle_seconds")
               if s.name == "memq_broker_throttle_seconds_total" and s.labels.get("principal") == principal)


def _reply(conn: Connection, expect: str) -> tuple:
    if not conn.poll(REPLY_TIMEOUT_S):
        raise RuntimeError(f"a noisy tenant's process did not answer ({expect}) within {REPLY_TIMEOUT_S:.0f}s")
    reply = conn.recv()
    if reply[0] != expect:
        raise RuntimeError(f"a noisy tenant's process answered {reply!r}, not {expect}")
    return tuple(reply)


@dataclass
class Neighbour:
    """A noisy tenant's process and what it did in the shared phases so far."""

    principal: str
    topic: str
    conn: Connection
    accepted: float = 0.0        # its Message bytes the broker accepted while the quiet tenant ran
    seconds: float = 0.0
    offered: int = 0             # bytes it handed to send_many
    metrics: tuple = ()          # its producer's (throttled_acks, throttle_ms_total, throttle_ms_max)
    quiet: list[float] = field(default_factory=list)   # the quiet tenant's latencies beside it

    @property
    def rate(self) -> float:
        return self.accepted / self.seconds


async def _shared_phase(p: Producer, url: str, topic: str, pool: list[bytes], n: Neighbour, phase_s: float) -> None:
    before, t0 = _accepted(url, n.topic), time.monotonic()
    n.conn.send(("run", phase_s))
    n.quiet += await _quiet_phase(p, topic, phase_s, pool)
    n.accepted += _accepted(url, n.topic) - before
    n.seconds += time.monotonic() - t0
    reply = await asyncio.to_thread(_reply, n.conn, "done")   # its backlog drained: the next phase is clean
    n.offered += reply[1]
    n.metrics = reply[2:]


async def _rounds(url: str, token: str, topic: str, neighbours: list[Neighbour], rounds: int,
                  phase_s: float) -> tuple[list[float], int]:
    """Each round: the quiet tenant alone, then beside each neighbour in turn; its solo latencies
    and how many of its acks were throttled."""
    pool = _pool(QUIET_VALUE)
    solo: list[float] = []
    async with Producer(ProducerConfig(brokers=url, token=token, ack="all", linger_ms=5)) as p:
        await (await p.send(topic, b"warm-up"))
        for r in range(rounds):
            solo += await _quiet_phase(p, topic, phase_s, pool)
            for n in neighbours:
                await _shared_phase(p, url, topic, pool, n, phase_s)
            print(f"round {r + 1}/{rounds}: quiet p99 solo {quantile(sorted(solo), 0.99):.3f}s; "
                  + "; ".join(f"beside {n.principal} {quantile(sorted(n.quiet), 0.99):.3f}s "
                              f"({n.principal} at {n.rate / MiB:.2f} MB/s)" for n in neighbours), flush=True)
        return sorted(solo), p.metrics.throttled_acks


def run(quick: bool) -> dict:
    rounds, phase_s = (1, 8.0) if quick else (3, 15.0)
    suffix = uuid.uuid4().hex[:6]
    tokens = {who: new_token(who) for who in ("quiet", "noisy", "unlimited")}
    topic = {who: f"bench-iso-{who}-{suffix}" for who in tokens}
    security = SecurityConfig(enabled=True, tokens=tuple(str(entry) for _, entry in tokens.values()),
                              acls=("allow * produce prefix:bench-iso-", "allow * describe prefix:bench-iso-"))
    # every principal has the quota but `unlimited`, the control: the same client, no quota
    quota = QuotaConfig(principal_byte_rate=QUOTA, principals=("unlimited=0",), burst_s=BURST_S)
    ctx = multiprocessing.get_context("spawn")     # no fork of a process with threads and a loop
    with bench_cluster([TopicConfig(t, batch_ms=BATCH_MS) for t in topic.values()],
                       security=security, quota=quota) as bc:
        url = bc.broker.url
        print(f"broker at {url}; quota {QUOTA / MiB:.1f} MB/s per principal; quiet tenant at "
              f"{QUIET_RATE / MiB:.1f} MB/s; noisy tenants try {OFFER}x the quota (one exempt from it); "
              f"{rounds} rounds of {phase_s:.0f} s solo, beside noisy, beside unlimited; ack=all, "
              f"batch_ms={BATCH_MS}", flush=True)
        neighbours, procs = [], []
        try:
            for who in ("noisy", "unlimited"):
                ours, theirs = ctx.Pipe()
                proc = ctx.Process(target=_noisy, args=(url, tokens[who][0], topic[who], theirs), name=who, daemon=True)
                proc.start()
                procs.append(proc)
                neighbours.append(Neighbour(who, topic[who], ours))
            for n in neighbours:
                _reply(n.conn, "ready")
            solo, quiet_throttled = asyncio.run(_rounds(url, tokens["quiet"][0], topic["quiet"], neighbours,
                                                        rounds, phase_s))
            for n in neighbours:
                n.conn.send(("stop",))
            for proc in procs:
                proc.join(REPLY_TIMEOUT_S)
            broker_throttle = {who: _throttle_s(url, who) for who in tokens}
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
                    proc.join(5)
    noisy, unlimited = neighbours
    solo_p99 = quantile(solo, 0.99)
    p99 = {n.principal: quantile(sorted(n.quiet), 0.99) for n in neighbours}
    throttled_acks, throttle_ms_total, throttle_ms_max = noisy.metrics
    print(f"noisy tenant: {noisy.rate / MiB:.3f} MB/s accepted vs quota {QUOTA / MiB:.3f} (tried "
          f"{noisy.offered / noisy.seconds / MiB:.2f} MB/s against its blocking buffer); throttled "
          f"{throttle_ms_total / 1000:.1f}s over {throttled_acks} acks (broker: {broker_throttle['noisy']:.1f}s); "
          f"without a quota the same client got {unlimited.rate / MiB:.2f} MB/s; quiet p99 solo {solo_p99:.3f}s, "
          f"beside noisy {p99['noisy']:.3f}s, beside unlimited {p99['unlimited']:.3f}s; quiet acks throttled: "
          f"{quiet_throttled}", flush=True)
    return {
        "ratios": {"noisy_rate_vs_quota": round(noisy.rate / QUOTA, 3),
                   "quiet_p99_vs_solo": round(p99["noisy"] / solo_p99, 3)},
        "quota_mb_s": QUOTA / MiB, "noisy_accepted_mb_s": round(noisy.rate / MiB, 3),
        "noisy_tried_mb_s": round(noisy.offered / noisy.seconds / MiB, 2),
        "noisy_throttled_acks": throttled_acks, "noisy_throttle_ms_total": throttle_ms_total,
        "noisy_throttle_ms_max": throttle_ms_max,
        "broker_throttle_s": {k: round(v, 2) for k, v in broker_throttle.items()},
        "quiet_mb_s": QUIET_RATE / MiB, "quiet_throttled_acks": quiet_throttled,
        "quiet_solo_p50_s": round(quantile(solo, 0.5), 4), "quiet_solo_p99_s": round(solo_p99, 4),
        "quiet_shared_p50_s": round(quantile(sorted(noisy.quiet), 0.5), 4),
        "quiet_shared_p99_s": round(p99["noisy"], 4),
        # the control: the same noisy client exempt from the quota
        "unlimited_accepted_mb_s": round(unlimited.rate / MiB, 3),
        "quiet_p99_vs_solo_without_quota": round(p99["unlimited"] / solo_p99, 3),
        "quiet_samples": [len(solo), len(noisy.quiet), len(unlimited.quiet)],
        "rounds": rounds, "phase_s": phase_s, "burst_s": BURST_S, "batch_ms": BATCH_MS, "ack": "all",
    }
