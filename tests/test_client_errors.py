"""Errors a user can act on: a broker that cannot be reached is named, with the cause in words."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from memq.client.cluster import fetch_metadata
from memq.client.producer import Producer
from memq.config import ProducerConfig
from memq.errors import BrokerUnavailableError

MEMQ = str(Path(sys.executable).with_name("memq"))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metadata_from_a_closed_port_names_url_and_cause() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(BrokerUnavailableError, match=f"cannot connect to broker {url}: connection refused"):
        fetch_metadata(url, 2.0)


def test_producer_to_a_closed_port_names_url_and_cause() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"

    async def run() -> None:
        async with Producer(ProducerConfig(brokers=url, request_timeout_ms=2000)) as producer:
            await producer.send("events", b"x")

    with pytest.raises(BrokerUnavailableError) as err:
        asyncio.run(run())
    assert f"cannot connect to broker {url}: connection refused" in str(err.value)
    assert "ConnectionKey" not in str(err.value)


def test_cli_produce_to_a_closed_port_says_so_in_words(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    run = subprocess.run([MEMQ, "produce", "events", "-n", "1"], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "MEMQ_PRODUCER_BROKERS": url,
                              "MEMQ_PRODUCER_REQUEST_TIMEOUT_MS": "2000"}, cwd=tmp_path)
    assert run.returncode != 0
    assert f"cannot connect to broker {url}: connection refused" in run.stderr
    assert "ConnectionKey" not in run.stderr + run.stdout
