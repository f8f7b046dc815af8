"""Hosts on one machine: a network namespace per host, each a veth pair on one bridge.

The bridge lives in the root namespace, so the harness itself (root namespace) can reach every
host for setup and the final independent read, while faults are applied inside each host's
namespace (iptables, tc) and therefore cut exactly that host's traffic. Names and the /24 subnet
are unique per run; `close()` (also registered with atexit) removes every namespace and link,
even after a failed start. A harness that was SIGKILLed runs neither, so `sweep_stale` removes
what such a run left (its namespaces hold no process any more: every process the harness
starts dies with it). Needs root and the `ip`, `iptables` and `tc` tools.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from memq.errors import DevClusterError

TOOLS = ("ip", "iptables", "tc")
CMD_TIMEOUT_S = 10.0
PREFIX = "mq"
"""Every namespace is `mq<run id>-<host>`, every link `mq<run id>v<n>` or `mqbr<run id>`."""
_NETNS = re.compile(rf"^{PREFIX}([0-9a-f]{{6}})-")
_LINK = re.compile(rf"^{PREFIX}(?:br([0-9a-f]{{6}})|([0-9a-f]{{6}})v\d+)$")


def unavailable() -> str | None:
    """Why namespaces cannot be used here (not root, a tool missing), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    return f"missing tools: {', '.join(missing)}" if missing else None


@dataclass(frozen=True)
class Host:
    name: str       # logical: "b1", "s3", "producer"
    netns: str
    ip: str
    link: str       # the veth end on the bridge (root namespace)


def sh(*argv: str) -> str:
    """Run a tool, raise DevClusterError with its stderr when it fails."""
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DevClusterError(f"{' '.join(argv)}: {e}") from None
    if res.returncode != 0:
        raise DevClusterError(f"{' '.join(argv)} exited {res.returncode}: {res.stderr.strip()}")
    return res.stdout


def stale(netns: Mapping[str, bool], links: Iterable[str]) -> tuple[list[str], list[str]]:
    """The harness namespaces and links to remove, given every namespace (-> whether a process
    runs in it) and every link name: those of runs with no process left in any namespace."""
    live = {m.group(1) for name, busy in netns.items() if busy and (m := _NETNS.match(name))}
    dead_ns = sorted(n for n in netns if (m := _NETNS.match(n)) and m.group(1) not in live)
    dead_links = sorted(n for n in links if (m := _LINK.match(n)) and (m.group(1) or m.group(2)) not in live)
    return dead_ns, dead_links


def sweep_stale() -> list[str]:
    """Remove the namespaces and links an earlier, killed harness left; their names."""
    names = [line.split()[0] for line in sh("ip", "netns", "list").splitlines() if line.strip()]
    netns = {n: bool(sh("ip", "netns", "pids", n).strip()) for n in names if _NETNS.match(n)}
    links = [line.split(":")[1].strip().split("@")[0] for line in sh("ip", "-o", "link", "show").splitlines()]
    dead_ns, dead_links = stale(netns, links)
    for n in dead_ns:
        sh("ip", "netns", "del", n)
    for n in dead_links:   # a veth went with its peer's namespace: gone already is fine
        subprocess.run(["ip", "link", "del", n], capture_output=True, timeout=CMD_TIMEOUT_S)
    return dead_ns + dead_links


class Topology:
    """`with Topology(["b1", "s3", ...]) as t:` then `t.hosts["b1"].ip`, `t.exec_argv("b1", argv)`."""

    def __init__(self, names: Sequence[str], run_id: str | None = None) -> None:
        if len(set(names)) != len(names) or not 0 < len(names) < 250:
            raise DevClusterError(f"host names must be unique, 1..249 of them: {list(names)}")
        self.run_id = run_id or uuid.uuid4().hex[:6]
        rid = int(self.run_id, 16)
        self.subnet = f"10.{100 + rid % 150}.{(rid >> 8) % 256}"
        self.bridge = f"{PREFIX}br{self.run_id}"
        self.gateway = f"{self.subnet}.1"
        self.hosts = {n: Host(n, f"{PREFIX}{self.run_id}-{n}", f"{self.subnet}.{i + 2}", f"{PREFIX}{self.run_id}v{i}")
                      for i, n in enumerate(names)}
        self._made: list[tuple[str, str]] = []   # ("netns"|"link", name), removed in reverse

    def start(self) -> Topology:
        atexit.register(self.close)
        try:
            sh("ip", "link", "add", self.bridge, "type", "bridge")
            self._made.append(("link", self.bridge))
            sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            sh("ip", "link", "set", self.bridge, "up")
            for h in self.hosts.values():
                sh("ip", "netns", "add", h.netns)
                self._made.append(("netns", h.netns))
                sh("ip", "link", "add", h.link, "type", "veth", "peer", "name", "eth0", "netns", h.netns)
                self._made.append(("link", h.link))
                sh("ip", "link", "set", h.link, "master", self.bridge, "up")
                sh("ip", "-n", h.netns, "addr", "add", f"{h.ip}/24", "dev", "eth0")
                sh("ip", "-n", h.netns, "link", "set", "eth0", "up")
                sh("ip", "-n", h.netns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Remove every namespace (its processes' sockets go with it) and link. Idempotent."""
        atexit.unregister(self.close)
        while self._made:
            kind, name = self._made.pop()
            argv = ("ip", "netns", "del", name) if kind == "netns" else ("ip", "link", "del", name)
            subprocess.run(argv, capture_output=True, timeout=CMD_TIMEOUT_S)

    def __enter__(self) -> Topology:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """`argv` run inside `host` (`ip netns exec` execs it: the pid is the program's)."""
        return ["ip", "netns", "exec", self.hosts[host].netns, *argv]

    def run(self, host: str, *argv: str) -> str:
        return sh(*self.exec_argv(host, argv))
