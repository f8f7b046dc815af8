"""The chaos harness's S3 fault proxy (a process, as in the harness) in front of the real moto
server: SlowDown and a tail for a share of requests, set at any time by its control file."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.support.waiting import wait_for

from memq.chaos.nemesis import HTTP_FAULTS, schedule
from memq.chaos.s3faults import RequestCount, S3Faults, local_fault_proxy
from memq.config import MemqConfig
from memq.devcluster.process import free_port
from memq.errors import ConfigError, RetryBudgetExhaustedError
from memq.storage import S3StorageHandler

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_control_file_round_trip_and_bad_values(tmp_path: Path) -> None:
    control = tmp_path / "faults.json"
    assert S3Faults.read(control) == S3Faults()
    S3Faults(slowdown_share=0.3).write(control)
    assert S3Faults.read(control) == S3Faults(slowdown_share=0.3)
    with pytest.raises(ConfigError, match="shares"):
        S3Faults(tail_share=1.5)


def test_slowdown_and_tail_faults_target_s3() -> None:
    faults = schedule(3, ["slowdown", "tail"], total_s=200, brokers=["b1", "b2"])
    assert {f.kind for f in faults} == {"slowdown", "tail"} and {f.target for f in faults} == {"s3"}
    assert HTTP_FAULTS["slowdown"].slowdown_share == 0.3 and HTTP_FAULTS["tail"].tail_share == 0.02


@pytest.fixture
def fault_proxy(memq_config: MemqConfig, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(URL, control file) of an S3 fault proxy process in front of the dev cluster's moto; its
    request counts go to `counts.jsonl` next to the control file."""
    upstream = (memq_config.s3.endpoint_url or "").removeprefix("http://")
    port, control = free_port(), tmp_path / "faults.json"
    proc = subprocess.Popen([sys.executable, "-m", "memq.chaos.s3faults", "--listen", f"127.0.0.1:{port}",
                             "--upstream", upstream, "--control", str(control),
                             "--counts", str(tmp_path / "counts.jsonl")])
    try:
        wait_for(lambda: proc.poll() is None and _connects(port), 20, "the S3 fault proxy to listen")
        yield f"http://127.0.0.1:{port}", control
    finally:
        proc.kill()
        proc.wait(10)


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


async def test_the_proxy_answers_slowdown_and_holds_a_tail_as_told(
        memq_config: MemqConfig, fault_proxy: tuple[str, Path], unique_name: Callable[[str], str]) -> None:
    url, control = fault_proxy
    s3 = dataclasses.replace(memq_config.s3, endpoint_url=url, max_attempts=3, base_backoff_s=0.01,
                             max_backoff_s=0.02)
    handler = S3StorageHandler(s3, cluster=unique_name("c"))
    try:
        loc = await handler.put_batch("t", b"through", first_request_id=1, timestamp_ms=1, broker_id="b")
        assert await handler.get(loc) == b"through"

        S3Faults(slowdown_share=1.0).write(control)
        await asyncio.sleep(0.5)   # the proxy polls its control file
        with pytest.raises(RetryBudgetExhaustedError, match="SlowDown"):
            await handler.get(loc)

        S3Faults(tail_share=1.0, tail_delay_s=0.4).write(control)
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        assert await handler.get_range(loc, 0, 3) == b"thr"
        assert time.monotonic() - t0 >= 0.4
    finally:
        await handler.close()
    # Every request reached the proxy's counts, the refused ones among them (the GET's attempts).
    counts = control.with_name("counts.jsonl")
    wait_for(lambda: (c := RequestCount.load(counts)) and c[-1].requests >= 6, 10, "the proxy to write its counts")
    last = RequestCount.load(counts)[-1]
    assert last.slowdowns >= 1 and last.requests - last.slowdowns >= 3


def test_a_local_fault_proxy_forwards_and_stops(memq_config: MemqConfig, tmp_path: Path) -> None:
    with local_fault_proxy(memq_config.s3.endpoint_url or "", tmp_path, S3Faults(slowdown_share=1.0)) as proxy:
        port = int(proxy.url.rsplit(":", 1)[1])
        assert _connects(port)
        assert S3Faults.read(proxy.control).slowdown_share == 1.0
        proxy.set(S3Faults())
        assert S3Faults.read(proxy.control) == S3Faults()
    assert not _connects(port)
