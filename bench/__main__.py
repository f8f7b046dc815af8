"""Run one benchmark: `python -m bench NAME [--quick]`.

Each benchmark is a module `bench/NAME.py` with `run(quick: bool) -> dict`. The dict holds
`ratios` (memq over the peer or limit, higher is better) and the raw figures behind them;
this runner prints it as the last line of stdout, after the benchmark's own progress lines.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from pathlib import Path


def available() -> list[str]:
    here = Path(__file__).parent
    return sorted(m.name for m in pkgutil.iter_modules([str(here)]) if not m.name.startswith("_"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("name", choices=available())
    parser.add_argument("--quick", action="store_true", help="smaller run, under 60 s")
    args = parser.parse_args(argv)
    module = importlib.import_module(f"bench.{args.name}")
    result = module.run(quick=args.quick)
    out = {"bench": args.name, **result}
    print(json.dumps(out, sort_keys=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
