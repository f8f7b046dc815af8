"""ruff finds no defect (the rules of pyproject.toml's [tool.ruff.lint]) in any package or test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_no_defects() -> None:
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "memq", "spark_source", "bench", "tests"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
