"""Errors a user can act on: a broker that cannot be reached is named, with the cause in words;
a Message over the broker's frame limit fails at once, naming both sizes."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from memq.client._metadata import TopicRouter
from memq.client.cluster import fetch_metadata
from memq.client.producer import Producer
from memq.config import BrokerConfig, MemqConfig, ProducerConfig, StorageConfig, TopicConfig
from memq.errors import BrokerUnavailableError, MessageTooLargeError
from tests.support.inproc import broker_in_thread

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


def _small_frame_broker(tmp_path: Path) -> MemqConfig:
    return MemqConfig(storage=StorageConfig(kind="file", root_dir=str(tmp_path)),
                      broker=BrokerConfig(max_frame_bytes=64 * 1024), topics=(TopicConfig("t1"),))


def test_producer_refuses_a_message_over_the_brokers_frame_limit_and_sends_the_rest(tmp_path: Path) -> None:
    async def run(url: str) -> None:
        config = ProducerConfig(brokers=url, codec="none", max_message_bytes=1024 * 1024, retries=5)
        async with Producer(config) as producer:
            big = await producer.send("t1", os.urandom(200_000))
            await producer.flush()
            with pytest.raises(MessageTooLargeError,
                               match=r"Message of 2\d{5} bytes is over broker .*broker.max_frame_bytes=65536"):
                await big
            assert (await (await producer.send("t1", b"small"))).count == 1

    with broker_in_thread(_small_frame_broker(tmp_path)) as url:
        asyncio.run(run(url))


def test_producer_that_does_not_know_the_limit_fails_the_message_once_on_1009(tmp_path: Path) -> None:
    class Unsaid(TopicRouter):   # metadata from a broker that does not say its frame limit
        def frame_limit(self, url: str) -> int:
            return 0

    async def run(url: str) -> None:
        config = ProducerConfig(brokers=url, codec="none", max_message_bytes=1024 * 1024, retries=5)
        session = aiohttp.ClientSession()
        async with Producer(config, router=Unsaid([url], session, timeout_s=5.0)) as producer:
            big = await producer.send("t1", os.urandom(200_000))
            await producer.flush()
            with pytest.raises(MessageTooLargeError, match="refused a Message of 2\\d{5} bytes .*max_frame_bytes"):
                await big
            assert (await (await producer.send("t1", b"small"))).count == 1
        await session.close()

    with broker_in_thread(_small_frame_broker(tmp_path)) as url:
        asyncio.run(run(url))


def test_cli_produce_over_the_frame_limit_names_both_sizes_without_retrying(tmp_path: Path) -> None:
    with broker_in_thread(_small_frame_broker(tmp_path)) as url:
        run = subprocess.run([MEMQ, "produce", "t1", "-n", "1", "--size", "300000"], capture_output=True, text=True,
                             timeout=60, cwd=tmp_path,
                             env={"PATH": "/usr/bin:/bin", "MEMQ_PRODUCER_BROKERS": url, "MEMQ_PRODUCER_CODEC": "none",
                                  "MEMQ_PRODUCER_MAX_MESSAGE_BYTES": str(1024 * 1024)})
    assert run.returncode != 0
    assert "broker.max_frame_bytes=65536" in run.stderr and "Message of 3" in run.stderr, run.stderr
    assert "attempts" not in run.stderr and "1006" not in run.stderr
