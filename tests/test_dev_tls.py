"""`memq dev --tls`, run as a user runs it: the client config it writes (CA + token) carries the
CLI's produce and consume and Kafka clients over TLS with token authentication, while a client
without the token or without the CA is refused with a clear error. Then (a soak of a Spark JVM
and `memq dev`, `python -m bench soak`) the Spark guide's first snippet and
`examples/spark_read.py`, run as written from the directory where `memq dev --tls` runs, with no
credentials anywhere but the client config file it writes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.security import kafka_send, sasl

ROOT = Path(__file__).resolve().parents[1]
MEMQ = str(Path(sys.executable).with_name("memq"))

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _guide_spark_snippet() -> str:
    spark = (ROOT / "docs" / "guides" / "spark.md").read_text()
    return spark.split("```python\n", 1)[1].split("```", 1)[0]


@contextlib.contextmanager
def _memq_dev_tls(tmp_path: Path, rate: int) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """`memq dev --tls` with one broker run from `tmp_path`, with no AWS or memq settings in its
    environment: (the endpoints it printed, that environment); stopped by SIGTERM (SIGKILL after 60 s)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MEMQ_"))}
    env |= {"AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    dev = subprocess.Popen([MEMQ, "dev", "--tls", "--brokers", "1", "--duration", "240", "--rate", str(rate)],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        yield _endpoints(dev), env
    finally:
        if dev.poll() is None:
            dev.send_signal(signal.SIGTERM)
        try:
            dev.wait(60)
        finally:
            if dev.poll() is None:
                os.killpg(dev.pid, signal.SIGKILL)
                dev.wait(10)


def _endpoints(dev: subprocess.Popen[bytes]) -> dict[str, str]:
    """The `name: value` lines `memq dev` prints, up to the client config's."""
    assert dev.stdout is not None
    found: dict[str, str] = {}
    deadline = time.monotonic() + 120
    while "config" not in found:
        line = dev.stdout.readline().decode()
        assert time.monotonic() < deadline and dev.poll() is None, f"memq dev did not start: {line}"
        name, sep, value = line.partition(":")
        if sep and not line.startswith(" "):
            found[name] = value.strip()
    return found


def test_memq_dev_tls_round_trips_produce_and_consume(tmp_path: Path) -> None:
    with _memq_dev_tls(tmp_path, rate=50) as (found, env):
        config = found["config"]
        assert found["brokers"].startswith("https://127.0.0.1:")
        assert Path(config).stat().st_mode & 0o077 == 0            # it holds a token
        text = Path(config).read_text()
        assert "token = \"memq_" in text and "tls_ca_file" in text

        def memq(*args: str, stdin: str = "", **extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([MEMQ, "--config", config, *args], input=stdin, cwd=tmp_path, env=env | extra,
                                  capture_output=True, text=True, timeout=120)

        created = memq("topic", "create", "secure", "-p", "1")      # waits for the https brokers to serve it
        assert created.returncode == 0, created.stderr
        no_token = memq("produce", "secure", stdin="anonymous\n", MEMQ_PRODUCER_TOKEN="")
        assert no_token.returncode == 1 and "requires a token and none is set" in no_token.stderr
        no_ca = memq("produce", "secure", stdin="untrusting\n", MEMQ_PRODUCER_TLS_CA_FILE="")
        assert no_ca.returncode == 1 and "certificate verify failed" in no_ca.stderr
        produced = memq("produce", "secure", stdin="hello-over-tls\n")
        assert produced.returncode == 0, produced.stderr
        kafka = found["Kafka API"].split(",")[0].split()[0]      # SASL_SSL with the same token
        producer = tomllib.loads(text)["producer"]
        delivery, client = kafka_send(kafka, "secure", b"hello-over-kafka",
                                      **sasl(producer["tls_ca_file"], "dev", producer["token"]))
        assert delivery == [], client
        consumed = memq("consume", "secure", "--from-beginning", "--idle-timeout", "3")
        assert consumed.returncode == 0, consumed.stderr
        assert sorted(consumed.stdout.splitlines()) == ["hello-over-kafka", "hello-over-tls"]
        with urllib.request.urlopen(found["audit"], timeout=10) as resp:   # the dashboard still serves
            assert resp.status == 200
        with urllib.request.urlopen(found["audit"] + "api/cost", timeout=30) as resp:   # scrapes the https brokers
            cost = json.loads(resp.read())
        assert "error" not in cost and "secure" in json.dumps(cost), cost


@pytest.mark.slow
def test_the_spark_guide_and_example_read_memq_dev_tls(tmp_path: Path) -> None:
    with _memq_dev_tls(tmp_path, rate=200) as (found, env):
        config = found["config"]
        time.sleep(3)   # a few demo batches land
        # one Python process runs the guide's snippet, then the example as `python
        # examples/spark_read.py CONFIG demo` would (its `local_session` gets the snippet's session)
        assert Path(config) == tmp_path / ".memq-run" / "dev" / "memq.toml"   # the path the guide names
        example = ROOT / "examples" / "spark_read.py"
        script = (_guide_spark_snippet() + "\nprint('ROWS', df.count(), flush=True)\n"
                  f"import runpy, sys\nsys.argv = [{str(example)!r}, {config!r}, 'demo']\n"
                  f"runpy.run_path({str(example)!r}, run_name='__main__')\n")
        run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=240)
        assert run.returncode == 0, run.stderr[-3000:]
        assert int(re.search(r"ROWS (\d+)", run.stdout).group(1)) > 0  # type: ignore[union-attr]
        assert "demo message" in run.stdout, run.stdout[-3000:]
