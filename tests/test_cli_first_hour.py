"""What a new user hits in the first hour, through the `memq` console script (issue 12):
Kafka unreachable, `consume --count` into a pipe, SIGTERM of `consume`, numbered generated
values, `/health` and `topic tail --notifications` (the `try:` lines of `memq dev` are run by
test_cli.py's one-broker `memq dev` test)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from memq.cli.dev import _memq_command
from memq.cli.produce import generated_value
from memq.config import BrokerConfig, MemqConfig, TopicConfig, load_config
from memq.devcluster import DevCluster
from memq.devcluster.broker_process import BrokerProcess, config_toml

MEMQ = str(Path(sys.executable).with_name("memq"))


def memq(*args: str, config: Path | None = None, timeout: float = 60,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    argv = [MEMQ, *(["--config", str(config)] if config else []), *args]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    return subprocess.run(argv, capture_output=True, timeout=timeout, env={**clean, **(env or {})})


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(120)
def test_unreachable_kafka_is_one_error_naming_it_well_before_the_request_timeout() -> None:
    """consume, status and topic list, run at once (each waits out the same short probe)."""
    port = _closed_port()
    # A request timeout of 60 s: before the fix each command waited it out (then failed vaguely).
    env = {"MEMQ_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}", "MEMQ_KAFKA_REQUEST_TIMEOUT_MS": "60000",
           "COLUMNS": "400"}   # `status` prints a table: no wrapping
    commands = [["consume", "events", "-n", "1"], ["status"], ["topic", "list"]]
    with ThreadPoolExecutor(len(commands)) as pool:
        runs = list(pool.map(lambda command: memq(*command, env=env, timeout=40), commands))
    for command, r in zip(commands, runs):
        out = (r.stdout + r.stderr).decode()
        assert r.returncode == 1, (command, out)
        assert f"Kafka at 127.0.0.1:{port} is unreachable" in out, (command, out)
        assert "FAIL" not in out and "rdkafka" not in out, (command, out)   # librdkafka's log is not on the terminal
        assert len(r.stderr.decode().splitlines()) <= 2, (command, out)


def test_generated_values_are_numbered_and_sized() -> None:
    assert generated_value(0, 10) == b"0 memqmemq"
    assert generated_value(12345, 3) == b"12345"
    assert len({generated_value(i, 100) for i in range(1000)}) == 1000


def test_dev_try_lines_name_the_memq_script_by_full_path() -> None:
    cmd = _memq_command()
    assert Path(cmd).is_absolute() and Path(cmd).name == "memq" and os.access(cmd, os.X_OK)
    r = subprocess.run([cmd, "--version"], capture_output=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and b"memq" in r.stdout


@pytest.fixture(scope="module")
def served(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str]]:
    """A broker process hosting one topic; (client config file, topic, broker URL)."""
    name = f"first-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path_factory.mktemp("first-hour")
    config = devcluster.config(topics=[TopicConfig(name=name, read_partitions=2)])
    with BrokerProcess(dataclasses.replace(config, broker=BrokerConfig(broker_id="first")), run_dir) as broker:
        client: MemqConfig = dataclasses.replace(config, producer=dataclasses.replace(config.producer, brokers=broker.url))
        path = run_dir / "client.toml"
        path.write_text(config_toml(client))
        r = memq("produce", name, "-n", "40", "--size", "20", config=path)
        assert r.returncode == 0, r.stderr.decode()
        yield path, name, broker.url


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_produce_n_sends_distinct_numbered_values(served: tuple[Path, str, str]) -> None:
    path, topic, _ = served
    r = memq("consume", topic, "--group", f"g-{uuid.uuid4().hex[:6]}", "-n", "40", "--idle-timeout", "20", config=path)
    assert r.returncode == 0, r.stderr.decode()
    values = r.stdout.splitlines()
    assert sorted(int(v.split()[0]) for v in values) == list(range(40))
    assert all(len(v) == 20 for v in values)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_consume_count_into_a_pipe_prints_the_summary_on_its_own_line(served: tuple[Path, str, str]) -> None:
    path, topic, _ = served
    r = memq("consume", topic, "--group", f"g-{uuid.uuid4().hex[:6]}", "--count", "-n", "40",
             "--idle-timeout", "20", config=path)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == b""
    assert re.search(rb"(?m)^40 messages from " + topic.encode() + rb" in ", r.stderr), r.stderr


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_sigterm_commits_what_was_delivered_prints_the_summary_and_exits_0(served: tuple[Path, str, str]) -> None:
    path, topic, _ = served
    group = f"g-{uuid.uuid4().hex[:6]}"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    proc = subprocess.Popen([MEMQ, "--config", str(path), "consume", topic, "--group", group],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean)
    try:
        assert proc.stdout is not None
        got = [proc.stdout.readline() for _ in range(40)]      # all 40 delivered (no -n: it would wait on)
        assert all(got)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err.decode()
    assert re.search(rb"(?m)^40 messages from ", err), err
    again = memq("consume", topic, "--group", group, "--idle-timeout", "3", config=path)
    assert again.returncode == 0 and again.stdout == b"", again.stderr.decode()   # the commit held


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_broker_answers_health_like_healthz(served: tuple[Path, str, str]) -> None:
    _, topic, url = served
    with urllib.request.urlopen(url + "/health", timeout=5) as health, \
            urllib.request.urlopen(url + "/healthz", timeout=5) as healthz:
        assert health.status == 200 and json.loads(health.read()) == json.loads(healthz.read())


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_topic_tail_prints_each_notification_as_json(served: tuple[Path, str, str]) -> None:
    path, topic, _ = served
    r = memq("topic", "tail", topic, "--notifications", "--idle-timeout", "3", config=path)
    assert r.returncode == 0, r.stderr.decode()
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert rows and all(row["partition"] in (0, 1) and row["offset"] >= 0 for row in rows)
    assert sum(row["notification"]["logmessage_count"] for row in rows) == 40
    assert {row["notification"]["topic"] for row in rows} == {topic}
    assert len({(row["partition"], row["offset"]) for row in rows}) == len(rows)
    one = memq("topic", "tail", topic, "--notifications", "--count", "1", config=path)
    assert one.returncode == 0 and len(one.stdout.splitlines()) == 1, one.stderr.decode()
    assert memq("topic", "tail", topic, config=path).returncode == 2    # --notifications is required
    assert load_config(path).producer.brokers
