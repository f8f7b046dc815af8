"""The broker image (deploy/Containerfile) builds here and runs: non-root, healthy, a produce ->
consume round trip through it against the dev cluster, and SIGTERM drains it to exit code 0.

Slow (a Debian base by debootstrap on the first run, ~1 min; the build, ~1 min), so it runs on
its own: `python -m pytest -m container tests/test_image.py`. No registry is reachable here, so
the base is a `debootstrap --variant=minbase bookworm` root imported into podman (kept between
runs as BASE_IMAGE), and memq's wheels are built on the host for an offline `pip install`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from memq.client.consumer import Consumer
from memq.client.producer import Producer
from memq.config import ConsumerConfig
from memq.devcluster import DevCluster
from memq.devcluster.broker_process import config_toml
from memq.devcluster.process import free_port
from tests.support.cluster import producer_config, read_notifications, read_stored, topic_config
from tests.support.cluster import drain

pytestmark = [pytest.mark.container, pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parent.parent
BASE_IMAGE = "localhost/memq-test-base:bookworm"
IMAGE = "localhost/memq:test"
#: Debian's python3 (3.11) and venv: what a slim Python image has.
BASE_PACKAGES = "python3,python3-venv,ca-certificates"
MIRROR = "http://deb.debian.org/debian"


@dataclasses.dataclass(frozen=True)
class Podman:
    """podman with what works on these machines: runc (crun refuses hybrid cgroups), no ulimit
    raising (containers.conf default_ulimits = []), host network."""

    env: dict[str, str]

    def __call__(self, *args: str, timeout: float = 600, check: bool = True,
                 stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        r = subprocess.run(["podman", "--runtime", "runc", *args], env=self.env, capture_output=True,
                           timeout=timeout, input=stdin)
        if check and r.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: {r.returncode}\n{r.stderr.decode(errors='replace')[-4000:]}")
        return r


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    missing = [tool for tool in ("podman", "runc", "debootstrap") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (Debian packages podman, runc, debootstrap)")
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    return Podman({**os.environ, "CONTAINERS_CONF": str(conf)})


@pytest.fixture(scope="module")
def image(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("image")
    if podman("image", "exists", BASE_IMAGE, check=False).returncode != 0:
        root = work / "root"
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm", str(root),
                        MIRROR], check=True, capture_output=True, timeout=900)
        tar = subprocess.run(["tar", "-C", str(root), "-c", "."], check=True, capture_output=True, timeout=300)
        podman("import", "-", BASE_IMAGE, stdin=tar.stdout)
    context = work / "context"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(context / "wheels"), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    podman("build", "--format", "docker", "--network", "host", "--build-arg", f"BASE={BASE_IMAGE}",
           "-f", str(ROOT / "deploy" / "Containerfile"), "-t", IMAGE, str(context), timeout=900)
    yield IMAGE
    podman("rmi", "-f", IMAGE, check=False)


def test_the_image_is_non_root_small_and_has_a_healthcheck(podman: Podman, image: str) -> None:
    info = json.loads(podman("image", "inspect", image).stdout)[0]
    config = info["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["memq"] and config["Cmd"] == ["broker"]
    assert "healthz" in " ".join(info["Healthcheck"]["Test"])
    base_mb = json.loads(podman("image", "inspect", BASE_IMAGE).stdout)[0]["Size"] / 1e6
    size_mb = info["Size"] / 1e6
    print(f"memq image: {size_mb:.0f} MB, of which memq and its dependencies {size_mb - base_mb:.0f} MB")
    assert size_mb - base_mb < 130
    names = podman("run", "--rm", "--network", "host", "--entrypoint", "/opt/memq/bin/python", image, "-c",
                   "import importlib.metadata as m; print(' '.join(d.metadata['Name'].lower() for d in m.distributions()))")
    assert {"pyspark", "moto", "pytest", "pyarrow"} & set(names.stdout.decode().split()) == set()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=1) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


async def test_the_container_serves_a_round_trip_and_drains_on_sigterm(
        podman: Podman, image: str, devcluster: DevCluster, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    topic, held = unique_name("img"), unique_name("imgheld")
    port = free_port()
    config = devcluster.config(topics=[topic_config(topic), topic_config(held, batch_ms=120_000)])
    config = dataclasses.replace(config, broker=dataclasses.replace(config.broker, port=port, broker_id="img1"))
    (tmp_path / "memq.toml").write_text(config_toml(config))
    tmp_path.chmod(0o755)
    (tmp_path / "memq.toml").chmod(0o644)
    name = unique_name("memq")[:60]
    podman("run", "-d", "--name", name, "--network", "host", "-v", f"{tmp_path}:/etc/memq/config:ro",
           "-e", f"MEMQ_BROKER_PORT={port}", image)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _healthy(url):
            state = json.loads(podman("inspect", name).stdout)[0]["State"]
            assert state["Running"] and time.monotonic() < deadline, podman("logs", name, check=False).stderr[-3000:]
            time.sleep(0.2)
        assert podman("healthcheck", "run", name, check=False).returncode == 0
        values = [b"img-%d" % i for i in range(2000)]
        async with Producer(producer_config(url, ack="all")) as p:
            assert sum(d.count for d in await (await p.send_many(topic, values))) == len(values)
        consumer_config = dataclasses.replace(config, consumer=ConsumerConfig(group_id=unique_name("g")))
        with Consumer(consumer_config, topic) as c:
            assert sorted(r.value for r in drain(c, len(values))) == sorted(values)
        async with Producer(producer_config(url, ack="1")) as p1:   # held by the broker: batch_ms is 2 min
            assert sum(d.count for d in await (await p1.send_many(held, [b"held-%d" % i for i in range(300)]))) == 300
        t0 = time.monotonic()
        podman("stop", "-t", "60", name, timeout=120)
        stop_s = time.monotonic() - t0
        state = json.loads(podman("inspect", name).stdout)[0]["State"]
        assert state["ExitCode"] == 0, podman("logs", name, check=False).stderr[-3000:]
        assert stop_s < 30
    finally:
        podman("rm", "-f", name, check=False)
    stored, dups, keys = await read_stored(config, held)
    assert len(stored) == 300 and dups == {}
    notes = read_notifications(devcluster.kafka_bootstrap or "", f"memq.dev.{held}")
    assert sorted(n.key for n in notes) == sorted(keys)
