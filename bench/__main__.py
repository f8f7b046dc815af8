"""Run one benchmark: `python -m bench NAME [--quick] [its own options]`.

Each benchmark is a module `bench/NAME.py` with `run(quick: bool, **options) -> dict`; one that
takes options of its own declares them in `add_arguments(parser)`. The dict holds
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
    first = argparse.ArgumentParser(add_help=False)     # the name alone, so -h shows NAME's options
    first.add_argument("name", nargs="?", choices=available())
    given = first.parse_known_args(argv)[0].name
    if given is not None:
        bench_module = importlib.import_module(f"bench.{given}")
        if hasattr(bench_module, "add_arguments"):
            bench_module.add_arguments(parser)
    options = vars(parser.parse_args(argv))
    name = options.pop("name")
    module = importlib.import_module(f"bench.{name}")
    result = module.run(**options)
    out = {"bench": name, **result}
    print(json.dumps(out, sort_keys=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
