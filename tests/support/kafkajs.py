"""kafkajs (Node's most used Kafka client) for the tests: the `kafkajs` fixture, a node_modules
holding kafkajs and fzstd (a pure-JS zstd decoder: kafkajs decodes zstd only with a codec
registered), installed with npm on first use into a cache directory; the test is skipped with the
reason when node, npm or the registry are missing. tests/conftest.py offers it to every test module."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CACHE = Path.home() / ".cache" / "memq-tests" / "npm"
PACKAGES = ("kafkajs@^2.2.4", "fzstd@^0.1.1")


@pytest.fixture(scope="module")
def kafkajs() -> Path:
    """The node_modules directory (NODE_PATH for `node`)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("kafkajs: node or npm is not installed")
    if not all((CACHE / "node_modules" / p.partition("@")[0]).is_dir() for p in PACKAGES):
        CACHE.mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(CACHE), *PACKAGES],
                                  capture_output=True, text=True, timeout=180)
        except subprocess.TimeoutExpired:
            pytest.skip("kafkajs: npm install took over 180 s (is the npm registry reachable?)")
        if done.returncode != 0:
            pytest.skip(f"kafkajs: npm install failed (is the npm registry reachable?): {done.stderr[-500:]}")
    return CACHE / "node_modules"
