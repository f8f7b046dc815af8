"""The nemesis: a seeded fault schedule, printed so a failing run can be replayed, and its executor.

`schedule(seed, kinds, ...)` is pure: `random.Random(seed)` picks the faults, their targets
and durations, with quiet gaps between them (so each fault's heal-to-first-ack is its own).
`Nemesis.run` applies them to a ChaosCluster and returns when each was applied and healed.
Partitions and packet loss are iptables rules inside the faulty host's namespace (flushed on
heal); rate limits are tc tbf on the bridge side of a server's link (traffic towards it).
There is no `tc netem` on these kernels, hence iptables' random drop for loss and a
userspace link proxy (memq.chaos.linkproxy) for delay with jitter. A consumer fault SIGKILLs
the workload's group consumer and starts it again (through `ConsumerHandle`). An overload
fault has the producers send large records flat out (through `BurstHandle`) into a capped S3.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from memq.chaos.checker import FaultWindow
from memq.chaos.cluster import ChaosCluster
from memq.chaos.linkproxy import LinkShape
from memq.chaos.s3faults import S3Faults
from memq.chaos.topology import sh
from memq.errors import ConfigError

SERVERS = ("s3", "kafka", "zookeeper")
KINDS = ("kill", "kill-governor", "pause", "cut-zk", "cut-s3", "cut-kafka", "cut-producer",
         "split", "loss", "slow-s3", "delay", "kill-consumer", "slowdown", "tail", "long-pause", "overload")
"""kill: SIGKILL a broker, restart it after the fault; pause: SIGSTOP/SIGCONT a server; cut-X: a
broker loses X; cut-producer: the producers lose one broker; split: one broker loses the other
brokers and ZooKeeper (minority) while the rest keep both (majority); loss: 5% of a broker's
packets to S3 and Kafka dropped; slow-s3: traffic to S3 limited to 4 Mbit/s; delay: a server's
links (delay:s3), or a broker's links to S3 and Kafka (delay:b2), get extra latency with jitter;
kill-consumer: SIGKILL the group's consumer, restart it after the fault (at-least-once: what it
had not committed is delivered again); slowdown: 30% of S3 requests answered 503 SlowDown; tail: 2% of
S3 answers held 500 ms (both by memq.chaos.s3faults); long-pause: SIGSTOP S3 or Kafka for `LONG_PAUSE_S`, past
every timeout (a broker's delivery report, a PUT's read timeout, a producer's request); overload:
the producers send 64 KiB records as fast as they are taken while S3 is capped at 4 Mbit/s."""
HTTP_FAULTS = {"slowdown": S3Faults(slowdown_share=0.3), "tail": S3Faults(tail_share=0.02, tail_delay_s=0.5)}
LONG_PAUSE_S = 45.0
"""Longer than kafka.request_timeout_ms (30 s) plus the publisher's 5 s backstop, than
s3.read_timeout_s (30 s) and than producer.request_timeout_ms (30 s), at their defaults."""
S3_CAP = "4mbit"
DELAYED_FOR_BROKER = ("s3", "kafka")
DEFAULT_LINK = LinkShape(delay_s=0.2, jitter_s=0.1)


@dataclass(frozen=True)
class Fault:
    kind: str
    target: str          # a broker id or a server name
    at_s: float          # offset from the start of the schedule
    duration_s: float

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.target}" + (f" {self.duration_s:.0f}s" if self.duration_s else "")


def schedule(seed: int, kinds: Sequence[str], *, total_s: float, brokers: Sequence[str],
             durations: tuple[float, float] = (5.0, 12.0), gap_s: tuple[float, float] = (8.0, 15.0)) -> list[Fault]:
    """Faults of `kinds`, cycling through them in a seeded order, until `total_s` is used.

    A kind may name its target ("pause:s3", "kill:b2"); otherwise the seed picks it."""
    bad = [k for k in kinds if k.partition(":")[0] not in KINDS]
    if bad or not kinds:
        raise ConfigError(f"unknown fault kinds {bad} (known: {', '.join(KINDS)})" if bad else "no fault kinds")
    for k in kinds:
        kind, _, fixed = k.partition(":")
        if fixed and fixed not in _targets(kind, brokers):
            raise ConfigError(f"fault {k}: unknown target {fixed!r} (known: {', '.join(_targets(kind, brokers))})")
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    out: list[Fault] = []
    t = rng.uniform(*gap_s)
    while True:
        kind, _, fixed = order[len(out) % len(order)].partition(":")
        dur = LONG_PAUSE_S if kind == "long-pause" else round(rng.uniform(*durations), 1)
        if t + dur > total_s:
            return out
        target = fixed or _target(rng, kind, brokers)
        out.append(Fault(kind, target, round(t, 1), dur))
        t += dur + rng.uniform(*gap_s)


def _targets(kind: str, brokers: Sequence[str]) -> tuple[str, ...]:
    fixed = {"kill-governor": "governor", "slow-s3": "s3", "kill-consumer": "consumer", "slowdown": "s3",
             "tail": "s3", "overload": "s3"}.get(kind)
    if fixed:
        return (fixed,)
    return {"pause": SERVERS, "long-pause": ("s3", "kafka"), "delay": (*SERVERS, *brokers)}.get(kind, tuple(brokers))


def _target(rng: random.Random, kind: str, brokers: Sequence[str]) -> str:
    targets = _targets(kind, brokers)
    return targets[0] if len(targets) == 1 else rng.choice(targets)


def delayed_links(fault: Fault) -> tuple[str, ...]:
    """The servers whose links a fault delays (none for other kinds)."""
    if fault.kind != "delay":
        return ()
    return (fault.target,) if fault.target in SERVERS else DELAYED_FOR_BROKER


def describe(seed: int, faults: Sequence[Fault]) -> str:
    lines = [f"nemesis seed {seed}: {len(faults)} faults"]
    lines += [f"  t+{f.at_s:6.1f}s  {f.name}" for f in faults]
    return "\n".join(lines)


class ConsumerHandle(Protocol):
    """The workload's group consumer, as the nemesis needs it."""

    def kill(self) -> None: ...
    def restart(self) -> None: ...


class BurstHandle(Protocol):
    """The workload's producers, as an overload fault drives them."""

    def burst(self, on: bool) -> None: ...


class Nemesis:
    """Applies a schedule to `cluster`; `windows` holds what happened, in wall time.

    Runs in the main thread: restarted brokers die with the thread that spawned them
    (PR_SET_PDEATHSIG), and the workload runs in its own processes anyway. `link` is the
    latency a delay fault adds (its `peers` are filled in for a broker target); `consumer`
    is needed by kill-consumer faults.
    """

    def __init__(self, cluster: ChaosCluster, faults: Sequence[Fault], log: Callable[[str], None] = print, *,
                 link: LinkShape = DEFAULT_LINK, consumer: ConsumerHandle | None = None,
                 producers: BurstHandle | None = None) -> None:
        self.cluster = cluster
        self.link = link
        self.consumer = consumer
        self.producers = producers
        self.faults = list(faults)
        self.windows: list[FaultWindow] = []
        self.errors: list[str] = []
        self._log = log

    def run(self, t0: float, until: Callable[[], bool] = lambda: False) -> None:
        """Apply each fault at `t0 + at_s` (wall time); stop early when `until()` turns True."""
        for f in self.faults:
            while time.time() < t0 + f.at_s:
                if until():
                    return
                time.sleep(0.1)
            try:
                start, end = self._apply(f)
            except Exception as e:  # a harness failure is reported, the schedule goes on
                self.errors.append(f"{f.name}: {type(e).__name__}: {e}")
                self._log(f"nemesis: {f.name} failed: {e}")
                continue
            self.windows.append(FaultWindow(f.name, start, end))
            self._log(f"nemesis: {f.name} healed after {end - start:.1f}s")

    # --- faults --------------------------------------------------------------------------

    def _apply(self, f: Fault) -> tuple[float, float]:
        c, hosts = self.cluster, self.cluster.topo.hosts
        target = (c.governor() or c.broker_ids[0]) if f.target == "governor" else f.target
        self._log(f"nemesis: {f.kind}:{target} for {f.duration_s:.1f}s")
        start = time.time()
        if f.kind in ("kill", "kill-governor"):
            c.brokers.kill_broker(target)
            time.sleep(f.duration_s)
            end = time.time()
            c.brokers.restart_broker(target)
            return start, end
        if f.kind == "kill-consumer":
            if self.consumer is None:
                raise ConfigError("kill-consumer: the nemesis was given no consumer")
            self.consumer.kill()
            time.sleep(f.duration_s)
            end = time.time()
            self.consumer.restart()
            return start, end
        if f.kind == "delay":
            peers = () if target in SERVERS else (hosts[target].ip,)
            for server in delayed_links(f):
                c.shape_link(server, LinkShape(self.link.delay_s, self.link.jitter_s, peers))
            try:
                time.sleep(f.duration_s)
            finally:
                for server in delayed_links(f):
                    c.shape_link(server, LinkShape())
            return start, time.time()
        if f.kind in ("pause", "long-pause"):
            pid = c.procs[target].pid
            os.killpg(pid, signal.SIGSTOP)
            try:
                time.sleep(f.duration_s)
            finally:
                os.killpg(pid, signal.SIGCONT)
            return start, time.time()
        if f.kind in HTTP_FAULTS:
            c.set_s3_faults(HTTP_FAULTS[f.kind])
            try:
                time.sleep(f.duration_s)
            finally:
                c.set_s3_faults(S3Faults())
            return start, time.time()
        if f.kind in ("slow-s3", "overload"):
            if f.kind == "overload" and self.producers is None:
                raise ConfigError("overload: the nemesis was given no producers")
            link = hosts["s3"].link
            sh("tc", "qdisc", "add", "dev", link, "root", "tbf", "rate", S3_CAP, "burst", "64kb", "latency", "2s")
            if f.kind == "overload" and self.producers is not None:
                self.producers.burst(True)
            try:
                time.sleep(f.duration_s)
            finally:
                if f.kind == "overload" and self.producers is not None:
                    self.producers.burst(False)
                sh("tc", "qdisc", "del", "dev", link, "root")
            return start, time.time()
        host, rules = self._rules(f.kind, target)
        for rule in rules:
            c.topo.run(host, "iptables", *rule)
        try:
            time.sleep(f.duration_s)
        finally:
            c.topo.run(host, "iptables", "-F", "INPUT")
            c.topo.run(host, "iptables", "-F", "OUTPUT")
        return start, time.time()

    def _rules(self, kind: str, target: str) -> tuple[str, list[list[str]]]:
        """The host whose namespace gets the rules, and the rules."""
        ips = {n: h.ip for n, h in self.cluster.topo.hosts.items()}
        if kind == "cut-producer":
            return "producer", _cut([ips[target]])
        if kind == "loss":
            return target, [["-A", "OUTPUT", "-d", ips[s], "-m", "statistic", "--mode", "random",
                             "--probability", "0.05", "-j", "DROP"] for s in ("s3", "kafka")]
        if kind == "split":
            others = [ips[b] for b in self.cluster.broker_ids if b != target]
            return target, _cut([*others, ips["zookeeper"]])
        server = {"cut-zk": "zookeeper", "cut-s3": "s3", "cut-kafka": "kafka"}[kind]
        return target, _cut([ips[server]])


def _cut(peers: Sequence[str]) -> list[list[str]]:
    return [rule for ip in peers for rule in (["-A", "INPUT", "-s", ip, "-j", "DROP"],
                                              ["-A", "OUTPUT", "-d", ip, "-j", "DROP"])]
