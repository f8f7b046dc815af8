"""The `memq` command as a user runs it: its console script in a subprocess, `memq dev` started
and stopped (leaving no process behind), `memq consume` read until given lines came."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

MEMQ = str(Path(sys.executable).with_name("memq"))


def memq(*args: str, config: Path | None = None, input: bytes | None = None, timeout: float = 60,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """`memq ARGS` run to its end, without the caller's MEMQ_* environment (plus `env`)."""
    argv = [MEMQ, *(["--config", str(config)] if config else []), *args]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    return subprocess.run(argv, input=input, capture_output=True, timeout=timeout, env={**clean, **(env or {})})


def processes_under(run_dir: Path) -> list[int]:
    """Live processes whose command line or working directory points into `run_dir`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if str(run_dir) in cmd or cwd.startswith(str(run_dir)):
            found.append(int(entry.name))
    return found


def _ctrl_c_as_from_a_terminal() -> None:
    """In the child before exec: SIGINT handled by default and not blocked, as a terminal's
    command gets it. The suite may run with SIGINT ignored (a background job of a
    non-interactive shell), a child inherits that, and a Ctrl-C sent to it would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


def consume_until(config: Path, topic: str, wanted: set[str], timeout_s: float = 60) -> list[str]:
    """Run `memq consume` (demo traffic never goes idle) until `wanted` lines came, then
    Ctrl-C it, which must end it cleanly."""
    with tempfile.TemporaryFile() as stderr:   # a file, not a pipe: nobody reads it until the end
        proc = subprocess.Popen([MEMQ, "--config", str(config), "consume", topic, "--group",
                                 f"check-{uuid.uuid4().hex[:6]}", "--from-beginning"],
                                stdout=subprocess.PIPE, stderr=stderr, preexec_fn=_ctrl_c_as_from_a_terminal)

        def why() -> str:
            stderr.seek(0)
            return stderr.read().decode(errors="replace")[-12000:]
        values: list[str] = []
        try:
            deadline = time.monotonic() + timeout_s
            assert proc.stdout is not None
            while not wanted <= set(values):
                assert time.monotonic() < deadline and proc.poll() is None, \
                    f"wanted {wanted} not consumed (exit {proc.poll()}); memq consume said:\n{why()}"
                values.append(proc.stdout.readline().decode().rstrip("\n"))
            proc.send_signal(signal.SIGINT)
            try:   # read on to the end: demo traffic that fills the pipe would block its writes forever
                proc.communicate(timeout=60)
                assert proc.returncode == 0, why()
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGUSR1)     # memq prints its threads' stacks
                time.sleep(1)
                raise AssertionError(f"memq consume did not end 60 s after Ctrl-C; it said:\n{why()}") from None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return values


def start_dev(run_dir: Path, *args: str) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """`memq dev` in its own session, and the `name: value` endpoint lines it printed; its `try:`
    commands, one per line, under "try"."""
    proc = subprocess.Popen([MEMQ, "dev", "--duration", "150", "--run-dir", str(run_dir), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    endpoints: dict[str, str] = {}
    seen: list[str] = []
    deadline = time.monotonic() + 90
    assert proc.stdout is not None
    tried: list[str] = []
    while not seen or not seen[-1].startswith("Ctrl-C"):
        if time.monotonic() > deadline or proc.poll() is not None:
            with contextlib.suppress(ProcessLookupError):   # it may have exited: say why, not that
                os.killpg(proc.pid, signal.SIGKILL)
            rest = proc.stdout.read().decode(errors="replace") if proc.wait(10) is not None else ""
            raise AssertionError(f"memq dev did not start (exit {proc.returncode}): "
                                 f"{''.join(seen[-20:])}{rest[-4000:]}")
        line = proc.stdout.readline().decode(errors="replace")
        seen.append(line)
        if line.startswith("try:") or (tried and line.startswith(" ")):
            tried.append(line.removeprefix("try:").strip())
        elif m := re.match(r"^(\w[\w ]*):\s+(\S.*)$", line):
            endpoints[m.group(1)] = m.group(2).strip()
    endpoints["try"] = "\n".join(tried)
    return proc, endpoints


def stop_dev(proc: subprocess.Popen[bytes], run_dir: Path) -> str:
    """SIGTERM `memq dev`: it exits 0 and leaves no process behind. Returns its last output."""
    try:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert proc.stdout is not None
        tail = proc.stdout.read().decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    deadline = time.monotonic() + 10
    while (left := processes_under(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"processes left behind: {left}"
    return tail
