"""Shared fixtures: one real dev cluster (moto S3, tansu Kafka, ZooKeeper) per test session."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator

import pytest

from memq.config import MemqConfig
from memq.devcluster import DevCluster
from tests.support import numba_cache
from tests.support.kafkajs import kafkajs  # noqa: F401  (kafkajs installed with npm, for any test module)


@pytest.fixture(scope="session")
def devcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """Started on first use, stopped at the end of the session; logs under pytest's tmp dir."""
    with DevCluster(tmp_path_factory.mktemp("devcluster")) as cluster:
        yield cluster


@pytest.fixture
def memq_config(devcluster: DevCluster) -> MemqConfig:
    return devcluster.config()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """`unique_name("orders")` -> "orders-<test name>-<random>": topics, groups, buckets."""
    test = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]

    def make(prefix: str = "t") -> str:
        return f"{prefix}-{test}-{uuid.uuid4().hex[:8]}"

    return make


def pytest_configure(config: pytest.Config) -> None:
    # Also marked slow, so the default suite leaves it out; run with `-m container`.
    config.addinivalue_line("markers", "container: builds and runs the OCI image (podman), see tests/test_image.py")
    if not hasattr(config, "workerinput"):   # once, in the process that starts the others
        numba_cache.warm()
