"""One chaos run end to end: hosts, cluster, workload, nemesis, independent read, verdict.

Shared by the suite's short seeded run and `python -m bench chaos`. Everything it starts (the
namespaces, the servers, the workload processes) is stopped and removed before it returns;
what a killed earlier run left behind is swept first. The transactional workload (`workload="txn"`,
memq.chaos.workload.produce_txn) adds a read_committed read of the whole topic after the run and
its verdict (`RunResult.txn`, memq.chaos.checker.check_txn). The compacted workload
(`workload="compacted"`) writes the same keyed records to a compacted topic the brokers compact
during the run (`_topic`), reads its state from earliest afterwards, and checks that each
key's latest acked value survived (`RunResult.compacted`, memq.chaos.checker.check_compacted).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from memq.chaos.checker import (CompactedVerdict, KeyedWrite, Observations, TxnVerdict, TxnWrite, Verdict, check,
                                check_compacted, check_txn)
from memq.chaos.cluster import ChaosCluster, host_names
from memq.chaos.linkproxy import LinkShape
from memq.chaos.nemesis import DEFAULT_LINK, HTTP_FAULTS, Fault, Nemesis, delayed_links, describe, schedule
from memq.chaos.throughput import FaultThroughput, fault_throughput
from memq.chaos.topology import Topology, sweep_stale
from memq.chaos.workload import (load_acks, load_delivered, load_keyed_writes, load_txn_writes, read_committed,
                                 read_objects, read_pointers, read_state)
from memq.compaction.manifest import ManifestPointers
from memq.config import TopicConfig
from memq.devcluster.broker_process import config_toml
from memq.devcluster.process import ManagedProcess, spawn
from memq.errors import DevClusterError

TOPIC = "chaos"
QUIET_TAIL_S = 10.0      # no fault in the last seconds of producing: the heal must show in acks
EXIT_GRACE_S = 120.0


@dataclass(frozen=True)
class RunSpec:
    seed: int
    seconds: float
    kinds: tuple[str, ...]
    producers: int = 2
    rate: float = 100.0          # records/s per producer
    brokers: int = 3
    partitions: int = 3
    catch_up_s: float = 60.0
    durations: tuple[float, float] = (5.0, 12.0)
    gap_s: tuple[float, float] = (8.0, 15.0)
    delay_s: float = DEFAULT_LINK.delay_s     # delay faults: extra one-way latency per chunk ...
    jitter_s: float = DEFAULT_LINK.jitter_s   # ... plus or minus up to this
    reader: str = "memq"         # the group's reader: memq's Consumer, or "kafka" (a Kafka consumer group)
    workload: str = "plain"      # "txn": producers write in transactions, some aborted (workload.produce_txn);
                                 # "compacted": the topic is compacted during the run (`_topic`)


@dataclass(frozen=True)
class RunResult:
    spec: RunSpec
    schedule: tuple[Fault, ...]
    verdict: Verdict
    nemesis_errors: tuple[str, ...] = field(default=())
    throughput: tuple[FaultThroughput, ...] = field(default=())
    txn: TxnVerdict | None = None   # the transactional workload's verdict
    compacted: CompactedVerdict | None = None   # the compacted workload's
    manifests: int = 0     # ... and how many of the topic's partitions had been compacted by its end

    @property
    def passed(self) -> bool:
        return (self.verdict.passed and (self.txn is None or self.txn.passed)
                and (self.compacted is None or self.compacted.passed))


def run(spec: RunSpec, log: Callable[[str], None] = print, work_dir: Path | None = None) -> RunResult:
    faults = schedule(spec.seed, spec.kinds, total_s=spec.seconds - QUIET_TAIL_S,
                      brokers=[f"b{i}" for i in range(1, spec.brokers + 1)],
                      durations=spec.durations, gap_s=spec.gap_s)
    log(describe(spec.seed, faults))
    swept = sweep_stale()
    if swept:
        log(f"swept what a killed earlier run left: {', '.join(swept)}")
    shaped = sorted({s for f in faults for s in delayed_links(f)})
    with tempfile.TemporaryDirectory(prefix="memq-chaos-") as tmp:
        work = work_dir or Path(tmp)
        with Topology(host_names(spec.brokers)) as topo, \
                ChaosCluster(topo, work, spec.brokers, shaped=shaped,
                             s3_faults=any(f.kind in HTTP_FAULTS for f in faults),
                             kafka_listener=spec.reader == "kafka") as cluster:
            placed = cluster.create_topic(_topic(spec))
            log(f"cluster up: governor {cluster.governor()}, topic {TOPIC} on {', '.join(placed)}")
            client = work / "client.toml"
            client.write_text(config_toml(cluster.config))
            workers: list[ManagedProcess] = []
            writes: list[TxnWrite] = []   # the transactional workload's
            read: list[str] = []
            keyed: list[KeyedWrite] = []  # the compacted workload's, and the state read after the run
            state: dict[str, str] = {}
            manifests = 0
            consumer_out = work / "consumer.jsonl"
            reader = ["--reader", spec.reader, "--bootstrap", cluster.kafka_bootstrap] if spec.reader == "kafka" else []
            consumer = _Consumer(lambda: _worker(topo, work, "consumer", "consume", client, consumer_out,
                                                 "--catch-up-s", str(spec.catch_up_s), *reader))
            try:
                outs = [work / f"p{i}.jsonl" for i in range(spec.producers)]
                burst = _Burst(work / "burst")
                t0 = time.time()
                producers = [_worker(topo, work, "producer", "produce", client, out, "--name", f"p{i}",
                                     "--rate", str(spec.rate), "--seconds", str(spec.seconds),
                                     "--burst-file", str(burst.path), "--workload", spec.workload)
                             for i, out in enumerate(outs)]
                workers += producers
                nemesis = Nemesis(cluster, faults, log, link=LinkShape(spec.delay_s, spec.jitter_s),
                                  consumer=consumer, producers=burst)
                nemesis.run(t0, until=lambda: all(not p.alive() for p in producers))
                _wait(producers, t0 + spec.seconds + EXIT_GRACE_S)
                produce_end = t0 + spec.seconds
                acks = load_acks([o for o in outs if o.exists()])
                log(f"producers done: {sum(a.ok for a in acks)} of {len(acks)} sends acked")
                consumer_out.with_suffix(".stop").write_text("\n".join(a.record_id for a in acks if a.ok))
                _wait([consumer.proc], time.time() + spec.catch_up_s + 30.0)
                pointers = read_pointers(cluster.config, TOPIC, spec.partitions)
                objects = read_objects(cluster.config)
                if spec.workload == "txn":
                    writes = load_txn_writes([o for o in outs if o.exists()])
                    read = read_committed(cluster.config, TOPIC, {a.record_id for a in acks if a.ok}, spec.catch_up_s)
                    log(f"read_committed after the run: {len(read)} records")
                if spec.workload == "compacted":
                    keyed = load_keyed_writes([o for o in outs if o.exists()])
                    pointers_zk = ManifestPointers(cluster.brokers.registry)
                    manifests = sum(pointers_zk.read(TOPIC, p) is not None for p in range(spec.partitions))
                    state = read_state(cluster.config, TOPIC, pointers_zk, {w.key for w in keyed if w.ok},
                                       spec.catch_up_s)
                    log(f"state after the run: {len(state)} keys from earliest, {manifests} partitions compacted")
                s3_counts = cluster.s3_request_counts()
            finally:
                for w in [consumer.proc, *workers]:
                    w.stop(5.0)
            delivered = load_delivered(consumer_out)
    verdict = check(Observations(acks, delivered, pointers, objects, nemesis.windows, t0, produce_end))
    txn = check_txn(writes, pointers, objects, read, [d.record_id for d in delivered]) if spec.workload == "txn" else None
    compacted = check_compacted(keyed, state) if spec.workload == "compacted" else None
    return RunResult(spec, tuple(faults), verdict, tuple(nemesis.errors),
                     tuple(fault_throughput(row, acks, s3_counts) for row in verdict.faults), txn, compacted, manifests)


def _topic(spec: RunSpec) -> TopicConfig:
    plain = TopicConfig(name=TOPIC, read_partitions=spec.partitions)
    if spec.workload != "compacted":
        return plain
    # compacted once a fifth of a partition is dirty, records a few seconds old: several runs
    # while the faults go on
    return dataclasses.replace(plain, cleanup_policy="compact", min_cleanable_dirty_ratio=0.2,
                               min_compaction_lag_ms=3_000)


class _Consumer:
    """The workload's group consumer: SIGKILLed and started again by kill-consumer faults."""

    def __init__(self, start: Callable[[], ManagedProcess]) -> None:
        self._start = start
        self.proc = start()

    def kill(self) -> None:
        if self.proc.alive():   # one that crashed by itself is restarted all the same
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.popen.wait(10)

    def restart(self) -> None:
        self.proc = self._start()


class _Burst:
    """The producers burst while `path` exists (they look for it between sends)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def burst(self, on: bool) -> None:
        if on:
            self.path.touch()
        else:
            self.path.unlink(missing_ok=True)


def _worker(topo: Topology, work: Path, host: str, role: str, config: Path, out: Path, *extra: str) -> ManagedProcess:
    argv = [sys.executable, "-m", "memq.chaos.workload", role, "--config", str(config), "--topic", TOPIC,
            "--out", str(out), *extra]
    return spawn(f"{role}-{out.stem}", topo.exec_argv(host, argv), log_path=work / "logs" / f"{out.stem}.log")


def _wait(procs: Sequence[ManagedProcess], deadline: float) -> None:
    while any(p.alive() for p in procs):
        if time.time() > deadline:
            raise DevClusterError(f"workload did not finish: {[p.name for p in procs if p.alive()]}; log:\n"
                                  + "\n".join(p.log_tail(1500) for p in procs))
        time.sleep(0.2)


def table(result: RunResult) -> str:
    """The per-fault table and the totals, for people."""
    v = result.verdict
    rows = [f"{'fault':<28}{'sends':>7}{'failed':>8}{'lost':>6}{'heal->ack s':>13}{'max gap s':>11}{'redelivered':>13}"
            f"{'write amp':>11}"]
    for f in v.faults:
        heal = "never" if f.heal_to_first_ack_s is None else f"{f.heal_to_first_ack_s:.2f}"
        amp = "n/a" if f.write_amplification is None else f"{f.write_amplification:.3f}"
        rows.append(f"{f.name:<28}{f.sends:>7}{f.failed:>8}{f.acked_lost:>6}{heal:>13}{f.max_write_gap_s:>11.2f}"
                    f"{f.redelivered:>13}{amp:>11}")
    rows.append(f"totals: {v.sends} sends, {v.acked} acked, {v.acked_lost} acked-lost, {v.consumer_missed} "
                f"missed by the group, {v.duplicates} duplicates delivered, {v.stored_duplicates} stored twice, "
                f"{v.unacked_but_present} unacked-but-present, {v.dangling_pointers} dangling pointers, "
                f"{v.orphan_objects} orphan objects, write amplification {v.write_amplification:.3f}, "
                f"longest write gap {v.max_write_gap_s:.1f}s, "
                f"catch-up {'n/a' if v.catch_up_s is None else f'{v.catch_up_s:.1f}s'}")
    rows += _throughput_rows(result.throughput)
    t = result.txn
    if t is not None:
        rows.append(f"transactions: {t.transactions} ({t.committed} records committed, {t.aborted} aborted, "
                    f"{t.in_doubt} in doubt), {t.aborted_visible} aborted records visible, {t.torn} torn, "
                    f"read_committed after the run: {t.read_missed} missed, {t.read_duplicates} duplicates")
    c = result.compacted
    if c is not None:
        rows.append(f"compacted: {result.manifests} of {result.spec.partitions} partitions, {c.keys} keys acked, "
                    f"{len(c.lost)} lost their latest acked value, {len(c.unknown)} read a record never written to them")
    rows += [f"nemesis error: {e}" for e in result.nemesis_errors]
    rows += [f"FAILED: {p}" for p in v.problems() + (t.problems() if t is not None else [])
             + (c.problems() if c is not None else [])]
    return "\n".join(rows)


def _throughput_rows(figures: Sequence[FaultThroughput]) -> list[str]:
    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    rows = [f"{'fault':<28}{'S3 req/s before':>16}{'during':>8}{'after':>8}{'503 share':>10}"
            f"{'acks/s before':>14}{'during':>8}{'normal after s':>15}"]
    for f in figures:
        share = "-" if f.slowdown_share_during is None else f"{f.slowdown_share_during:.2f}"
        normal = "never" if f.back_to_normal_s is None else f"{f.back_to_normal_s:.1f}"
        rows.append(f"{f.name:<28}{num(f.s3_rps_before):>16}{num(f.s3_rps_during):>8}{num(f.s3_rps_after):>8}"
                    f"{share:>10}{f.acks_per_s_before:>14.1f}{f.acks_per_s_during:>8.1f}{normal:>15}")
    return rows if figures else []


def summary(result: RunResult) -> dict[str, object]:
    v = result.verdict
    return {"seed": result.spec.seed, "reader": result.spec.reader, "faults": [f.name for f in v.faults], "acked_lost": v.acked_lost,
            "duplicates": v.duplicates, "dangling_pointers": v.dangling_pointers,
            "max_write_gap_s": round(v.max_write_gap_s, 2), "consumer_missed": v.consumer_missed,
            "stored_duplicates": v.stored_duplicates, "unacked_but_present": v.unacked_but_present,
            "orphan_objects": v.orphan_objects, "sends": v.sends, "acked": v.acked,
            "catch_up_s": None if v.catch_up_s is None else round(v.catch_up_s, 2),
            "heal_to_first_ack_s": [f.heal_to_first_ack_s for f in v.faults],
            "fault_write_gap_s": [round(f.max_write_gap_s, 2) for f in v.faults],
            "redelivered": [f.redelivered for f in v.faults],
            "failed": [f.failed for f in v.faults],
            "throughput": [dataclasses.asdict(t) for t in result.throughput],
            "write_amplification": round(v.write_amplification, 4),
            "fault_write_amplification": [None if f.write_amplification is None else round(f.write_amplification, 4)
                                          for f in v.faults],
            "nemesis_errors": list(result.nemesis_errors), "passed": result.passed,
            **({"workload": "txn", **{k: getattr(result.txn, k) for k in _TXN_KEYS}} if result.txn is not None else {}),
            **({"workload": "compacted", "compacted_partitions": result.manifests, "keys": result.compacted.keys, "keys_lost": len(result.compacted.lost),
                "keys_unknown": len(result.compacted.unknown)} if result.compacted is not None else {})}


_TXN_KEYS = ("transactions", "committed", "aborted", "in_doubt", "aborted_visible", "torn", "read_missed",
             "read_duplicates")
