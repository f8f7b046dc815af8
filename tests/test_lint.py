"""Static checks: ruff finds no defect (pyproject.toml's [tool.ruff.lint] rules), mypy none in
memq/ and spark_source/, and memq/errors.py holds no dead error classes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_no_defects() -> None:
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "memq", "spark_source", "bench", "tests"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_finds_no_type_errors() -> None:
    """The whole package type-checks with pyproject.toml's [tool.mypy] settings alone, as a plain
    `python -m mypy memq spark_source` does for a newcomer or an editor."""
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "memq", "spark_source"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_error_class_is_used() -> None:
    """memq/errors.py holds no dead classes: each is raised, caught or subclassed elsewhere."""
    import memq.errors

    sources = "\n".join(p.read_text() for d in ("memq", "spark_source") for p in (ROOT / d).rglob("*.py")
                        if p != ROOT / "memq" / "errors.py")
    classes = [c for c in vars(memq.errors).values()
               if isinstance(c, type) and issubclass(c, Exception) and c.__module__ == "memq.errors"]
    unused = [c.__name__ for c in classes
              if not re.search(rf"\b{c.__name__}\b", sources)
              and not any(c in s.__mro__[1:] for s in classes if s is not c)]
    assert not unused, f"unused error classes in memq/errors.py: {unused}"
