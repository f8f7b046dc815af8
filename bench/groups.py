"""Rebalances of a consumer group coordinated by memq: KIP-848's consumer protocol vs the classic one.

One dev cluster (moto S3, tansu, ZooKeeper) and one governed broker process with its Kafka
listener on. A producer writes to every one of `PARTITIONS` partitions all along (keyed
records, a few hundred a second), and confluent-kafka members (`bench._group_member`, one
process each, a commit after each batch) read them as one group: 3 members, then a 4th joins,
then 2 leave (closed: they leave the group), per round and per protocol (`group.protocol`
`consumer`, memq's server-side `uniform` assignor; `classic`, librdkafka's default eager
`range,roundrobin`), the protocols alternating. Both heartbeat every 0.5 s with a 6 s session
(the broker's `[group]` settings for the consumer protocol, the members' own for classic).

A change's **rebalance time** is from the joining member's subscription (or the leaving ones'
SIGTERM) until every partition has been read by the member that owns it once the assignment
settled, after that member came to own it: a partition that stayed put counts at once, a moved
one (or one revoked and given back, as eager rebalances do) once its owner read it again. `ratios.consumer_p99_vs_goal` is the
issue's goal (3 s) over the consumer protocol's p99, `classic_p99_vs_goal` 6 s over the classic
p99, `consumer_vs_classic` classic's p99 over the consumer protocol's; `read_twice` counts the
records some member read again after another had read (and committed) it.

A **migration** round (KIP-848's online upgrade) times the same way a classic group of 3 that a
consumer-protocol member joins (the group becomes a consumer group, the classic members rejoin
under the server's assignor), then each classic member restarted with the consumer protocol in
turn (a leave, then a join); `migration_p99_vs_goal` is the classic goal (6 s: eager members
are in the group) over their p99.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from confluent_kafka import Producer

from bench._group_member import member_log
from bench.kafka_produce import _kafka_address
from memq.config import BrokerConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster

TOPIC = "bench-groups"
PARTITIONS = 12
GOALS_S = {"consumer": 3.0, "classic": 6.0}
SETTLE_TIMEOUT_S = 60.0
HEARTBEAT_MS = 500   # both protocols' members heartbeat this often (classic: heartbeat.interval.ms)
QUIET_S = 2.0   # an assignment unchanged this long is the one the group settled on


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=None, help="3 -> 4 -> 2 rounds per protocol")


class _Writer(threading.Thread):
    """Keyed records to every partition, all along, until stopped."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.stopped = threading.Event()

    def run(self) -> None:
        p = Producer({"bootstrap.servers": self.address, "linger.ms": 20, "acks": "all"})
        i = 0
        while not self.stopped.is_set():
            for part in range(PARTITIONS):
                p.produce(TOPIC, b"v%d" % i, key=b"k%d" % random.randrange(1000), partition=part)
                i += 1
            p.poll(0)
            time.sleep(0.05)
        p.flush(10)


class _Group:
    """One group's member processes and their logs."""

    def __init__(self, tmp: Path, address: str, name: str, protocol: str) -> None:
        self.tmp, self.address, self.name, self.protocol = tmp, address, name, protocol
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.live: list[str] = []

    def _log(self, member: str) -> Path:
        return self.tmp / f"{self.name}-{member}.log"

    def add(self, member: str, protocol: str | None = None) -> None:
        self.procs[member] = subprocess.Popen(
            [sys.executable, "-m", "bench._group_member", self.address, TOPIC, self.name, protocol or self.protocol,
             str(self._log(member))], cwd=Path(__file__).parent.parent)
        self.live.append(member)

    def leave(self, member: str) -> None:
        self.procs[member].terminate()
        self.live.remove(member)

    def stop(self) -> None:
        for member in list(self.live):
            self.leave(member)
        for p in self.procs.values():
            p.wait(30)

    def started(self, member: str) -> float:
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while (s := member_log(self._log(member)).started) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"member {member} of {self.name} did not start")
            time.sleep(0.05)
        return s

    def read_again_after(self, t0: float) -> float:
        """Seconds from `t0` until every partition was read by the member owning it once the
        assignment settled (no change for `QUIET_S`), after that member came to own it."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            time.sleep(0.2)
            logs = {m: member_log(self._log(m)) for m in self.live}
            owners = {p: m for m, log in logs.items() for p in (log.assignments[-1][1] if log.assignments else ())}
            changed = max((log.assignments[-1][0] for log in logs.values() if log.assignments), default=0.0)
            first: dict[int, float] = {}
            for p, m in owners.items():
                since = max(t0, logs[m].acquired(p) or t0)
                first[p] = min((t for (q, _), t in zip(logs[m].read, logs[m].times, strict=True)
                                if q == p and t >= since), default=float("inf"))
            done = (len(owners) == PARTITIONS and sum(len(log.assignments[-1][1]) for log in logs.values()
                                                      if log.assignments) == PARTITIONS
                    and t0 < changed < time.time() - QUIET_S and max(first.values()) < float("inf"))
            if done:
                return max(first.values()) - t0
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: not settled within {SETTLE_TIMEOUT_S:.0f} s: owners {owners}")

    def read_twice(self) -> int:
        counts = Counter(r for member in self.procs for r in member_log(self._log(member)).read)
        return sum(n - 1 for n in counts.values() if n > 1)


def _round(tmp: Path, address: str, protocol: str, index: int) -> tuple[list[float], int]:
    """3 members, then a 4th, then 2 of them leave: the two rebalance times, the records read twice."""
    g = _Group(tmp, address, f"bench-{protocol}-{index}", protocol)
    try:
        for m in ("m1", "m2", "m3"):
            g.add(m)
        g.read_again_after(max(g.started(m) for m in ("m1", "m2", "m3")))
        time.sleep(1.0)   # settled: reading steadily
        g.add("m4")
        joined = g.read_again_after(g.started("m4"))
        time.sleep(1.0)
        t0 = time.time()
        g.leave("m1")
        g.leave("m2")
        left = g.read_again_after(t0)
        time.sleep(1.0)
    finally:
        g.stop()
    return [joined, left], g.read_twice()


def _migration_round(tmp: Path, address: str, index: int) -> tuple[list[float], int]:
    """3 classic members, a consumer-protocol one joins, then each classic one restarted with the
    consumer protocol: each change's rebalance time, the records read twice."""
    g = _Group(tmp, address, f"bench-migration-{index}", "classic")
    times = []
    try:
        for m in ("m1", "m2", "m3"):
            g.add(m)
        g.read_again_after(max(g.started(m) for m in ("m1", "m2", "m3")))
        time.sleep(1.0)
        g.add("c4", "consumer")
        times.append(g.read_again_after(g.started("c4")))
        for m in ("m1", "m2", "m3"):
            time.sleep(1.0)
            g.leave(m)
            g.procs[m].wait(30)
            g.add(f"c{m}", "consumer")
            times.append(g.read_again_after(g.started(f"c{m}")))
        time.sleep(1.0)
    finally:
        g.stop()
    return times, g.read_twice()


def _p99(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.99 * len(s)))]


def run(quick: bool, rounds: int | None = None) -> dict:
    rounds = rounds or (1 if quick else 3)
    times: dict[str, list[float]] = {"consumer": [], "classic": [], "migration": []}
    twice: dict[str, int] = {"consumer": 0, "classic": 0, "migration": 0}
    # the broker processes read them: the classic members' session (6 s) and heartbeat (0.5 s)
    os.environ["MEMQ_GROUP_SESSION_TIMEOUT_MS"] = "6000"
    os.environ["MEMQ_GROUP_HEARTBEAT_INTERVAL_MS"] = str(HEARTBEAT_MS)
    with tempfile.TemporaryDirectory(prefix="memq-bench-") as tmp, \
            DevCluster(Path(tmp) / "servers") as dc, \
            GovernedCluster(tmp, brokers=1, servers=dc, cluster="bench", broker=BrokerConfig(kafka_port=0)) as gc:
        gc.create_topic(TopicConfig(TOPIC, read_partitions=PARTITIONS, batch_ms=20))
        address = _kafka_address(gc.broker("b1").url)
        writer = _Writer(address)
        writer.start()
        try:
            for i in range(rounds):
                for protocol in ("consumer", "classic"):   # alternating: drift on a shared machine hits both
                    got, n = _round(Path(tmp), address, protocol, i)
                    times[protocol] += got
                    twice[protocol] += n
                    print(f"{protocol} round {i}: join {got[0]:.2f} s, leave {got[1]:.2f} s, read twice {n}",
                          flush=True)
                got, n = _migration_round(Path(tmp), address, i)
                times["migration"] += got
                twice["migration"] += n
                print(f"migration round {i}: {', '.join(f'{x:.2f}' for x in got)} s, read twice {n}", flush=True)
        finally:
            writer.stopped.set()
            writer.join(30)
    p99 = {k: _p99(v) for k, v in times.items()}
    return {"ratios": {"consumer_p99_vs_goal": round(GOALS_S["consumer"] / p99["consumer"], 3),
                       "classic_p99_vs_goal": round(GOALS_S["classic"] / p99["classic"], 3),
                       "consumer_vs_classic": round(p99["classic"] / p99["consumer"], 3),
                       "migration_p99_vs_goal": round(GOALS_S["classic"] / p99["migration"], 3)},
            "p99_s": {k: round(v, 3) for k, v in p99.items()},
            "rebalance_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
            "read_twice": twice, "rounds": rounds, "partitions": PARTITIONS, "members": "3 -> 4 -> 2"}
