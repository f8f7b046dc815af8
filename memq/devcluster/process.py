"""Child processes that cannot outlive their parent, and the small waits around them.

Every server the dev cluster starts runs in its own session (so `stop` can signal the whole
process group) with `PR_SET_PDEATHSIG=SIGKILL` (so the kernel kills it when the parent dies,
even by SIGKILL, when no `atexit` or `finally` runs). The death signal fires when the *thread*
that spawned the child exits, so spawn from a long-lived thread (the main thread).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from memq.errors import DevClusterError

log = logging.getLogger("memq.devcluster")

_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (callers retry if it is taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent(prctl: Callable[..., int], parent_pid: int) -> None:
    """Runs in the child between fork and exec: ask for SIGKILL when the parent goes away."""
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


@dataclass
class ManagedProcess:
    """A child process with its own process group and a log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The end of the log, for error messages."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL it if it has not exited after `timeout_s`."""
        if self.popen.returncode is None:
            for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.popen.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.popen.wait(wait_s)
                    break
                except subprocess.TimeoutExpired:
                    log.info("%s (pid %d) still running %.1f s after %s", self.name, self.pid, wait_s, sig.name)
            if self.popen.poll() is None:
                raise DevClusterError(f"{self.name} (pid {self.pid}) did not exit after SIGKILL")
        _reap_group(self.popen.pid)


def _reap_group(pgid: int) -> None:
    """Kill what is left of a process group (grandchildren a server may have started)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def spawn(name: str, argv: Sequence[str], *, log_path: Path, cwd: Path | None = None,
          env: dict[str, str] | None = None) -> ManagedProcess:
    """Start `argv` in a new session, stdout+stderr appended to `log_path`, dying with us."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    preexec = None
    if sys.platform == "linux":
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        parent = os.getpid()
        preexec = lambda: _die_with_parent(prctl, parent)  # noqa: E731
    with open(log_path, "ab") as out:
        try:
            popen = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=cwd, env=env, start_new_session=True, preexec_fn=preexec)
        except OSError as e:
            raise DevClusterError(f"cannot start {name} ({argv[0]}): {e}") from None
    log.debug("%s: pid %d: %s", name, popen.pid, " ".join(argv))
    return ManagedProcess(name, popen, log_path)


def wait_ready(proc: ManagedProcess, probe: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `probe` until it answers True (-> True) or the process exits (-> False).

    Raises DevClusterError naming the server and quoting its log when `timeout_s` passes.
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while True:
        if not proc.alive():
            return False
        if probe():
            return True
        if time.monotonic() > deadline:
            raise DevClusterError(
                f"{proc.name} (pid {proc.pid}) not ready after {timeout_s:.0f} s; "
                f"log {proc.log_path}:\n{proc.log_tail()}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)
