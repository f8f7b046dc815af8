"""The soak and long fault tests the default suite leaves out (`@pytest.mark.slow`): chaos runs
across namespace hosts, a Kafka frozen past the brokers' timeouts, ... Run here so the default
suite stays within its time budget while every one of them still runs somewhere.

`python -m bench soak` runs them all (the container image build too with `--container`);
`--quick` runs only the files named in `QUICK`. Fails (exit 1) when a test fails.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The soaks that take a minute or two each: what `--quick` runs.
QUICK = ("tests/test_chaos.py", "tests/test_long_stall.py")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--container", action="store_true",
                        help="also build and run the OCI image (podman; tests/test_image.py)")


def run(quick: bool = False, container: bool = False) -> dict[str, object]:
    marks = "slow" if container else "slow and not container"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", marks, "-n", "2", "-q",
           "--durations=10", *(QUICK if quick else ())]
    print("running:", " ".join(cmd[1:]), flush=True)
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.monotonic() - start
    print(done.stdout[-6000:], flush=True)
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|error|errors|skipped)", done.stdout)}
    passed, failed = counts.get("passed", 0), counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    if done.returncode not in (0, 5) or failed:   # 5: nothing selected
        raise SystemExit(f"bench soak: {failed} failed (pytest exit {done.returncode})")
    return {"ratios": {"passed_of_run": round(passed / max(passed + failed, 1), 3)},
            "passed": passed, "skipped": counts.get("skipped", 0), "seconds": round(seconds, 1)}
