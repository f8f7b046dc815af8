"""The README is the map: the two fresh-machine commands first, short, and every guide and doc
reachable from it; no relative link in README.md or docs/ points at a file that is not there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _docs() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def test_readme_starts_with_the_two_commands_and_stays_short() -> None:
    lines = README.read_text().splitlines()
    fence = lines.index("```bash")
    assert fence < 5, "the fresh-machine commands must come first"
    assert lines[fence + 1].startswith("bash scripts/dev.sh ")
    assert lines[fence + 2].startswith("bash scripts/test.sh ")
    assert lines[fence + 3] == "```"
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; topics belong in docs/guides/"


def test_every_guide_and_doc_is_linked_from_the_readme() -> None:
    linked = {(ROOT / target).resolve() for target in LINK.findall(README.read_text())}
    unlinked = [str(p.relative_to(ROOT)) for p in _docs()[1:] if p.resolve() not in linked]
    assert not unlinked, f"not reachable from README.md: {unlinked}"


def test_relative_links_resolve() -> None:
    broken = [f"{doc.relative_to(ROOT)}: {target}" for doc in _docs() for target in LINK.findall(doc.read_text())
              if "://" not in target and not (doc.parent / target).exists()]
    assert not broken, "links to missing files:\n" + "\n".join(broken)


def test_the_scripts_and_examples_the_readme_runs_exist() -> None:
    text = README.read_text()
    named = set(re.findall(r"\b((?:scripts|examples)/[\w./-]+\.(?:sh|py))", text))
    assert {"scripts/dev.sh", "scripts/test.sh", "examples/spark_read.py"} <= named
    assert all((ROOT / path).is_file() for path in named), named


def test_the_kafka_guide_lists_every_api_served_with_its_versions() -> None:
    """docs/guides/kafka-clients.md's table of APIs is the Kafka door's table (`SERVED`), row for row."""
    from memq.broker.doors.kafka import SERVED
    from memq.kafka_api.protocol import ApiKey

    text = (ROOT / "docs" / "guides" / "kafka-clients.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| (\d+) \| v(\d+)(?:-v?(\d+))? \|", text, re.M)
    listed = {int(key): (int(lo), int(hi or lo)) for _, key, lo, hi in rows}
    assert listed == dict(SERVED), "the guide's API table and the door's SERVED differ"
    names = {int(key): name for name, key, _, _ in rows}
    assert all(ApiKey(k).name.replace("_", "").lower() == names[k].lower() for k in listed), names


def test_the_schemas_guide_lists_every_registry_route() -> None:
    """docs/guides/schemas.md's API table is the registry door's table (`ROUTES`), row for row."""
    from memq.broker.doors.schema_registry import ROUTES

    text = (ROOT / "docs" / "guides" / "schemas.md").read_text()
    rows = re.findall(r"^\| (GET|POST|PUT|DELETE) \| `([^`]+)` \|", text, re.M)
    served = [(method, path.replace("{id:-?[0-9]+}", "{id}")) for method, path, *_ in ROUTES]
    assert rows == served, "the guide's API table and the door's ROUTES differ"
