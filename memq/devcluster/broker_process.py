"""Real broker processes for tests, benchmarks and `memq dev`.

`BrokerProcess(config, run_dir).start()` writes the config as TOML, runs
`python -m memq.broker --config FILE` (dying with its parent), waits for `/healthz`, and can
stop it with SIGTERM (graceful: flush, store, ack) or kill it with SIGKILL (crash tests).
A `launcher` prefix runs it elsewhere, e.g. `ip netns exec HOST` for the fault harness.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memq.config import MemqConfig
from memq.devcluster.process import ManagedProcess, free_port, spawn, wait_ready
from memq.errors import DevClusterError
from memq.security.tls import client_context

PORT_ATTEMPTS = 3


def config_toml(config: MemqConfig) -> str:
    """`config` as TOML that `load_config` reads back to an equal MemqConfig (None = omitted)."""
    lines: list[str] = []

    def table(header: str, obj: Any) -> None:
        lines.append(header)
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is not None:
                lines.append(f"{f.name} = {_toml_value(value)}")
        lines.append("")

    for f in dataclasses.fields(config):
        if f.name != "topics":
            table(f"[{f.name}]", getattr(config, f.name))
    for topic in config.topics:
        table("[[topics]]", topic)
    return "\n".join(lines)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(map(_toml_value, value)) + "]"
    return json.dumps(str(value))   # a JSON string is a valid TOML basic string


class BrokerProcess:
    """One broker in its own process; `url` is set once it answers /healthz."""

    def __init__(self, config: MemqConfig, run_dir: str | Path, *, launcher: Sequence[str] = ()) -> None:
        self.config = config
        self.run_dir = Path(run_dir)
        self.broker_id = config.broker.broker_id
        self.launcher = tuple(launcher)
        self.url = ""
        self._launched_url = ""
        self._proc: ManagedProcess | None = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise DevClusterError(f"broker {self.broker_id} is not running")
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc is not None and self._proc.alive()

    def start(self, timeout_s: float = 30.0) -> BrokerProcess:
        """Start on a free port (a new one if the chosen port was taken meanwhile)."""
        return self.launch().ready(timeout_s)

    def launch(self) -> BrokerProcess:
        """Spawn the process without waiting for it (`ready` waits): brokers launched together
        import and start at the same time. Call from the thread that outlives it: the kernel
        kills a child when the thread that spawned it exits (PR_SET_PDEATHSIG)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        port = self.config.broker.port or free_port()
        broker = dataclasses.replace(self.config.broker, port=port, advertised_url=self.config.broker.advertised_url)
        path = self.run_dir / f"broker-{self.broker_id}.toml"
        path.write_text(config_toml(dataclasses.replace(self.config, broker=broker)))
        scheme = "https" if self.config.security.tls_cert_file else "http"
        self._launched_url = broker.advertised_url or f"{scheme}://{broker.host}:{port}"
        argv = [*self.launcher, sys.executable, "-m", "memq.broker", "--config", str(path)]
        self._proc = spawn(f"broker-{self.broker_id}", argv, log_path=self.run_dir / f"broker-{self.broker_id}.log")
        return self

    def ready(self, timeout_s: float = 30.0) -> BrokerProcess:
        """Once the launched broker answers /healthz; launched again on another free port when it
        exited (its port was taken meanwhile), up to PORT_ATTEMPTS launches."""
        trust = probe_trust(self.config)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            url = self._launched_url
            if self._proc is not None and wait_ready(self._proc, lambda: _healthy(url, trust), timeout_s):
                self.url = url
                return self
            if self.config.broker.port or attempt == PORT_ATTEMPTS:
                break
            self.launch()
        log = self._proc.log_tail() if self._proc else ""
        raise DevClusterError(f"broker {self.broker_id} did not start; log:\n{log}")

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (the broker drains: flushes, stores and acks), SIGKILL after `timeout_s`."""
        if self._proc is not None:
            self._proc.stop(timeout_s)

    def kill(self) -> None:
        """SIGKILL now: a crash, nothing flushed."""
        if self._proc is not None and self._proc.alive():
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.popen.wait(10)

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.popen.poll()

    def log_tail(self) -> str:
        return self._proc.log_tail() if self._proc else ""

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def probe_trust(config: MemqConfig) -> ssl.SSLContext | None:
    """How to verify a broker of `config` when probing it: an https broker (security.tls_cert_file
    set) against producer.tls_ca_file, as its clients do; None for a plaintext one."""
    return client_context(config.producer.tls_ca_file) if config.security.tls_cert_file else None


def _healthy(url: str, trust: ssl.SSLContext | None) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=1.0, context=trust) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False
