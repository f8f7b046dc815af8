"""The audit across a restart of `memq dev` (`memq topic create` on it: test_cli.py's one-broker
`memq dev` test)."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.support.cli import consume_until, memq, start_dev, stop_dev

pytestmark = [pytest.mark.integration]


def audit_rows(url: str) -> dict[tuple[str, str], dict]:
    with urllib.request.urlopen(url + "api/summary", timeout=10) as resp:
        return {(r["topic"], r["group"]): r for r in json.load(resp)["rows"]}


@pytest.mark.timeout(300)
@pytest.mark.slow   # a soak (faults or scale played out for 20-60 s): `python -m bench soak`
def test_a_restarted_memq_dev_audits_new_topics_and_counts_nothing_old_as_lost(tmp_path: Path) -> None:
    run_dir = (tmp_path / "dev").resolve()
    proc, endpoints = start_dev(run_dir, "--brokers", "1", "--rate", "100")
    try:
        time.sleep(8)                                       # demo traffic in flight when it stops
        assert audit_rows(endpoints["audit"])
    finally:
        stop_dev(proc, run_dir)
    proc, endpoints = start_dev(run_dir, "--brokers", "1", "--rate", "0")
    try:
        config, url = Path(endpoints["config"]), endpoints["audit"]
        r = memq("topic", "create", "fresh", config=config, timeout=90)
        assert r.returncode == 0, r.stderr.decode()
        marker = uuid.uuid4().hex
        r = memq("produce", "fresh", config=config, input=f"{marker} a\n{marker} b\n".encode())
        assert r.returncode == 0, r.stderr.decode()
        consume_until(config, "fresh", {f"{marker} a", f"{marker} b"})
        deadline = time.monotonic() + 10                    # one live window
        while not any(t == "fresh" and row["produced"] == 2 for (t, _), row in audit_rows(url).items()):
            assert time.monotonic() < deadline, audit_rows(url)
            time.sleep(0.5)
        rows = audit_rows(url)
        assert all(row["lost"] == 0 for row in rows.values()), rows
        assert [row["produced"] for (t, _), row in rows.items() if t == "demo"] in ([], [0]), rows
    finally:
        stop_dev(proc, run_dir)
