"""Quix Streams for the tests: the `quix_python` fixture, the python of a virtualenv of its own
holding quixstreams (pinned here, the one place), created on first use under a cache directory.
quixstreams pins confluent-kafka below the version memq's own environment holds, so it cannot be
installed beside memq: its application runs as a process with this python, and imports no memq.
The test is skipped with the reason when the venv cannot be made (no index reachable, pip failing)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

VERSION = "3.28.1"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "memq-tests" / f"quix-{VERSION}"
PIP_TIMEOUT_S = 300


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _ready(venv: Path) -> bool:
    return (venv / ".complete").is_file() and _python(venv).is_file()


@pytest.fixture(scope="module")
def quix_python() -> Path:
    """The python of a venv with quixstreams==VERSION (and its own confluent-kafka)."""
    if _ready(CACHE):
        return _python(CACHE)
    shutil.rmtree(CACHE, ignore_errors=True)   # a half-made venv from an interrupted run
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    building = CACHE
    try:
        subprocess.run([sys.executable, "-m", "venv", str(building)], check=True, capture_output=True, timeout=120)
        done = subprocess.run([str(_python(building)), "-m", "pip", "install", "--disable-pip-version-check",
                               "-q", f"quixstreams=={VERSION}"], capture_output=True, text=True,
                              timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        shutil.rmtree(building, ignore_errors=True)
        pytest.skip(f"quixstreams: pip install took over {PIP_TIMEOUT_S} s (is the package index reachable?)")
    except subprocess.CalledProcessError as e:
        shutil.rmtree(building, ignore_errors=True)
        pytest.skip(f"quixstreams: python -m venv failed: {e.stderr!r}")
    if done.returncode != 0:
        shutil.rmtree(building, ignore_errors=True)
        pytest.skip(f"quixstreams: pip install failed (is the package index reachable?): {done.stderr[-800:]}")
    (building / ".complete").write_text(VERSION)   # a venv without it is rebuilt
    return _python(CACHE)
