"""Chaos: memq under a seeded nemesis across namespace hosts (see memq/chaos).

`python -m bench chaos [--minutes N] [--seed S] [--kinds K,K] [--fault-s S] [--delay-ms D --jitter-ms J]
[--reader memq|kafka] [--workload plain|txn|compacted] [--quick]`:
the default schedule draws every fault kind for 5 minutes (quick: 60 s of faults today's code survives),
each fault lasting 5-12 s (`--fault-s`: exactly S). Prints the per-fault table, then the JSON line: keys
`faults`, `acked_lost`, `duplicates`, `dangling_pointers`, `max_write_gap_s`, per fault `failed` and
`throughput` (S3 requests per second before, during and after it when an HTTP fault kind runs,
acks per second, seconds from the heal until acks are back to normal: memq.chaos.throughput) and
`ratios` (acked records kept, sends acked, write availability: higher is better). Needs root.
A SlowDown storm: `--kinds slowdown:s3 --fault-s 20 --minutes 1.5`. `--reader kafka`: the workload
reads as a confluent-kafka consumer group through the brokers' Kafka listeners instead of memq's
Consumer (`missed` then counts acked records the Kafka group never received; `duplicates`, its
redeliveries since the last commit and the producers' resends, which Kafka readers get as stored).
`--workload txn`: the producers write transactions of memq's Producer (a transactional id each),
committing most and aborting a fifth; after the run a new reader reads the topic from the start.
The JSON adds `transactions`, `committed`, `aborted`, `in_doubt` (records), `aborted_visible`
(records of aborted transactions reachable or read: must be 0), `torn` (transactions partly
visible: 0), `read_missed` and `read_duplicates` (the read_committed reader's: 0); `acked_lost`
counts committed records. `--workload compacted`: the topic is compacted by the brokers during the
run; after it a new reader reads its state from earliest (compacted prefix, then tail). The JSON
adds `compacted_partitions` (partitions with a manifest at the end), `keys` (keys with an acked write), `keys_lost` (keys whose latest acked value did not survive:
must be 0) and `keys_unknown` (keys that read a record never written to them: 0).
"""

from __future__ import annotations

import argparse

from memq.chaos.nemesis import KINDS
from memq.chaos.run import RunSpec, run as run_chaos, summary, table
from memq.chaos.topology import unavailable
from memq.chaos.workload import READERS, WORKLOADS

SURVIVABLE = ("kill", "cut-zk", "pause:s3")
DEFAULT_SEED = 1
DELAY_MS = RunSpec.delay_s * 1000
JITTER_MS = RunSpec.jitter_s * 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=None)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--kinds", type=lambda s: tuple(s.split(",")), default=None,
                        help=f"comma-separated, of {', '.join(KINDS)} (kind:target ok)")
    parser.add_argument("--fault-s", type=float, default=None, help="every fault lasts this long")
    parser.add_argument("--delay-ms", type=float, default=DELAY_MS, help="delay faults: extra one-way latency")
    parser.add_argument("--jitter-ms", type=float, default=JITTER_MS, help="delay faults: plus or minus up to this")
    parser.add_argument("--reader", choices=READERS, default="memq",
                        help="the workload's group reader: memq's Consumer or a Kafka consumer group")
    parser.add_argument("--workload", choices=WORKLOADS, default="plain",
                        help="plain sends, or transactions committed or aborted (memq's Producer)")


def run(quick: bool, minutes: float | None = None, seed: int = DEFAULT_SEED,
        kinds: tuple[str, ...] | None = None, fault_s: float | None = None, delay_ms: float = DELAY_MS,
        jitter_ms: float = JITTER_MS, reader: str = "memq", workload: str = "plain") -> dict[str, object]:
    why = unavailable()
    if why:
        raise SystemExit(f"bench chaos: {why}")
    seconds = 60.0 * (minutes if minutes is not None else (1.0 if quick else 5.0))
    spec = RunSpec(seed=seed, seconds=seconds, kinds=kinds or (SURVIVABLE if quick else KINDS),
                   delay_s=delay_ms / 1000, jitter_s=jitter_ms / 1000, reader=reader, workload=workload,
                   **({"durations": (fault_s, fault_s)} if fault_s else {}))
    result = run_chaos(spec, log=lambda s: print(s, flush=True))
    print(table(result), flush=True)
    out = summary(result)
    v = result.verdict
    out["ratios"] = {
        "acked_kept": (v.acked - v.acked_lost) / v.acked if v.acked else 0.0,
        "sends_acked": v.acked / v.sends if v.sends else 0.0,
        "write_availability": max(0.0, 1.0 - v.max_write_gap_s / seconds),
    }
    return out
