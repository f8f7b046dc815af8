"""Chaos: memq under a seeded nemesis across namespace hosts (see memq/chaos).

`python -m bench chaos [--quick]` runs the default schedule (quick: 60 s of faults today's code
survives); `python -m bench.chaos [--minutes N] [--seed S] [--kinds K,K] [--quick]` chooses
(bench/__main__ passes only --quick). Prints the per-fault table, then the JSON line: keys
`faults`, `acked_lost`, `duplicates`, `dangling_pointers`, `max_write_gap_s` and `ratios`
(acked records kept, sends acked, write availability: higher is better). Needs root.
"""

from __future__ import annotations

import argparse
import json
import sys

from memq.chaos.nemesis import KINDS
from memq.chaos.run import RunSpec, run as run_chaos, summary, table
from memq.chaos.topology import unavailable

SURVIVABLE = ("kill", "cut-zk", "pause:s3")
DEFAULT_SEED = 1


def run(quick: bool, minutes: float | None = None, seed: int = DEFAULT_SEED,
        kinds: tuple[str, ...] | None = None) -> dict[str, object]:
    why = unavailable()
    if why:
        raise SystemExit(f"bench chaos: {why}")
    seconds = 60.0 * (minutes if minutes is not None else (1.0 if quick else 5.0))
    spec = RunSpec(seed=seed, seconds=seconds, kinds=kinds or (SURVIVABLE if quick else KINDS))
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, default=None)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--kinds", default=None, help=f"comma-separated, of {', '.join(KINDS)} (kind:target ok)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    kinds = tuple(args.kinds.split(",")) if args.kinds else None
    print(json.dumps({"bench": "chaos", **run(args.quick, args.minutes, args.seed, kinds)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
