"""Run a job in its own process until it reaches a named step, then SIGKILL it: a real crash at
that step, not an exception the job could see or clean up after.

The job writes `marker` when it reaches the step, holding the process group of the process that
reached it (`os.getpgid(0)`), then waits to be killed. Both that group and the job's own session
are killed: Spark's Python workers run in a process group of their own, under the JVM."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from tests.support.waiting import wait_for


def kill_at_marker(args: list[str], marker: Path, timeout_s: float = 120) -> None:
    """Start `args` in a new session; once `marker` exists, SIGKILL the session and the marker's group."""
    proc = subprocess.Popen(args, start_new_session=True)
    try:
        def reached() -> bool:
            assert proc.poll() is None, f"the job exited ({proc.returncode}) before {marker.stem}"
            return marker.exists() and marker.read_text().strip() != ""
        wait_for(reached, timeout_s, f"the job to reach {marker.stem}")
        for group in {proc.pid, int(marker.read_text())}:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
