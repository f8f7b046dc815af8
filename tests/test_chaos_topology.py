"""What a killed harness left is swept, and only that: names with the harness's prefix, of runs
with no process left in any of their namespaces."""

from __future__ import annotations

import subprocess

import pytest

from memq.chaos.topology import Topology, sh, stale, sweep_stale, unavailable


def test_sweeps_only_dead_runs_with_the_harness_prefix() -> None:
    netns = {"mqa1b2c3-b1": False, "mqa1b2c3-s3": False,            # a killed run
             "mq00ff00-b1": True, "mq00ff00-s3": False,             # a live run (a server in b1)
             "other-ns": False, "mqnothex-b1": False}
    links = ["lo", "eth0", "mqbra1b2c3", "mqa1b2c3v0", "mqa1b2c3v11", "mqbr00ff00", "mq00ff00v1", "mqbrxyz"]
    assert stale(netns, links) == (["mqa1b2c3-b1", "mqa1b2c3-s3"], ["mqa1b2c3v0", "mqa1b2c3v11", "mqbra1b2c3"])


def test_a_topology_names_everything_so_it_can_be_swept() -> None:
    t = Topology(["b1", "s3"], run_id="0abc12")
    names = {h.netns: False for h in t.hosts.values()}
    assert stale(names, [t.bridge, *(h.link for h in t.hosts.values())]) == (
        sorted(names), sorted([t.bridge, *(h.link for h in t.hosts.values())]))



def test_sweep_removes_a_killed_runs_namespaces_and_links_and_keeps_a_live_run() -> None:
    """A run whose harness was SIGKILLed left namespaces without processes, a bridge and veths."""
    why = unavailable()
    if why:
        pytest.skip(f"chaos harness: {why}")
    left = Topology(["b1", "s3"]).start()
    left._made.clear()                       # as if SIGKILLed: it never cleans up after itself
    with Topology(["b1"]) as live:
        server = subprocess.Popen(live.exec_argv("b1", ["sleep", "60"]))
        try:
            swept = sweep_stale()
            assert set(swept) == {left.bridge, *(h.netns for h in left.hosts.values()),
                                  *(h.link for h in left.hosts.values())}
            netns, links = sh("ip", "netns", "list"), sh("ip", "-o", "link", "show")
            assert all(h.netns not in netns and h.link not in links for h in left.hosts.values())
            assert left.bridge not in links
            assert live.hosts["b1"].netns in netns and live.bridge in links
        finally:
            server.kill()
            server.wait(10)
